"""The asynchronous engine: concurrent streams, cancellation frees blocks, errors surface."""

from __future__ import annotations

import asyncio

import pytest

from tallow.engine.async_engine import AsyncEngine
from tallow.engine.llm import config_from_kwargs
from tallow.engine.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return AsyncEngine.from_config(config_from_kwargs(
        model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=128, block_size=4))


def run(coro):
    return asyncio.run(coro)


def test_concurrent_streams_and_cancellation(engine):
    tok = engine.tokenizer

    async def main():
        await engine.start()
        free = engine.stats()["num_free_blocks"]
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

        async def collect(i):
            last = None
            async for out in engine.generate(tok.encode(f"prompt number {i}"), params, f"r{i}"):
                last = out
            return last

        outs = await asyncio.gather(*[collect(i) for i in range(6)])
        assert all(o.finished and len(o.outputs[0].token_ids) == 16 for o in outs)
        # streams are cumulative and the last one has the whole text
        assert all(o.outputs[0].text == tok.decode(o.outputs[0].token_ids) for o in outs)

        async def abandon(i):
            agen = engine.generate(tok.encode("abandon me"), SamplingParams(
                temperature=0.0, max_tokens=200, ignore_eos=True), f"gone{i}")
            await agen.__anext__()
            await agen.aclose()

        await asyncio.gather(*[abandon(i) for i in range(4)])
        for _ in range(100):
            stats = engine.stats()
            if stats["num_running"] == 0 and stats["num_free_blocks"] == free:
                break
            await asyncio.sleep(0.02)
        assert engine.stats()["num_free_blocks"] == free
        assert engine.stats()["num_running"] == 0
        await engine.shutdown()

    run(main())


def test_admission_error_surfaces_before_first_output(tiny_llama):
    eng = AsyncEngine.from_config(config_from_kwargs(
        model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=64, block_size=4,
        max_model_len=256))

    async def main():
        await eng.start()
        with pytest.raises(ValueError, match="(?i)prompt"):
            async for _ in eng.generate([5] * 300, SamplingParams(max_tokens=4), "too-long"):
                pass
        await eng.shutdown()

    run(main())
