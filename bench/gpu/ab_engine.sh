#!/usr/bin/env bash
# A/B of the engine's speed: `tallow bench` runs of this tree and of a base tree side by side in
# one call, alternating (new, base, new, ...), so a change to the engine's structure is shown not
# to move batch-1 decode or throughput beyond the machine's noise.
# Usage (GPU machine, project root, after `bash bench/gpu/run_all.sh OUT none` installed this tree):
#   bash bench/gpu/ab_engine.sh OUTDIR BASEDIR ITEMS
# BASEDIR holds the base commit's framework/ and plugins/ (e.g. `git archive REV framework plugins`);
# it is put first on PYTHONPATH for the base runs. ITEMS: comma-separated among
# lat8b (llama-3-8b bf16 batch 1, 512 in / 256 out), thrq3 (qwen3-0.6b, 256 prompts 100-1024 in/out),
# thr8b (llama-3-8b, 1000 x 1000 in / 1000 out). AB_ROUNDS (default 2): new/base pairs of lat8b.
set -uo pipefail
OUT=${1:?outdir}; BASE=$(cd "${2:?basedir}" && pwd); ITEMS=${3:-lat8b,thrq3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
base_path="$BASE/framework"
for d in "$BASE"/plugins/*/*/; do base_path="$base_path:${d%/}"; done

run() {  # tree (new|base), name, timeout, bench args...
  local tree=$1 name=$2 limit=$3; shift 3
  local pp=${PYTHONPATH:-}
  [ "$tree" = base ] && pp="$base_path${pp:+:$pp}"
  echo "== $tree $name: tallow bench $*"
  PYTHONPATH="$pp" timeout "$limit" python3 -m tallow.cli bench "$@" --output "$OUT/$name-$tree.json" \
    2>"$OUT/$name-$tree.err" | tail -4
  if [ -s "$OUT/$name-$tree.json" ]; then rm -f "$OUT/$name-$tree.err"
  else echo "!! $tree $name failed"; tail -15 "$OUT/$name-$tree.err"; fi
}
want() { [[ ",$ITEMS," == *",$1,"* ]]; }
LAT8B=(latency --model random:llama-3-8b --dtype bfloat16 --batch-size 1 --input-len 512 --output-len 256 --max-model-len 4096)
THRQ3=(throughput --model random:qwen3-0.6b --dtype bfloat16 --num-prompts 256 --min-input-len 100 --max-input-len 1024 --min-output-len 100 --max-output-len 1024 --max-model-len 4096)
THR8B=(throughput --model random:llama-3-8b --dtype bfloat16 --num-prompts 1000 --input-len 1000 --output-len 1000 --max-model-len 2048 --max-num-seqs 512 --max-cuda-graph-batch 512)
if want lat8b; then for t in $(for i in $(seq "${AB_ROUNDS:-2}"); do echo new base; done); do run $t lat8b 200 "${LAT8B[@]}"; mv -f "$OUT/lat8b-$t.json" "$OUT/lat8b-$t-$(date +%s).json" 2>/dev/null; done; fi
if want thrq3; then for t in new base; do run $t thrq3 240 "${THRQ3[@]}"; done; fi
if want thr8b; then for t in new base; do run $t thr8b 330 "${THR8B[@]}"; done; fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("\n== A/B summary (new = this tree, base = BASEDIR)")
for f in sorted(out.glob("*.json")):
    r = json.loads(f.read_text())
    keys = ["decode_tok_s_per_seq", "ttft_s", "itl_p50_s", "output_tok_s", "total_tok_s"]
    print(f"{f.stem:32s} " + ", ".join(f"{k}={r[k]:.4g}" for k in keys
                                      if isinstance(r.get(k), (int, float))))
PY
# at most 8 files come back from the GPU machine: the raw results travel as one archive
(cd "$OUT" && shopt -s nullglob && f=(*.json *.err) && tar czf ab-results.tgz "${f[@]}" && rm -f "${f[@]}")
