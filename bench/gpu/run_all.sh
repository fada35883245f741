#!/usr/bin/env bash
# Everything of tallow that needs the GPU, in one go: install, GPU tests, benchmarks.
# Usage (on the GPU machine, from the project root): bash bench/gpu/run_all.sh OUTDIR ITEMS
# ITEMS: comma-separated among gputestsmodels, gputestskernels, gputestscases (every GPU test in three parts, one call each;
# see below), gputestslist (the test ids listed in the file $GPU_TESTS_LIST),
# distcheck (tests/test_dist.py on this machine's torch, in the background; needs the wheels of every dependency in .whl),
# tests,enginetests,fusedtests,attntests,gemv,profile,thrprof,latency,latencysync,latencynopdl,ttft,hf,
# qwen3,thr8b,thrprof8b,thrprof8bfp8,ttftprof,overlap,fp8probe,ncudecode,ncusource,fp8tests,thr8bfp8,thr8bfp8prev,thr8bfp8t128,thr8bfp8t128s3,thr8bfp8w4,thr8bfp8s2,thr8bfp8tok16k,thr8bfp8big,
# kvtestsquick,kvtests,kvkernelcases,turboprobe,turboprobe32k,thr8bturbo4,long32kbf16,long32kfp8,long32kturbo4,long32kturbo3,
# quanttune,quanttunelarge,quanttests,q4klat,q8lat,q4kthr,q4kttft,quantmicro,gemmatests,gemma4b,embed,embedtests,
# fp8wtests,fp8wlat,fp8wlatvocab,fp8wthr,fp8wttft,fp8wmicro,int4tests,int4lat,int4thr,int4thrfp8,int4micro,fp4tests,mxfp4lat,fp4micro,
# tctests,tcmicro,tcsweep,tcint4lat,tcint4thr,tcq4klat,tcq4kthr,tcq8lat,tcfp8lat,tcmxfp4lat (the packed-weight tensor-core GEMM:
# its GPU tests; per llama-3-8b shape against bf16; its tile sweep, writing OUT/packed_gemm_tuned.json; the runs of
# int4lat,int4thr,q4klat,q4kthr,q8lat,fp8wlat,mxfp4lat with each plugin's opt-in tensor-core setting, to A/B in the same call),
# sotests,sothr,sothrllg,fitests,fi8blat,tri8blat,fi8bttft,tri8bttft,fiq3thr,triq3thr,fi8bthr,tri8bthr,
# mlatests,dsv2lat,dsv2thr,glm47fp8lat (latent attention: the MLA kernels against the reference, DeepSeek's, GLM-4.5's,
# GLM-4.7-Flash's and MiniMax M2's GPU parity tests; random:deepseek-v2-lite batch-1 decode and 1000 x 1000 throughput;
# random:glm-4.7-flash batch-1 decode quantized at load to fp8),
# moealltests,gptosslat,moetests,moelat,moethr,moesweep1 (mixture of experts: kernels, layer and Qwen-MoE GPU tests; random:qwen3-30b-a3b batch-1 decode and
# 1000 x 1000 throughput; the fused-MoE tile sweep at one token), moeq4ktests,moeq4klat (GGUF experts: their GPU tests; the same
# model's batch-1 decode with --isq q4_k experts),
# qnexttests,qnextlat,qnextprefill (Qwen3-Next, Gated DeltaNet: the kernels against their references and the model's GPU
# tests; batch-1 decode of random:qwen3-next-12l against its attention-only twin random:qwen3-next-12l-attn; one 32k prompt's
# prefill, tokens/s = 32768 / ttft_s, of both), q35lat (batch-1 decode of random:qwen3.5-35b-a3b, 69 GB: an H200),
# qnext80fp8lat (batch-1 decode of the whole random:qwen3-next-80b-a3b quantized at load to fp8, about 81 GB: an H200),
# qnextlong64 (64 sequences decoding after 32k-token prompts, random:qwen3-next-12l and its attention-only twin; the twin's
# 2M cached tokens take 50 GB: an H200),
# famtests (Gemma 4 parity and its engine on Triton with KV-shared layers, Llama 4 on the Triton chunk mask, the chunked
# and KV-sharing attention kernel cases, Qwen3-Next/Qwen3.5 GGUF and block-fp8 checkpoints, gelu_tanh experts),
# spectests,specverify (speculative decoding: GPU tests with CUDA graphs; verify-step cost vs k and batch on random:llama-3-8b),
# vlmtests,vlmimages (images in: Qwen2.5-VL's GPU tests; random:qwen2.5-vl-7b, 64 requests of one 1024x1024 image, images/s and TTFT
# with the encoder cache cold and warm),
# tptests,tp2lat,tp2thr,tp2lat70b,tp2thr70b,tp2allreduce (tensor parallelism: need 2 GPUs, the nvidia-h200-x2 kind), or full: the runs behind the
# targets in docs/performance.md (tests,latency,ttft,hf,qwen3,thr8b); the others are profiles, probes, A/B, fp8,
# KV-codec and quantized-weight (tallow-quant-gguf, -fp8, -int4, -fp4, --isq) runs.
# Writes OUTDIR/tests.log, OUTDIR/<bench>.json and prints a summary table last.
set -uo pipefail
OUT=${1:-/tmp/tallow-gpu}
MODE=${2:-full}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ]; then  # once per machine (a later call on the same machine finds them)
  [ -f /tmp/site/.tallow-wheels ] || { python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site .whl/*.whl && touch /tmp/site/.tallow-wheels; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# FlashInfer modules compiled ahead of time (bench/gpu/flashinfer_probe.py's tarball, copied into
# .whl by bench/gpu/flashinfer_wheels.sh): unpacked into the installed package, where flashinfer
# loads them instead of compiling them
for aot in .whl/flashinfer-aot-*.tar.gz; do
  [ -f "$aot" ] || continue
  fi_dir=$(python3 -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('flashinfer').origin))") \
    && tar xzf "$aot" -C "$fi_dir" && echo "flashinfer: modules of $aot installed in $fi_dir/data/aot"
done
# One editable install per machine (a later call on the same machine finds the marker).
if [ ! -f /tmp/tallow-installed ] || [ "$(cat /tmp/tallow-installed)" != "$PWD" ]; then
  pip_args=(-q --no-deps --no-build-isolation -e .)
  for d in plugins/*/*/; do pip_args+=(-e "$d"); done
  python3 -m pip install "${pip_args[@]}" >/tmp/tallow-install.log 2>&1 || { tail -20 /tmp/tallow-install.log; exit 1; }
  echo "$PWD" > /tmp/tallow-installed
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
# A snapshot without .git (git archive) names its commit in COMMIT.
{ cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null; } | tee -a "$OUT/gpu.txt"

run_bench() {  # name, timeout, command..., then the bench arguments
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" --output "$OUT/$name.json" 2>"$OUT/$name.err" | tail -25
  if [ -s "$OUT/$name.json" ]; then rm -f "$OUT/$name.err"  # at most 8 files come back
  else echo "!! $name failed"; tail -15 "$OUT/$name.err"; fi
}
bench() {  # name, timeout, args...
  echo "== bench $1: tallow bench ${*:3}"
  run_bench "$1" "$2" tallow bench "${@:3}"
}
benchwith() {  # name, timeout, decode-spec overrides for 8-bit caches (JSON), args...
  echo "== bench $1: tallow bench ${*:4} (8-bit cache decode launches with $3)"
  run_bench "$1" "$2" python3 bench/gpu/with_decode_tiles.py "$3" bench "${@:4}"
}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

want() { [[ ",$MODE," == *",$1,"* || "$MODE" == full ]]; }
if want tests; then
  echo "== GPU tests"
  timeout 420 python3 -m pytest -q -m gpu -rs --timeout 300 tests/gpu tests/kernels plugins/attention plugins/model 2>&1 | tail -40 | tee "$OUT/tests.log"
fi
if want enginetests; then
  echo "== GPU engine tests"
  timeout 300 python3 -m pytest -q -m gpu -rs --timeout 240 tests/gpu tests/engine plugins/model \
    "tests/kernels/test_kernels.py::test_argmax_rows" "tests/kernels/test_kernels.py::test_gemv" \
    plugins/attention/triton/tests/test_attention_gpu.py::test_new_batch_shapes_compile_nothing_new \
    2>&1 | tail -30 | tee "$OUT/tests_engine.log"
fi
if [[ ",$MODE," == *",distcheck,"* ]]; then  # CPU work, started in the background beside the items after it
  echo "== the built wheels on this machine's torch: tests/test_dist.py (log in OUT/tests_dist.log)"
  # its fresh environment sees the system site-packages only (no PYTHONPATH): the carried wheels go there
  python3 -m pip install -q --no-index --no-deps --no-compile --break-system-packages .whl/*.whl 2>&1 | grep -v "^WARNING" | tail -5
  timeout "${DIST_LIMIT:-540}" python3 -m pytest -q -m slow -rfE --tb=short tests/test_dist.py \
    >"$OUT/tests_dist.log" 2>&1 &
fi
# Every GPU test on one card, in three parts that fit one call each: gputestsmodels (the
# gpu-marked tests of the engine, the models and the speculators, 4 workers, then those marked
# gpu_alone, real-size models that need most of the card, one at a time), gputestskernels (the
# gpu-marked kernel and quantization tests, 4 workers) and gputestscases (the kernel-case modules
# run natively). A quantization plugin's folder and a folder of cases get a pytest of their own,
# since the folders' helper modules share names such as kernel_cases. gputestslist runs the test ids
# listed in the file $GPU_TESTS_LIST the same way (a rerun of what failed). Each failure's traceback is written to OUT/failures.txt as it happens.
gpu_pytest() {  # log, workers, pytest args...
  local log=$1 workers=$2; shift 2
  # engines of parallel workers share the card: each takes a small KV budget, and every test
  # gives back the memory it cached (pytest_gpu_memory)
  PYTHONPATH="$PWD/bench/gpu${PYTHONPATH:+:$PYTHONPATH}" TALLOW_FAILURES_LOG="$OUT/failures.txt" \
    TALLOW_CACHE__KV_FRACTION=${GPU_TESTS_KV_FRACTION:-0.12} timeout "${GPU_TESTS_LIMIT:-480}" \
    python3 -m pytest -p pytest_failures_now -p pytest_gpu_memory -n "$workers" --dist loadfile \
    -v -rfE --tb=short --timeout 240 --continue-on-collection-errors "$@" >>"$OUT/$log.log" 2>&1
}
gpu_alone_pytest() {  # log, pytest args...: one test at a time with the card's whole memory
  local log=$1; shift
  GPU_TESTS_KV_FRACTION=${GPU_ALONE_KV_FRACTION:-0.5} gpu_pytest "$log" 0 "$@"
}
gpu_summary() {  # logs...
  for log in "$@"; do
    echo "-- $log"; grep -E "(FAILED|ERROR) |[0-9]+ (passed|failed)|Timeout" "$OUT/$log.log" \
      | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | tail -40
  done
}
if [[ ",$MODE," == *",gputestsmodels,"* ]]; then
  echo "== GPU tests of the engine, the models and the speculators (4 workers, then the gpu_alone ones)"
  paths=(tests/gpu tests/engine tests/layers plugins/model plugins/speculator)
  gpu_pytest tests_gpu_models 4 -m "gpu and not gpu_alone" "${paths[@]}"
  gpu_alone_pytest tests_gpu_models -m "gpu and gpu_alone" "${paths[@]}"
  gpu_summary tests_gpu_models
fi
if [[ ",$MODE," == *",gputestslist,"* ]]; then
  echo "== the GPU tests listed in ${GPU_TESTS_LIST:?set GPU_TESTS_LIST to a file of test ids}"
  mapfile -t ids < <(grep -vE '^\s*(#|$)' "$GPU_TESTS_LIST")
  gpu_pytest tests_gpu_list "${GPU_LIST_WORKERS:-3}" -m "not gpu_alone" "${ids[@]}"
  gpu_alone_pytest tests_gpu_list -m "gpu_alone" "${ids[@]}"
  gpu_summary tests_gpu_list
fi
gpu_cases() {  # the kernel-case modules, natively, one pytest per folder
  # the Qwen3-Next cases are the interpreter's (tests/test_interpreted.py runs them with TRITON_INTERPRET=1)
  for dir in plugins/attention/triton/tests plugins/model/gemma/tests plugins/quant/*/tests; do
    cases=("$dir"/*_cases.py)
    [ -e "${cases[0]}" ] && gpu_pytest tests_gpu_cases 3 "${cases[@]}"
  done
}
if [[ ",$MODE," == *",gputestskernels,"* ]]; then
  echo "== GPU tests of the kernels (gpu-marked, 4 workers; a quantization plugin's folder on its own)"
  gpu_pytest tests_gpu_kernels 4 -m gpu tests/kernels plugins/attention/triton
  for dir in plugins/quant/*/tests; do gpu_pytest tests_gpu_kernels 4 -m gpu "$dir"; done
  gpu_summary tests_gpu_kernels
fi
if [[ ",$MODE," == *",gputestscases,"* ]]; then
  echo "== the kernel cases run natively (one folder at a time)"
  gpu_cases
  gpu_summary tests_gpu_cases
fi
if [[ ",$MODE," == *",fusedtests,"* ]]; then
  echo "== GPU tests of PDL and the fused kernels"
  timeout 480 python3 -m pytest -q -m gpu -rs --timeout 240 tests/kernels/test_pdl.py \
    plugins/attention/triton/tests/test_pdl_gpu.py tests/kernels/test_kernels.py \
    plugins/attention/triton/tests/test_attention_gpu.py 2>&1 | tail -25 | tee "$OUT/tests_fused.log"
fi
if [[ ",$MODE," == *",attntests,"* ]]; then
  echo "== GPU tests of the attention kernels"
  timeout 300 python3 -m pytest -q -m gpu -rs --timeout 240 plugins/attention/triton/tests/test_pdl_gpu.py \
    plugins/attention/triton/tests/test_attention_gpu.py 2>&1 | tail -15 | tee "$OUT/tests_attention.log"
fi
if [[ ",$MODE," == *",gemv,"* ]]; then
  echo "== GEMV sweep"
  timeout 240 python3 bench/gpu/profile_decode.py gemv 2>&1 | tee "$OUT/gemv.log" | tail -40
fi
if [[ ",$MODE," == *",profile,"* ]]; then
  echo "== decode step profiles"
  for extra in "" "--eager" "--gemv-rows 0" "--model random:qwen3-0.6b --batch 256 --input-len 300"; do
    timeout 150 python3 bench/gpu/profile_decode.py step $extra 2>&1 | grep -v Warning | tail -34
  done | tee "$OUT/profile.log"
fi
if [[ ",$MODE," == *",gemmatests,"* ]]; then
  echo "== GPU tests of tallow-model-gemma (tiny parity; Gemma 3 4B shape on triton vs transformers and torch)"
  timeout 480 python3 -m pytest -q -m gpu -rs --timeout 420 plugins/model/gemma/tests 2>&1 | tail -25 | tee "$OUT/tests_gemma.log"
fi
if [[ ",$MODE," == *",gemma4b,"* ]]; then  # batch-1 decode of Gemma 3 4B's shape; 2048-token prompts outrun its 1024-token window
  bench latency_gemma3_4b_bs1 300 latency --model random:gemma-3-4b --dtype bfloat16 --batch-size 1 --input-len 2048 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",moetests,"* ]]; then
  echo "== GPU tests of the fused MoE (kernels against their references, the layer in CUDA graphs, Qwen-MoE parity)"
  timeout 300 python3 -m pytest -q -m gpu -rs --timeout 240 tests/kernels/test_moe_kernels.py \
    tests/gpu/test_fused_moe_gpu.py plugins/model/qwen_moe 2>&1 | tail -20 | tee "$OUT/tests_moe.log"
fi
if [[ ",$MODE," == *",moelat,"* ]]; then
  bench latency_qwen3_30b_a3b_bs1 240 latency --model random:qwen3-30b-a3b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",moethr,"* ]]; then
  bench throughput_qwen3_30b_a3b 420 throughput --model random:qwen3-30b-a3b --dtype bfloat16 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
if [[ ",$MODE," == *",moeq4ktests,"* ]]; then  # tallow-quant-gguf's quantized experts
  echo "== GPU tests of GGUF experts (decode kernels, workspace path, CUDA graphs, isq engine)"
  timeout 400 python3 -m pytest -q -rs --timeout 360 plugins/quant/gguf/tests/moe_cases.py \
    plugins/quant/gguf/tests/test_moe_gpu.py 2>&1 | tail -20 | tee "$OUT/tests_moe_q4k.log"
fi
if [[ ",$MODE," == *",moeq4klat,"* ]]; then
  bench latency_qwen3_30b_a3b_q4k_bs1 300 latency --model random:qwen3-30b-a3b --dtype bfloat16 --isq q4_k --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",moealltests,"* ]]; then  # every GPU test of the MoE models, kernels and expert formats, 4 workers
  echo "== GPU tests of everything mixture-of-experts (core kernels and layer, the models, fp8/int4/fp4/GGUF experts, sinks)"
  timeout "${MOE_TESTS_LIMIT:-300}" python3 -m pytest -n 4 -v -rfE --tb=short --timeout 200 \
    tests/kernels/test_moe_kernels.py tests/gpu/test_fused_moe_gpu.py tests/engine/test_async_scheduling_gpu.py \
    plugins/model/qwen_moe/tests/test_parity.py plugins/model/mixtral/tests/test_parity.py \
    plugins/model/gpt_oss/tests/test_engine_gpu.py plugins/quant/fp8/tests/moe_kernel_cases.py \
    plugins/quant/int4/tests/moe_kernel_cases.py plugins/quant/gguf/tests/moe_cases.py \
    plugins/quant/gguf/tests/test_moe_gpu.py plugins/quant/fp4/tests/test_kernels_gpu.py \
    "plugins/attention/triton/tests/kernel_cases.py::test_attention_sinks" >"$OUT/tests_moe_all.log" 2>&1
  grep -E "FAILED|ERROR| passed| failed" "$OUT/tests_moe_all.log" | tail -40
fi
if [[ ",$MODE," == *",qnexttests,"* ]]; then  # Gated DeltaNet kernels against their references; Qwen3-Next parity, graphs vs eager
  echo "== GPU tests of Qwen3-Next (gated delta rule and conv kernels, float32 parity, CUDA graphs against eager)"
  timeout 500 python3 -m pytest -q -m gpu -rs --timeout 420 tests/kernels/test_gated_delta_kernels.py \
    plugins/model/qwen3_next 2>&1 | tail -25 | tee "$OUT/tests_qwen3_next.log"
fi
if [[ ",$MODE," == *",qnextlat,"* ]]; then  # 12 of Qwen3-Next-80B-A3B's 48 layers (9 linear, 3 full), and all full attention
  bench latency_qwen3_next_12l_bs1 300 latency --model random:qwen3-next-12l --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
  bench latency_qwen3_next_12l_attn_bs1 300 latency --model random:qwen3-next-12l-attn --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",q35lat,"* ]]; then  # Qwen3.5-35B-A3B's text model in bf16
  bench latency_qwen3_5_35b_a3b_bs1 300 latency --model random:qwen3.5-35b-a3b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",qnext80fp8lat,"* ]]; then  # all 48 layers; weights in fp8 (tallow-quant-fp8, --isq fp8)
  bench latency_qwen3_next_80b_a3b_fp8_bs1 480 latency --model random:qwen3-next-80b-a3b --dtype bfloat16 --isq fp8 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",qnextlong64,"* ]]; then  # decode steps at 32k context (prompts computed: prefix caching, hence --synthetic-context, is refused for the hybrid)
  bench long64x32k_qwen3_next_12l 590 latency --model random:qwen3-next-12l --dtype bfloat16 --batch-size 64 --input-len 32768 --output-len 64 --max-model-len 33792 --max-num-seqs 64 --max-cuda-graph-batch 64 --warmup-input-len 512
  bench long64x32k_qwen3_next_12l_attn 590 latency --model random:qwen3-next-12l-attn --dtype bfloat16 --batch-size 64 --input-len 32768 --output-len 64 --max-model-len 33792 --max-num-seqs 64 --max-cuda-graph-batch 64 --warmup-input-len 512
fi
if [[ ",$MODE," == *",qnextprefill,"* ]]; then  # one 32k prompt (chunks of the default 8192-token step budget)
  bench prefill32k_qwen3_next_12l 300 latency --model random:qwen3-next-12l --dtype bfloat16 --batch-size 1 --input-len 32768 --output-len 4 --max-model-len 33792
  bench prefill32k_qwen3_next_12l_attn 300 latency --model random:qwen3-next-12l-attn --dtype bfloat16 --batch-size 1 --input-len 32768 --output-len 4 --max-model-len 33792
fi
if [[ ",$MODE," == *",gptosslat,"* ]]; then  # gpt-oss-20b's shape, float experts, triton attention (sinks)
  bench latency_gpt_oss_20b_bs1 240 latency --model random:gpt-oss-20b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",mlatests,"* ]]; then  # latent attention (MLA): Triton kernels and the DeepSeek models on the GPU
  echo "== GPU tests of latent attention (MLA kernels against the torch reference, DeepSeek parity and CUDA graphs)"
  timeout 400 python3 -m pytest -q -rfE --tb=short --timeout 300 plugins/attention/triton/tests/mla_cases.py \
    plugins/model/deepseek/tests/test_parity.py plugins/model/deepseek/tests/test_fp8.py \
    plugins/model/glm4_moe/tests/test_parity.py plugins/attention/triton/tests/test_conformance.py \
    plugins/model/deepseek/tests/test_glm4_moe_lite.py plugins/model/minimax_m2/tests/test_parity.py \
    2>&1 | tail -20 | tee "$OUT/tests_mla.log"
fi
if [[ ",$MODE," == *",famtests,"* ]]; then  # the families' GPU tests: Gemma 4, Llama 4 (Triton chunks), hybrid checkpoints
  echo "== GPU tests of Gemma 4, Llama 4 on Triton, chunked and KV-sharing kernels, Qwen3-Next GGUF/fp8 checkpoints"
  timeout 580 python3 -m pytest -q -rfE --tb=short --timeout 300 -m gpu \
    plugins/model/gemma/tests/test_gemma4_parity.py plugins/model/gemma/tests/test_engine_gpu_gemma4.py \
    plugins/model/llama4/tests plugins/model/qwen3_next/tests/test_checkpoints_gpu.py \
    plugins/model/qwen3_next/tests/test_engine_gpu.py tests/kernels/test_moe_kernels.py \
    2>&1 | tail -20 | tee "$OUT/tests_families.log"
  timeout 300 python3 -m pytest -q -rfE --tb=short plugins/attention/triton/tests/kv_sharing_cases.py \
    plugins/attention/triton/tests/kernel_cases.py -k "chunk or sharing" 2>&1 | tail -8 | tee -a "$OUT/tests_families.log"
fi
if [[ ",$MODE," == *",dsv2lat,"* ]]; then  # DeepSeek-V2-Lite's shape: latent attention (triton decode), 64 experts of which 6 per token
  bench latency_deepseek_v2_lite_bs1 300 latency --model random:deepseek-v2-lite --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",glm47fp8lat,"* ]]; then  # GLM-4.7-Flash's shape (30B, latent attention, 64 experts of which 4 per token), weights in fp8
  bench latency_glm_4_7_flash_fp8_bs1 360 latency --model random:glm-4.7-flash --dtype bfloat16 --isq fp8 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",dsv2thr,"* ]]; then
  bench throughput_deepseek_v2_lite 480 throughput --model random:deepseek-v2-lite --dtype bfloat16 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 256 --max-cuda-graph-batch 256
fi
if [[ ",$MODE," == *",moesweep1,"* ]]; then  # the GEMV path's tiles at one token (the batch-1 decode's), into OUT
  echo "== fused-MoE tiles at one token"
  timeout 180 python3 bench/gpu/moe_sweep.py --shapes qwen3-30b-a3b,mixtral-8x7b,gpt-oss-20b --tokens 1 \
    --output "$OUT/moe_configs.json" 2>&1 | grep -v Warning | tail -8
fi
want latency && bench latency_8b_bs1 240 latency --model random:llama-3-8b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
if [[ ",$MODE," == *",latencysync,"* ]]; then
  bench latency_8b_bs1_sync 240 latency --model random:llama-3-8b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096 --no-async-scheduling
fi
if [[ ",$MODE," == *",latencynopdl,"* ]]; then
  TALLOW_PDL=0 bench latency_8b_bs1_nopdl 240 latency --model random:llama-3-8b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
want ttft && bench ttft_8b_4096 180 latency --model random:llama-3-8b --dtype bfloat16 --batch-size 1 --input-len 4096 --output-len 4 --max-model-len 8192
want hf && bench compare_hf_8b 300 latency --model random:llama-3-8b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 128 --max-model-len 4096 --compare hf
want qwen3 && bench throughput_qwen3_0.6b 300 throughput --model random:qwen3-0.6b --dtype bfloat16 --num-prompts 256 --min-input-len 100 --max-input-len 1024 --min-output-len 100 --max-output-len 1024 --max-model-len 4096
want thr8b && bench throughput_8b 330 throughput --model random:llama-3-8b --dtype bfloat16 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
if [[ ",$MODE," == *",thrprof,"* ]]; then
  echo "== throughput workload, step kinds"
  timeout 200 python3 bench/gpu/profile_decode.py throughput --model random:qwen3-0.6b --batch 256 \
    2>&1 | grep -v Warning | tail -60 | tee "$OUT/thrprof.log" | tail -45
fi
if [[ ",$MODE," == *",thrprof8b,"* ]]; then
  echo "== llama-3-8b throughput workload (1000 x 1000/1000): step kinds, kernels of chosen steps"
  timeout 420 python3 bench/gpu/profile_decode.py throughput --model random:llama-3-8b \
    --batch 1000 --fixed-len 1000 --kernel-steps 4,5,300,301,302,2600,2601,2602 -- \
    --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512 \
    2>&1 | grep -v Warning | tail -120 | tee "$OUT/thrprof8b.log" | tail -100
fi
if [[ ",$MODE," == *",thrprof8bfp8,"* ]]; then
  echo "== llama-3-8b throughput workload with an fp8 KV cache: step kinds, kernels of chosen steps"
  timeout 420 python3 bench/gpu/profile_decode.py throughput --model random:llama-3-8b \
    --batch 1000 --fixed-len 1000 --kernel-steps 10,11,12,13,14,15,16,300,301,302,1500,1501,1502 -- \
    --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512 --kv-codec fp8 \
    2>&1 | grep -v Warning | tee "$OUT/thrprof8bfp8.log" | grep -E "^==|^kernels|^device|^kind|^with|^decode|^host-device" 
fi
if [[ ",$MODE," == *",ttftprof,"* ]]; then
  echo "== steps up to the first token, PDL on and off"
  for pdl in 1 0; do
    TALLOW_PDL=$pdl timeout 150 python3 bench/gpu/profile_decode.py ttft --model random:llama-3-8b \
      2>&1 | grep -v Warning | tail -26
  done | tee "$OUT/ttftprof.log"
fi
if [[ ",$MODE," == *",overlap,"* ]]; then
  echo "== llama-3-8b decode step: attention of one half batch beside the GEMMs of the other"
  timeout 240 python3 bench/gpu/overlap_probe.py 2>&1 | grep -v Warning | tail -25 | tee "$OUT/overlap.log"
fi
if [[ ",$MODE," == *",fp8probe,"* ]]; then
  echo "== llama-3-8b attention over a bf16 and an fp8 cache"
  timeout 360 python3 bench/gpu/kv_fp8_probe.py 2>&1 | grep -v Warning | tail -20 | tee "$OUT/fp8probe.log"
fi
if [[ ",$MODE," == *",ncudecode,"* ]]; then  # hardware counters of one decode launch per variant
  for variant in bf16 fp8 fp8-4w; do
    echo "== ncu: decode attention, $variant"
    timeout 200 "$NCU" --clock-control none -k regex:decode_split --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis_Tables --section InstructionStats \
      python3 bench/gpu/ncu_decode.py $variant 2>&1 | grep -v "^==PROF==" | tee "$OUT/ncu_$variant.txt" | grep -E "Duration|DRAM Throughput|Achieved Occupancy|Issued Ipc|No Eligible|Registers Per|Warp Cycles Per Issued|Bank" | head -12
  done
fi
if [[ ",$MODE," == *",ncusource,"* ]]; then  # which instructions of the fp8 decode conflict in shared memory
  echo "== ncu: decode attention over an fp8 cache, per-instruction counters"
  timeout 240 "$NCU" --clock-control none -k regex:decode_split --launch-skip 1 --launch-count 1 \
    --section SourceCounters --page source --print-source sass --csv \
    python3 bench/gpu/ncu_decode.py fp8 2>&1 | grep -v "^==PROF==" > "$OUT/ncu_source_fp8.csv"
  head -c 600 "$OUT/ncu_source_fp8.csv"; echo; wc -l "$OUT/ncu_source_fp8.csv"
fi
if [[ ",$MODE," == *",fp8tests,"* ]]; then
  echo "== GPU tests of the fp8 KV cache"
  timeout 300 python3 -m pytest -q -m gpu -rs --timeout 240 tests/gpu/test_gpu_engine.py \
    tests/kernels/test_kernels.py plugins/attention/triton/tests/test_attention_gpu.py \
    plugins/attention/triton/tests/kernel_cases.py -k "fp8 or store" 2>&1 | tail -25 | tee "$OUT/tests_fp8.log"
fi
THR8B=(throughput --model random:llama-3-8b --dtype bfloat16 --kv-codec fp8 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512)
if [[ ",$MODE," == *",thr8bfp8,"* ]]; then
  bench throughput_8b_fp8 330 "${THR8B[@]}"
fi
if [[ ",$MODE," == *",thr8bfp8t128,"* ]]; then  # A/B: 4-warp programs, 128-key tiles, 2 stages
  benchwith throughput_8b_fp8_t128 330 '{"TILE_N": 128, "num_warps": 4, "num_stages": 2}' "${THR8B[@]}"
fi
if [[ ",$MODE," == *",thr8bfp8t128s3,"* ]]; then  # A/B: 4-warp programs, 128-key tiles, 3 stages (the probe's fastest)
  benchwith throughput_8b_fp8_t128s3 330 '{"TILE_N": 128, "num_warps": 4, "num_stages": 3}' "${THR8B[@]}"
fi
if [[ ",$MODE," == *",thr8bfp8prev,"* ]]; then  # A/B: V widened by a select and the accumulator rescaled every tile (before 3cb105a)
  benchwith throughput_8b_fp8_prev 330 '{"WIDEN_V_IN_PTX": false, "LAZY_RESCALE": false}' "${THR8B[@]}"
fi
if [[ ",$MODE," == *",thr8bfp8w4,"* ]]; then  # A/B: the 4-warp 64-key tiles (the earlier default)
  benchwith throughput_8b_fp8_w4 330 '{"TILE_N": 64, "num_warps": 4, "num_stages": 3}' "${THR8B[@]}"
fi
if [[ ",$MODE," == *",thr8bfp8s2,"* ]]; then  # A/B: one-warp programs with 2 pipeline stages
  benchwith throughput_8b_fp8_s2 330 '{"num_stages": 2}' "${THR8B[@]}"
fi
if [[ ",$MODE," == *",thr8bfp8tok16k,"* ]]; then  # A/B: prompt steps of up to 16,384 tokens (half as many steps)
  bench throughput_8b_fp8_tok16k 330 "${THR8B[@]}" --max-num-batched-tokens 16384
fi
if [[ ",$MODE," == *",thr8bfp8big,"* ]]; then  # fp8 KV holds all 1000 sequences at once
  bench throughput_8b_fp8_1024 330 throughput --model random:llama-3-8b --dtype bfloat16 --kv-codec fp8 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 1024 --max-cuda-graph-batch 1024
fi
# The KV codecs' GPU tests, file by file, each file's failures with short tracebacks as soon
# as that file ends (the whole log in OUT/tests_kv*.log): kvtestsquick ~4 min, one test per
# fused path at real sizes and the tests that failed at 57cb60d; kvtests ~9 min, all of them.
kvtest() {  # log, timeout, pytest args...
  timeout "$2" python3 -m pytest -q -m gpu -rfE --tb=short --timeout 240 "${@:3}" 2>&1 \
    | grep -v Warning | tee -a "$OUT/$1" | grep -v "^[.sFEx]*\s*\[ *[0-9]*%\]$"
}
if [[ ",$MODE," == *",kvtestsquick,"* ]]; then
  echo "== GPU tests of the KV codecs (short selection)"
  G=plugins/attention/triton/tests/test_attention_gpu.py
  kvtest tests_kv_quick.log 150 "tests/gpu/test_gpu_engine.py::test_turbo_kv_cache_against_the_torch_backend_and_eager[turbo4]" \
    tests/gpu/test_gpu_engine.py::test_turbo_kv_cache_prefix_hits_and_preemption_keep_the_tokens
  kvtest tests_kv_quick.log 150 $G -k "turbo_cache_long_contexts and 1-torch.float16 \
    or head_scales_long_contexts and True-1- or turbo_sliding_window_and_softcap \
    or cuda_graph_capture_and_replay or store_codes_match or fp8_store_rounds \
    or turbo_every_head_dim_and_group and (1-80-3 or 8-256-4 or 8-96-8)"
fi
if [[ ",$MODE," == *",kvtests,"* ]]; then
  echo "== GPU tests of the KV codecs"
  kvtest tests_kv.log 240 tests/gpu/test_gpu_engine.py tests/engine/test_kv_fp8_settings.py \
    -k "turbo or fp8 or graph or scales"
  kvtest tests_kv.log 330 plugins/attention/triton/tests/test_attention_gpu.py \
    plugins/attention/triton/tests/test_pdl_gpu.py -k "turbo or fp8 or graph or compiles or scales"
fi
if [[ ",$MODE," == *",turboprobe,"* ]]; then  # ~2 min: where a decode step's attention time goes per cache
  echo "== decode attention per cache: the step, the store, the kernels, the rotations"
  timeout 420 python3 bench/gpu/kv_turbo_probe.py --batch 512 2>&1 | grep -v Warning | tee "$OUT/turboprobe.log"
fi
if [[ ",$MODE," == *",turboprobe32k,"* ]]; then  # ~3 min: the same decode rows for 64 sequences of 32k tokens
  echo "== decode attention per cache, 64 x 32k"
  timeout 420 python3 bench/gpu/kv_turbo_probe.py --batch 64 --context 32768:32768 --no-prefill \
    --codecs bf16,fp8,turbo4,turbo4/split,turbo4@64x4x2,turbo3 2>&1 | grep -v Warning | tee "$OUT/turboprobe32k.log"
fi
if [[ ",$MODE," == *",kvkernelcases,"* ]]; then  # ~4 min: the interpreter's kernel cases and the kit's conformance cases (every codec) on the GPU
  echo "== kernel and conformance cases on the GPU"
  timeout 400 python3 -m pytest -q -rfE --tb=short --timeout 240 plugins/attention/triton/tests/kernel_cases.py \
    plugins/attention/triton/tests/conformance_cases.py 2>&1 | grep -v Warning | tee "$OUT/tests_kernel_cases.log" | tail -40
fi
if [[ ",$MODE," == *",thr8bturbo4,"* ]]; then  # the fp8 run's workload with a turbo4 cache (run beside thr8bfp8)
  bench throughput_8b_turbo4 330 throughput --model random:llama-3-8b --dtype bfloat16 --kv-codec turbo4 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
# Long contexts: 64 sequences of 32,768 prompt tokens, 128 generated each. The prompts' KV
# blocks are registered in the prefix cache uncomputed (--synthetic-context: decode work does
# not depend on the cached values, and a random model's are meaningless anyway), for as many
# sequences as the cache holds with their outputs; those compute their last block and decode
# together. Reports the decode rate, the sequences timed and that the cache holds (per codec).
# llama-3.1-8b: llama-3-8b's shapes with rotary scaling to 128k positions (llama-3-8b stops at 8k).
LONG32K=(latency --model random:llama-3.1-8b --dtype bfloat16 --batch-size 64 --input-len 32768 --output-len 128 --max-model-len 32896 --max-num-seqs 64 --max-cuda-graph-batch 64 --warmup-input-len 512 --synthetic-context)
for codec in bf16 fp8 turbo4 turbo3; do
  if [[ ",$MODE," == *",long32k$codec,"* ]]; then
    bench long32k_$codec 560 "${LONG32K[@]}" --kv-codec "$([ $codec = bf16 ] && echo auto || echo $codec)"
  fi
done
if [[ ",$MODE," == *",quanttests,"* ]]; then  # ~2.5 min at most
  echo "== GPU tests of tallow-quant-gguf (kernel cases, then the gpu-marked tests)"
  { timeout 100 python3 -m pytest -q -rs -n 8 --timeout 90 plugins/quant/gguf/tests/kernel_cases.py
    timeout 140 python3 -m pytest -q -m gpu -rs -n 4 --timeout 120 plugins/quant/gguf/tests
  } 2>&1 | grep -v Warning | tail -40 | tee "$OUT/tests_quant.log"
fi
# every candidate kernel configuration; writes the tuned table after every shape: copy
# OUT/quant_tuned.json to plugins/quant/gguf/tallow_quant_gguf/tuned/ and the plugin uses it on
# GPUs of the name in it. No shape begins after 160 s (compilation included), 3.5 min at most.
if [[ ",$MODE," == *",quanttune,"* ]]; then
  echo "== tuning sweep of the quantized matmul kernels (llama-3-8b shapes, Q4_K and Q8_0)"
  timeout 210 python3 bench/gpu/quant_micro.py --sweep --budget 160 --jobs 16 \
    --table "$OUT/quant_tuned.json" --output "$OUT/quanttune_all.json" 2>&1 | grep -v Warning \
    | tee "$OUT/quanttune.log" | grep -v "^    !!" | tail -90
  grep -c "^    !!" "$OUT/quanttune.log" | xargs echo "candidates refused (failed, raised or wrong):"
  grep "^    !!" "$OUT/quanttune.log" | head -12
  python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print('tuned table:', len(t['entries']), 'entries for', t['device'])" "$OUT/quant_tuned.json" || echo "!! no tuned table written"
fi
# the sweep again from 16 rows up (the workspace path is timed from 17 rows), its cells merged
# into the shipped H200 table (the one- to 4-row cells kept): copy OUT/quant_tuned.json over
# plugins/quant/gguf/tallow_quant_gguf/tuned/nvidia-h200.json. No shape begins after 150 s.
if [[ ",$MODE," == *",quanttunelarge,"* ]]; then
  echo "== tuning sweep from 16 rows up, merged into the shipped table"
  timeout 200 python3 bench/gpu/quant_micro.py --sweep --rows 16,64,256,512,4096 --budget 150 \
    --jobs 16 --merge plugins/quant/gguf/tallow_quant_gguf/tuned/nvidia-h200.json \
    --table "$OUT/quant_tuned.json" --output "$OUT/quanttune_large.json" 2>&1 | grep -v Warning \
    | tee "$OUT/quanttune_large.log" | grep -v "^    !!" | tail -60
  grep -c "^    !!" "$OUT/quanttune_large.log" | xargs echo "candidates refused (failed, raised or wrong):"
  python3 -c "import json,sys; t=json.load(open(sys.argv[1])); print('tuned table:', len(t['entries']), 'entries for', t['device'])" "$OUT/quant_tuned.json" || echo "!! no tuned table written"
fi
Q8B=(--model random:llama-3-8b --dtype bfloat16)
if [[ ",$MODE," == *",q4klat,"* ]]; then
  bench latency_8b_q4k_bs1 300 latency "${Q8B[@]}" --isq q4_k --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",q8lat,"* ]]; then
  bench latency_8b_q8_0_bs1 300 latency "${Q8B[@]}" --isq q8_0 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",q4kthr,"* ]]; then
  bench throughput_8b_q4k 450 throughput "${Q8B[@]}" --isq q4_k --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
if [[ ",$MODE," == *",q4kttft,"* ]]; then
  bench ttft_8b_4096_q4k 240 latency "${Q8B[@]}" --isq q4_k --batch-size 1 --input-len 4096 --output-len 4 --max-model-len 8192
fi
if [[ ",$MODE," == *",quantmicro,"* ]]; then  # what the engine runs per llama-3-8b shape and row count, against bf16
  echo "== quantized matmul kernels on llama-3-8b shapes"
  timeout 560 python3 bench/gpu/quant_micro.py --output "$OUT/quantmicro.json" 2>&1 | grep -v Warning | tee "$OUT/quantmicro.log" | tail -80
fi
if [[ ",$MODE," == *",fp8wtests,"* ]]; then  # ~9 min at most (Triton compiles on first use)
  echo "== GPU tests of tallow-quant-fp8 (kernel cases, then the gpu-marked tests)"
  { timeout 220 python3 -m pytest -q -rs --timeout 200 plugins/quant/fp8/tests/kernel_cases.py
    timeout 300 python3 -m pytest -q -m gpu -rs --timeout 280 plugins/quant/fp8/tests
  } 2>&1 | grep -v Warning | tail -40 | tee "$OUT/tests_fp8w.log"
fi
F8B=(--model random:llama-3-8b --dtype bfloat16 --isq fp8)
if [[ ",$MODE," == *",fp8wlat,"* ]]; then
  bench latency_8b_fp8w_bs1 300 latency "${F8B[@]}" --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",fp8wlatvocab,"* ]]; then  # A/B: embedding and head in fp8 too
  bench latency_8b_fp8w_vocab_bs1 300 latency --config bench/gpu/fp8_isq_vocab.yaml "${F8B[@]}" --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",fp8wthr,"* ]]; then  # fp8 weights and an fp8 KV cache
  bench throughput_8b_fp8w_fp8kv 450 throughput "${F8B[@]}" --kv-codec fp8 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
if [[ ",$MODE," == *",fp8wttft,"* ]]; then
  bench ttft_8b_4096_fp8w 240 latency "${F8B[@]}" --batch-size 1 --input-len 4096 --output-len 4 --max-model-len 8192
fi
if [[ ",$MODE," == *",fp8wmicro,"* ]]; then  # the fp8 GEMV/GEMM against bf16 per llama-3-8b shape, M 1/16/256/4096, and the GEMV sweep
  echo "== fp8 matmuls on llama-3-8b shapes"
  timeout 420 python3 bench/gpu/fp8_micro.py --rows 1,16,256,4096 --sweep-gemv --output "$OUT/fp8micro.json" 2>&1 | grep -v Warning | tee "$OUT/fp8micro.log" | tail -60
fi
if [[ ",$MODE," == *",embedtests,"* ]]; then  # ~2 min
  echo "== GPU tests of the embed task (bidirectional attention kernels, BERT on the engine)"
  { timeout 150 python3 -m pytest -q -rs --timeout 120 plugins/attention/triton/tests/kernel_cases.py -k "bidirectional or chunked"
    timeout 150 python3 -m pytest -q -m gpu -rs --timeout 120 plugins/model/bert/tests
  } 2>&1 | grep -v Warning | tail -25 | tee "$OUT/tests_embed.log"
fi
if [[ ",$MODE," == *",embed,"* ]]; then  # all-MiniLM-L6-v2 shape, 128-token inputs
  EMB=(embed --model random:all-minilm-l6-v2 --dtype bfloat16 --num-prompts 16384 --input-len 128)
  bench embed_minilm_128 240 "${EMB[@]}"
  bench embed_minilm_128_big_steps 240 "${EMB[@]}" --max-num-batched-tokens 32768 --max-num-seqs 1024
fi
# FlashInfer (tallow-attention-flashinfer) against Triton, the A/B behind the default backend
# priority: the same runs as latency, ttft, qwen3 and thr8b with the backend named. Needs the
# wheels of bench/gpu/flashinfer_wheels.sh; with its AOT tarball nothing compiles for these.
# Wall time on an H200 (estimates): fitests ~2.5 min (compiles 4 FA2 modules, ~1 min on 16
# cores), *8blat ~1 min, *8bttft ~1 min, *q3thr ~1.5 min, *8bthr ~3.5 min each.
if [[ ",$MODE," == *",fitests,"* ]]; then
  echo "== GPU tests of tallow-attention-flashinfer"
  MAX_JOBS=8 timeout 420 python3 -m pytest -q -m gpu -rsfE --timeout 360 plugins/attention/flashinfer/tests 2>&1 | tail -30 | tee "$OUT/tests_flashinfer.log"
fi
AB_LAT8B=(latency --model random:llama-3-8b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096)
AB_TTFT8B=(latency --model random:llama-3-8b --dtype bfloat16 --batch-size 1 --input-len 4096 --output-len 4 --max-model-len 8192)
AB_Q3THR=(throughput --model random:qwen3-0.6b --dtype bfloat16 --num-prompts 256 --min-input-len 100 --max-input-len 1024 --min-output-len 100 --max-output-len 1024 --max-model-len 4096)
AB_THR8B=(throughput --model random:llama-3-8b --dtype bfloat16 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512)
for backend in flashinfer triton; do
  short=${backend/flashinfer/fi}; short=${short/triton/tri}
  [[ ",$MODE," == *",${short}8blat,"* ]] && bench "latency_8b_bs1_$backend" 240 "${AB_LAT8B[@]}" --attention-backend "$backend"
  [[ ",$MODE," == *",${short}8bttft,"* ]] && bench "ttft_8b_4096_$backend" 180 "${AB_TTFT8B[@]}" --attention-backend "$backend"
  [[ ",$MODE," == *",${short}q3thr,"* ]] && bench "throughput_qwen3_0.6b_$backend" 300 "${AB_Q3THR[@]}" --attention-backend "$backend"
  [[ ",$MODE," == *",${short}8bthr,"* ]] && bench "throughput_8b_$backend" 330 "${AB_THR8B[@]}" --attention-backend "$backend"
done
# Tensor parallelism over the first two GPUs (NCCL; NVLink multicast is kept off by tallow
# itself, and here for nccl-tests too).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [[ ",$MODE," == *",tptests,"* ]]; then  # TP=2 vs TP=1 logits and tokens, graph replay = eager (~2 min)
  echo "== GPU tests of tensor parallelism (2 GPUs)"
  timeout 420 python3 -m pytest -q -m gpu -rs --timeout 400 tests/distributed 2>&1 \
    | grep -v Warning | tail -30 | tee "$OUT/tests_tp.log"
fi
TP2=(--dtype bfloat16 --tensor-parallel-size 2)
if [[ ",$MODE," == *",tp2lat,"* ]]; then  # target: >= 380 tok/s (one H200: 242)
  bench latency_8b_tp2_bs1 300 latency --model random:llama-3-8b "${TP2[@]}" --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",tp2thr,"* ]]; then
  bench throughput_8b_tp2 420 throughput --model random:llama-3-8b "${TP2[@]}" --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
if [[ ",$MODE," == *",tp2lat70b,"* ]]; then  # target: >= 48 tok/s (bandwidth ceiling ~61)
  bench latency_70b_tp2_bs1 540 latency --model random:llama-3-70b "${TP2[@]}" --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096 --max-num-seqs 16 --max-cuda-graph-batch 16
fi
if [[ ",$MODE," == *",tp2thr70b,"* ]]; then
  bench throughput_70b_tp2 590 throughput --model random:llama-3-70b "${TP2[@]}" --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 256 --max-cuda-graph-batch 256
fi
if [[ ",$MODE," == *",tp2allreduce,"* ]]; then  # the all-reduces of a decode step, eager and in a graph, vs nccl-tests
  echo "== all-reduce per decode step over 2 GPUs (llama-3-8b: 65 per step; llama-3-70b: 161)"
  for shape in "--hidden 4096 --layers 32" "--hidden 8192 --layers 80"; do
    timeout 120 torchrun --standalone --nproc-per-node 2 bench/gpu/tp_allreduce.py $shape \
      --output "$OUT/tp2_allreduce_h${shape:9:4}.json" 2>&1 | grep -v Warning | tail -8
  done | tee "$OUT/tp2_allreduce.log"
fi
if [[ ",$MODE," == *",sotests,"* ]]; then  # structured outputs: needs the xgrammar wheels in .whl
  echo "== GPU tests of structured outputs (the mask kernel, constrained decoding under CUDA graphs)"
  timeout 420 python3 -m pytest -q -m gpu -rs --timeout 360 tests/kernels/test_token_bitmask.py \
    tests/gpu/test_structured_outputs_gpu.py 2>&1 | grep -v Warning | tail -25 | tee "$OUT/tests_so.log"
fi
if [[ ",$MODE," == *",sothr,"* ]]; then  # target: constrained >= 90 % of unconstrained tok/s
  bench throughput_qwen3_0.6b_json_schema 420 throughput --model random:qwen3-0.6b --dtype bfloat16 \
    --num-prompts 256 --input-len 256 --output-len 768 --max-model-len 2048 \
    --json-schema bench/schemas/order.json
fi
if [[ ",$MODE," == *",sothrllg,"* ]]; then  # the same with the llguidance grammar backend (its wheel in .whl)
  TALLOW_RUNNER__GRAMMAR_BACKEND=llguidance bench throughput_qwen3_0.6b_json_schema_llguidance 420 \
    throughput --model random:qwen3-0.6b --dtype bfloat16 --num-prompts 256 --input-len 256 \
    --output-len 768 --max-model-len 2048 --json-schema bench/schemas/order.json
fi
if [[ ",$MODE," == *",int4tests,"* ]]; then  # ~6 min at most (two GPTQ loads of a 1B model among them)
  echo "== GPU tests of tallow-quant-int4 (kernel cases, then the gpu-marked tests)"
  { timeout 120 python3 -m pytest -q -rs -p no:cacheprovider --import-mode=importlib --timeout 110 plugins/quant/int4/tests/kernel_cases.py
    timeout 420 python3 -m pytest -q -m gpu -rs --timeout 300 plugins/quant/int4/tests
  } 2>&1 | grep -v Warning | tail -40 | tee "$OUT/tests_int4.log"
fi
# speed runs round to nearest (bench/gpu/int4_rtn.yaml): the default's layout and kernels
# without calibrating the 8B model at load; GPTQ on the GPU is among int4tests
I4B=(--config bench/gpu/int4_rtn.yaml "${Q8B[@]}" --isq int4)
if [[ ",$MODE," == *",int4lat,"* ]]; then
  bench latency_8b_int4_bs1 300 latency "${I4B[@]}" --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",int4thr,"* ]]; then
  bench throughput_8b_int4 450 throughput "${I4B[@]}" --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
if [[ ",$MODE," == *",int4thrfp8,"* ]]; then  # the same with an fp8 KV cache
  bench throughput_8b_int4_fp8kv 450 throughput "${I4B[@]}" --kv-codec fp8 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
if [[ ",$MODE," == *",int4micro,"* ]]; then  # int4 g128 asymmetric (the --isq int4 layout) against bf16 per llama-3-8b shape, M 1/16/256/4096, the GEMV's configs and gate A/B
  echo "== int4 matmul on llama-3-8b shapes"
  timeout 500 python3 bench/gpu/int4_micro.py --asym --gemv-configs --output "$OUT/int4micro.json" 2>&1 | grep -v Warning | tee "$OUT/int4micro.log" | tail -200
fi
if [[ ",$MODE," == *",tctests,"* ]]; then  # ~5 min at most (Triton compiles every shape's tiles)
  echo "== GPU tests of the packed-weight tensor-core GEMM (core at llama-3-8b shapes, then each plugin's re-layout cases)"
  { timeout 200 python3 -m pytest -q -rs -m gpu -p no:cacheprovider --timeout 190 tests/kernels/test_packed_gemm_kernels.py
    for p in int4 gguf fp8 fp4; do
      timeout 100 python3 -m pytest -q -rs -p no:cacheprovider --import-mode=importlib --timeout 90 plugins/quant/$p/tests/tensor_core_cases.py
    done
  } 2>&1 | grep -v Warning | tail -40 | tee "$OUT/tests_tc.log"
fi
if [[ ",$MODE," == *",tcmicro,"* ]]; then  # every kind per llama-3-8b shape, M 1/16/256/4096, default tiles
  echo "== packed-weight tensor-core GEMM on llama-3-8b shapes"
  timeout 500 python3 bench/gpu/packed_gemm_micro.py --output "$OUT/tcmicro.json" 2>&1 | grep -v Warning | tee "$OUT/tcmicro.log" | tail -100
fi
if [[ ",$MODE," == *",tcsweep,"* ]]; then  # the tile sweep at 1 and 16 rows (decode) of int4 and Q4_K; the table is written after every cell
  echo "== packed-weight tensor-core GEMM tile sweep"
  timeout 560 python3 bench/gpu/packed_gemm_micro.py --sweep --rows 1,16 --kinds int4,q4k --shapes qkv,gate_up,down \
    --output "$OUT/tcsweep.json" --table "$OUT/packed_gemm_tuned.json" 2>&1 | grep -v Warning | tee "$OUT/tcsweep.log" | grep -v "^    !!" | tail -100
fi
# the same runs as int4lat/int4thr, q4klat/q4kthr, q8lat and fp8wlat through the tensor-core GEMM
# (tcmxfp4lat: after mxfp4lat)
if [[ ",$MODE," == *",tcint4lat,"* ]]; then
  bench latency_8b_int4_tc_bs1 300 latency --config bench/gpu/int4_rtn_tc.yaml "${Q8B[@]}" --isq int4 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",tcint4thr,"* ]]; then
  bench throughput_8b_int4_tc 450 throughput --config bench/gpu/int4_rtn_tc.yaml "${Q8B[@]}" --isq int4 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
if [[ ",$MODE," == *",tcq4klat,"* ]]; then
  bench latency_8b_q4k_tc_bs1 300 latency --config bench/gpu/gguf_tc.yaml "${Q8B[@]}" --isq q4_k --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",tcq4kthr,"* ]]; then
  bench throughput_8b_q4k_tc 450 throughput --config bench/gpu/gguf_tc.yaml "${Q8B[@]}" --isq q4_k --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512
fi
if [[ ",$MODE," == *",tcq8lat,"* ]]; then
  bench latency_8b_q8_0_tc_bs1 300 latency --config bench/gpu/gguf_tc.yaml "${Q8B[@]}" --isq q8_0 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",tcfp8lat,"* ]]; then
  bench latency_8b_fp8w_tc_bs1 300 latency --config bench/gpu/fp8_tc.yaml "${F8B[@]}" --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",fp4tests,"* ]]; then  # ~3 min at most
  echo "== GPU tests of tallow-quant-fp4 (kernel cases, then the gpu-marked tests)"
  { timeout 100 python3 -m pytest -q -rs -p no:cacheprovider --import-mode=importlib --timeout 90 plugins/quant/fp4/tests/kernel_cases.py
    timeout 200 python3 -m pytest -q -m gpu -rs --timeout 180 plugins/quant/fp4/tests
  } 2>&1 | grep -v Warning | tail -30 | tee "$OUT/tests_fp4.log"
fi
if [[ ",$MODE," == *",fp4micro,"* ]]; then  # mxfp4 and nvfp4 against bf16 per llama-3-8b shape, M 1/4/16/256, and the GEMV's configs
  echo "== fp4 matmuls on llama-3-8b shapes"
  timeout 500 python3 bench/gpu/fp4_micro.py --gemv-configs --rows 1,4,16 --output "$OUT/fp4micro.json" 2>&1 | grep -v Warning | tee "$OUT/fp4micro.log" | tail -200
fi
if [[ ",$MODE," == *",mxfp4lat,"* ]]; then
  bench latency_8b_mxfp4_bs1 300 latency "${Q8B[@]}" --isq mxfp4 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",tcmxfp4lat,"* ]]; then  # mxfp4lat through the tensor-core GEMM
  bench latency_8b_mxfp4_tc_bs1 300 latency --config bench/gpu/fp4_tc.yaml "${Q8B[@]}" --isq mxfp4 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096
fi
if [[ ",$MODE," == *",spectests,"* ]]; then  # speculative decoding beside CUDA graphs (tiny model)
  echo "== GPU tests of speculative decoding"
  timeout 300 python3 -m pytest -q -m gpu -rs --timeout 240 plugins/speculator/ngram/tests 2>&1 | tail -15 | tee "$OUT/tests_spec.log"
fi
if [[ ",$MODE," == *",specverify,"* ]]; then  # verify-step cost vs k and batch, replay proposals, random:llama-3-8b
  echo "== speculative decoding: verify step vs k and batch (replay speculator)"
  timeout 580 python3 bench/gpu/spec_verify.py --model random:llama-3-8b --batches 1,8,64 --ks 1,2,4,8 \
    --alphas 0.5,0.8,1.0 --input-len 256 --output-len 128 --output "$OUT/spec_verify.json" 2>&1 | grep -v Warning | tee "$OUT/spec_verify.log" | tail -60
fi
if [[ ",$MODE," == *",vlmtests,"* ]]; then  # images in: Qwen2.5-VL parity and the engine on the GPU (~2 min)
  echo "== GPU tests of the image path (tallow-model-qwen2-vl)"
  timeout 300 python3 -m pytest -q -m gpu -rs --timeout 240 plugins/model/qwen2_vl/tests 2>&1 | tail -15 | tee "$OUT/tests_vlm.log"
fi
if [[ ",$MODE," == *",vlmimages,"* ]]; then  # random:qwen2.5-vl-7b, 64 requests of one 1024x1024 image each (1296 tokens): cold vs warm encoder cache
  echo "== images in: 64 x one 1024x1024 image, cold and warm encoder cache"
  timeout 580 python3 bench/gpu/vlm_images.py --model random:qwen2.5-vl-7b --num-requests 64 --image-size 1024 \
    --output-len 8 --dtype bfloat16 --max-model-len 4096 --output "$OUT/vlm_images_7b.json" 2>&1 | grep -v Warning | tee "$OUT/vlm_images_7b.log" | tail -40
fi
wait  # a background item (distcheck)
[ -f "$OUT/tests_dist.log" ] && { echo "== tests/test_dist.py"; tail -15 "$OUT/tests_dist.log"; }
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("\n== summary")
for f in sorted(out.glob("*.json")):
    r = json.loads(f.read_text())
    if not isinstance(r, dict):  # the micro benches' per-shape lists have their own logs
        continue
    keys = ["decode_tok_s_per_seq", "decode_tok_s_total", "ttft_s", "itl_p50_s",
            "bandwidth_utilisation", "speedup_vs_hf", "output_tok_s", "total_tok_s", "req_s",
            "peak_running", "kv_fits_sequences", "kv_capacity_tokens", "kv_capacity_vs_bf16",
            "card_gemm_flops", "card_copy_bytes_per_s", "weight_bytes", "inputs_s",
            "constrained_tok_s", "unconstrained_tok_s", "constrained_vs_unconstrained",
            "mask_ms_per_step"]
    vals = ", ".join(f"{k}={r[k]:.4g}" for k in keys if isinstance(r.get(k), (int, float)))
    print(f"{f.stem:28s} {vals}")
PY
# at most 8 files come back from the machine: everything in one archive beside the table above
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 7 ]; then
  tar czf /tmp/tallow-results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/tallow-results.tgz "$OUT/results.tgz"
fi
