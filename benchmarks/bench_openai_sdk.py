"""Client CPU per completion request: the project's HTTP engine vs the official openai SDK.

Issue 7 asked to use the ``openai`` package where it is the natural tool (the ``openai`` backend
kind) or to drop it if it measurably cannot serve. This measures both on the same emulated vLLM
server and the same requests (T = 64 tokens, top-20 logprobs, raw-logprob extras in
``extra_body``), counting the CPU of the client's thread only (the server runs in other threads):

    .venv/bin/python -m benchmarks.bench_openai_sdk

The SDK's figure does not even include turning its logprob objects into the arrays and certified
intervals the kernels need; ours does.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx

from presto_client.backends import EngineSpec, create_engine
from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec
from tests.support.emulation import EmulationServer


async def _measure(requests: int, tokens: int, rounds: int) -> None:
    import openai  # not a dependency of presto-client: pip install openai to run this

    with EmulationServer("vllm", vocab_size=64, model_name="m") as server:
        engine = create_engine(
            EngineSpec(kind="vllm", base_urls=(server.base_url,), model="m", top_k=20)
        )
        spec = ScoreSpec(temperatures=(1.0, 0.25))
        sdk = openai.AsyncOpenAI(
            base_url=server.base_url + "/v1",
            api_key="unused",
            max_retries=0,
            http_client=httpx.AsyncClient(),
        )

        async def ours(seed: int) -> None:
            await engine.generate([ProposalRequest((1, 2, 3), tokens, 0.25, seed, spec)])

        async def via_sdk(seed: int) -> None:
            completion = await sdk.completions.create(
                model="m",
                prompt=[1, 2, 3],
                max_tokens=tokens,
                temperature=0.25,
                logprobs=20,
                seed=seed,
                extra_body={
                    "return_token_ids": True,
                    "top_k": 0,
                    "return_tokens_as_token_ids": True,
                    "ignore_eos": True,
                },
            )
            logprobs = completion.choices[0].logprobs
            assert logprobs is not None and logprobs.top_logprobs is not None

        arms: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
            ("presto-client", ours),
            ("openai SDK", via_sdk),
        ]
        try:
            for _ in range(rounds):  # interleaved, so drift hits both alike
                for name, call in arms:
                    await call(0)  # warm: connection, caches
                    start = time.thread_time()
                    for seed in range(requests):
                        await call(seed)
                    per = 1e3 * (time.thread_time() - start) / requests
                    print(f"{name:14s} {per:6.2f} ms client CPU per request")
        finally:
            await sdk.close()
            await engine.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(_measure(args.requests, args.tokens, args.rounds))


if __name__ == "__main__":
    main()
