"""The job's shape in virtual time on a fixed cost curve: no client CPU and no machine load in
the figures, so a policy change is compared on the code alone (docs/benchmarks.md, "The job's
shape").

The reference model with an EOS (``benchmarks.fast_model``) behind ``a + b·n`` seconds a token
(``n``: sequences in flight), streamed in chunks of ``--interval`` tokens, under the virtual
clock of ``benchmarks.budget_replay``: the chains are the latency server's (same answers, same
blocks), only their times are the curve's. Examples (seconds each)::

    python -m benchmarks.job_virtual_time --samplers multi_try_mh --prompts 6   # gpu curve
    python -m benchmarks.job_virtual_time --samplers power_mh --a 0.006 --b 0   # flat
    python -m benchmarks.job_virtual_time --samplers power_mh --a 0.05 --b 0.02 --max-concurrency 8

To compare with an older commit, run the same command from a worktree of it
(``git worktree add /tmp/old COMMIT``) with ``PYTHONPATH=/tmp/old`` and this file copied there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from benchmarks.bench_stream import make_prompts, sampler_config
from benchmarks.budget_replay import virtual_time
from benchmarks.fast_model import EosHazard, WindowedReferenceModel
from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens
from presto_client.core.reference import ReferenceEngine
from presto_client.core.runners import chain_budget, run_chain


class CurveEngine:
    """Reference model behind ``a + b·n`` per token (n: sequences in flight), chunks of
    ``interval`` tokens, a first-token latency of one step plus prefill."""

    def __init__(
        self,
        model: WindowedReferenceModel,
        a: float,
        b: float,
        interval: int,
        max_concurrency: int,
        top_k: int = 20,
    ) -> None:
        self.inner = ReferenceEngine(model, top_k=top_k, name="sim")
        self.name = "sim"
        self.a, self.b, self.interval = a, b, interval
        self._max_concurrency = max_concurrency
        self.active = 0

    @property
    def max_concurrency(self) -> int:
        return self._max_concurrency

    async def _served(self, whole: ScoredTokens) -> AsyncIterator[ScoredTokens]:
        self.active += 1
        try:
            await asyncio.sleep(self.a + self.b * self.active)
            yield whole.slice(0, 1)
            i = 1
            while i < len(whole):
                j = min(i + self.interval, len(whole))
                for _ in range(j - i):
                    await asyncio.sleep(self.a + self.b * self.active)
                yield whole.slice(i, j)
                i = j
        finally:
            self.active -= 1

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        async def one(r: ProposalRequest) -> ScoredTokens:
            (whole,) = await self.inner.generate([r])
            async for _ in self._served(whole):
                pass
            return whole

        return list(await asyncio.gather(*(one(r) for r in requests)))

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        (whole,) = await self.inner.generate([request])
        async for chunk in self._served(whole):
            yield chunk

    async def score(self, requests: Sequence[Any]) -> list[Any]:
        return await self.inner.score(requests)

    async def aclose(self) -> None:
        await self.inner.aclose()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samplers", default="multi_try_mh")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--first-prompt", type=int, default=0)
    p.add_argument("--arms", default="sequential,stream:auto,stream:40")
    p.add_argument("--a", type=float, default=0.006)
    p.add_argument("--b", type=float, default=0.08e-3)
    p.add_argument("--interval", type=int, default=8)
    p.add_argument("--max-concurrency", type=int, default=40)
    p.add_argument("--T", type=int, default=3072)
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--K", type=int, default=10)
    p.add_argument("--eos-median", type=float, default=1024)
    p.add_argument("--tolerance", type=float, default=0.5)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    vocab = 64
    eos = EosHazard.from_median(vocab - 1, args.eos_median, 0.25)
    model = WindowedReferenceModel(vocab, seed=0, eos=eos)
    prompts = make_prompts(args.first_prompt + args.prompts, 16, vocab, 0)
    arms = []
    for a in args.arms.split(","):
        name, _, size = a.partition(":")
        arms.append((a, name, None if size in ("", "auto") else int(size)))
    rows: list[dict[str, Any]] = []
    for sampler in args.samplers.split(","):
        cfg = sampler_config(
            sampler, 4.0, args.T // args.blocks, args.K, blocks=args.blocks, eos_token_id=vocab - 1
        )
        for pi in range(args.first_prompt, args.first_prompt + args.prompts):
            prompt = prompts[pi]
            seed = 1000 * pi
            ref: dict[str, Any] | None = None
            for label, trav, size in arms:
                engine = CurveEngine(model, args.a, args.b, args.interval, args.max_concurrency)
                budget = chain_budget(engine)
                budget.tolerance = args.tolerance
                t0 = time.perf_counter()
                with virtual_time() as run:
                    res = run(
                        run_chain(
                            engine, prompt, cfg, traversal=trav, n_pf=size, seed=seed, budget=budget
                        )
                    )
                real = time.perf_counter() - t0
                s = res.stats
                row: dict[str, Any] = {
                    "sampler": sampler,
                    "prompt": pi,
                    "arm": label,
                    "wall": s.chain_wall_s,
                    "tokens": s.tokens_generated,
                    "blocks": s.blocks_run,
                    "answer": len(res.token_ids),
                    "full": list(res.full_token_ids),
                    "real_s": real,
                }
                if ref is None:
                    ref = row
                row["speedup"] = ref["wall"] / row["wall"]
                row["tok_rel"] = row["tokens"] / ref["tokens"]
                row["replay"] = row["full"] == ref["full"] and row["blocks"] == ref["blocks"]
                rows.append(row)
                print(
                    f"{sampler:13s} p{pi} {label:12s} wall {row['wall']:8.2f} speedup "
                    f"{row['speedup']:5.2f}x tokens {row['tok_rel']:5.2f}x "
                    f"blocks {row['blocks']:2d} answer {row['answer']:5d} "
                    f"replay {row['replay']} (real {real:.0f}s)",
                    flush=True,
                )
    print()
    for sampler in args.samplers.split(","):
        for label, _, _ in arms[1:]:
            mine = [r for r in rows if r["sampler"] == sampler and r["arm"] == label]
            refs = [r for r in rows if r["sampler"] == sampler and r["arm"] == arms[0][0]]
            sp = [r["speedup"] for r in mine]
            pooled = sum(r["wall"] for r in refs) / sum(r["wall"] for r in mine)
            tok = sum(r["tokens"] for r in mine) / sum(r["tokens"] for r in refs)
            print(
                f"{sampler:13s} {label:12s} median {statistics.median(sp):.2f}x "
                f"[{min(sp):.2f}-{max(sp):.2f}] pooled {pooled:.2f}x tokens {tok:.2f}x "
                f"replays {sum(r['replay'] for r in mine)}/{len(mine)}"
            )
    if args.out:
        for r in rows:
            r.pop("full")
        with open(args.out, "w") as fh:
            json.dump(rows, fh)


if __name__ == "__main__":
    main()
