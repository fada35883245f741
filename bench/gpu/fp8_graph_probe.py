"""Why greedy decoding of an ``--isq fp8`` model (``isq_vocab``) can differ between CUDA
graphs and eager: for the batches of ``test_isq_fp8_model_graphs_equal_eager`` over several
seeds, each engine decodes twice (is it deterministic on its own?) and the two are compared;
at the first position where they differ, the top-2 logprob gap of each engine says whether it
is a near tie or a real difference in the computed logits. ``--own-sizes`` makes each batch
replay the graph of its own size, not a larger one that timed faster (whose padded products
may pick other kernels than eager).

    python3 bench/gpu/fp8_graph_probe.py --seeds 8 --sizes 1 2 4 [--own-sizes]
"""

from __future__ import annotations

import argparse

import torch


def _llm(graphs: bool, vocab: bool, own_sizes: bool):
    from tallow import LLM
    from tallow.config import config_from_mapping

    llm = LLM.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": "random:llama-3.2-1b",
                    "device": "cuda",
                    "dtype": "bfloat16",
                    "max_model_len": 2048,
                    "isq": "fp8",
                },
                # no prefix cache: a repeated batch recomputes its prompts with the same kernels
                "cache": {"num_blocks": 2048, "enable_prefix_caching": False},
                "runner": {"disable_cuda_graph": not graphs, "max_cuda_graph_batch": 32},
                "plugins": {
                    "settings": {
                        "tallow-attention-triton": {"num_splits": 4},
                        "tallow-quant-fp8": {"isq_vocab": vocab},
                    }
                },
            }
        )
    )
    if graphs and own_sizes:
        from tallow.plugin.testing.engine import replay_own_graph_sizes

        replay_own_graph_sizes(llm)
    return llm


def _run(llm, prompts, logprobs: int | None):
    from tallow import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=logprobs)
    return [out.outputs[0] for out in llm.generate(prompts, params)]


def _first_diff(a: list[list[int]], b: list[list[int]]):
    for row, (x, y) in enumerate(zip(a, b)):
        for pos, (s, t) in enumerate(zip(x, y)):
            if s != t:
                return row, pos
    return None


def _gap(out, pos: int) -> str:
    if not out.logprobs or pos >= len(out.logprobs):
        return "?"
    top = sorted((lp.logprob for lp in out.logprobs[pos].values()), reverse=True)
    return f"{top[0] - top[1]:.4f}" if len(top) > 1 else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--no-vocab", action="store_true", help="isq_vocab off")
    parser.add_argument(
        "--own-sizes",
        action="store_true",
        help="each batch replays the graph of its own size (not a faster, "
        "larger one: tallow.plugin.testing.engine.replay_own_graph_sizes)",
    )
    args = parser.parse_args()
    vocab = not args.no_vocab
    graphs, eager = _llm(True, vocab, args.own_sizes), _llm(False, vocab, args.own_sizes)
    print(f"isq_vocab={vocab} own_sizes={args.own_sizes}")
    for seed in range(args.seeds):
        g = torch.Generator().manual_seed(seed)
        for n in (1, 2, 4, 8, 16, 32):
            batch = [
                torch.randint(0, 120000, (int(L),), generator=g).tolist()
                for L in torch.randint(3, 300, (n,), generator=g)
            ]
            if n not in args.sizes:
                continue
            tokens = {}
            for name, llm in (("graphs", graphs), ("eager", eager)):
                first = [list(o.token_ids) for o in _run(llm, batch, None)]
                again = [list(o.token_ids) for o in _run(llm, batch, None)]
                tokens[name] = first
                if first != again:
                    print(
                        f"seed {seed} n {n}: {name} differs from itself at {_first_diff(first, again)}"
                    )
            diff = _first_diff(tokens["graphs"], tokens["eager"])
            if diff is None:
                print(f"seed {seed} n {n}: graphs == eager")
                continue
            row, pos = diff
            lg = _run(graphs, batch, 2)[row]
            le = _run(eager, batch, 2)[row]
            print(
                f"seed {seed} n {n}: graphs != eager at row {row} position {pos}; top-2 gap "
                f"graphs {_gap(lg, pos)} eager {_gap(le, pos)}; with logprobs the tokens "
                f"{'agree' if list(lg.token_ids) == list(le.token_ids) else 'differ'}"
            )


if __name__ == "__main__":
    main()
