"""Transitions per engine call of each traversal rule, on the exact reference model.

``python -m benchmarks.tree_bench`` prints, for every sampler and traversal rule, the mean
number of MH transitions completed per engine call (the quantity PreSTO raises; the sequential
sampler's is 1 by construction), requests per call, wasted requests and the acceptance rate.
It counts calls, not seconds, so it is deterministic and needs no server.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass

from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.core.runners import run_chain
from presto_client.core.sampler_config import SAMPLERS, SamplerConfig


@dataclass(frozen=True, slots=True)
class TraversalFigures:
    sampler: str
    traversal: str
    transitions_per_call: float
    requests_per_call: float
    wasted_share: float
    acceptance_rate: float


async def measure(
    sampler: str,
    traversal: str,
    *,
    n_pf: int,
    steps: int,
    block_size: int,
    chains: int,
    vocab_size: int,
    seed: int,
) -> TraversalFigures:
    model = ReferenceModel(vocab_size, seed=seed)
    config = SamplerConfig(sampler=sampler, block_size=block_size, steps_per_block=steps)  # type: ignore[arg-type]
    transitions = rounds = issued = used = accepts = 0
    for chain in range(chains):
        engine = ReferenceEngine(model)
        result = await run_chain(
            engine,
            [chain % vocab_size],
            config,
            traversal=traversal,
            size=n_pf,
            seed=seed * 100_003 + chain,
        )
        s = result.stats
        transitions += s.transitions
        rounds += s.rounds
        issued += s.requests_issued
        used += s.requests_used
        accepts += s.accepts
    return TraversalFigures(
        sampler,
        traversal,
        transitions / rounds,
        issued / rounds,
        1 - used / issued,
        accepts / transitions,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tree_bench",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--n-pf", type=int, default=8, help="prefetch budget per round")
    parser.add_argument("--steps", type=int, default=32, help="K: transitions per block")
    parser.add_argument("--block-size", type=int, default=32, help="response length T")
    parser.add_argument("--chains", type=int, default=50, help="chains per cell")
    parser.add_argument("--vocab-size", type=int, default=8, help="reference model vocabulary")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for sampler in SAMPLERS:
        for traversal in ("bfs", "predictive", "crn"):
            rows.append(
                asyncio.run(
                    measure(
                        sampler,
                        traversal,
                        n_pf=args.n_pf,
                        steps=args.steps,
                        block_size=args.block_size,
                        chains=args.chains,
                        vocab_size=args.vocab_size,
                        seed=args.seed,
                    )
                )
            )
    print(
        f"reference model V={args.vocab_size}, T={args.block_size}, K={args.steps}, "
        f"N_pf={args.n_pf}, {args.chains} chains per cell (sequential = 1.00 by construction)"
    )
    print("| sampler | traversal | transitions/call | requests/call | wasted | acceptance |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.sampler} | {r.traversal} | {r.transitions_per_call:.2f} | "
            f"{r.requests_per_call:.2f} | {r.wasted_share:.0%} | {r.acceptance_rate:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
