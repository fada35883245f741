"""Replay a throughput workload through the scheduler alone (no model, no GPU).

  python bench/schedule_replay.py --kv-blocks 55396 --num-prompts 1000 --input-len 1000 \
      --output-len 1000 --max-num-seqs 512

Every request is submitted at once and runs to ``--output-len`` tokens (as ``tallow bench
throughput`` runs them, ignore_eos). Prints how many steps the workload takes, how many
sequences were preempted and how many prompt tokens were computed (more than the prompts hold
when preempted sequences recompute theirs). ``--kv-blocks`` is the KV budget a GPU run reports
(``kv_blocks`` in the benchmark's JSON), so the replay shows what the scheduler does with it.
"""

from __future__ import annotations

import argparse
import json
import time

from tallow.engine.block_manager import BlockManager
from tallow import SamplingParams
from tallow.engine.scheduler import Scheduler
from tallow.engine.sequence import SequenceStatus


def replay(
    *,
    kv_blocks: int,
    block_size: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    ignore_eos: bool = True,
) -> dict[str, float]:
    bm = BlockManager(kv_blocks, block_size)
    s = Scheduler(
        bm,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        prefill_chunk_size=None,
        max_model_len=max_model_len,
    )
    # min_tokens keeps a length-unknown request running to max_tokens just the same
    params = (
        SamplingParams(max_tokens=output_len, ignore_eos=True)
        if ignore_eos
        else SamplingParams(max_tokens=output_len, min_tokens=output_len)
    )
    for i in range(num_prompts):
        # distinct prompts: no prefix-cache hits between requests
        s.add_request(f"r{i}", [10 + (i * 7919 + j * 31) % 30000 for j in range(input_len)], params)
    steps = prompt_tokens = decode_rows = max_running = 0
    while s.has_unfinished():
        out = s.schedule()
        steps += 1
        for item in out.scheduled:
            if item.num_tokens == 1:
                decode_rows += 1
            else:
                prompt_tokens += item.num_tokens
        max_running = max(max_running, len(out.scheduled))
        sampled = {seq.seq_id: 5 for item in out.scheduled for seq in item.sample_seqs}
        for seq in s.update(out, sampled):
            if seq.num_output_tokens >= output_len:
                s.finish(seq, SequenceStatus.FINISHED_LENGTH)
    return dict(
        steps=steps,
        preemptions=s.num_preemptions,
        prompt_tokens=prompt_tokens,
        recomputed_tokens=prompt_tokens - num_prompts * input_len,
        decode_rows=decode_rows,
        max_running=max_running,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kv-blocks", type=int, required=True)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--input-len", type=int, default=1000)
    p.add_argument("--output-len", type=int, default=1000)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument(
        "--length-unknown",
        action="store_true",
        help="requests whose length the scheduler cannot know (no ignore_eos)",
    )
    a = p.parse_args()
    t0 = time.perf_counter()
    result = replay(
        kv_blocks=a.kv_blocks,
        block_size=a.block_size,
        num_prompts=a.num_prompts,
        input_len=a.input_len,
        output_len=a.output_len,
        max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens,
        max_model_len=a.max_model_len,
        ignore_eos=not a.length_unknown,
    )
    result["replay_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
