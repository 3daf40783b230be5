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
import json
import statistics
import time
from typing import Any

from benchmarks.bench_stream import make_prompts, sampler_config
from benchmarks.budget_replay import CostCurveEngine, virtual_time
from benchmarks.fast_model import EosHazard, WindowedReferenceModel
from presto_client.core.runners import chain_budget, run_chain


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
                # the first token after one step, then chunks of --interval tokens
                engine = CostCurveEngine(
                    args.a,
                    args.b,
                    0.0,
                    name="sim",
                    max_concurrency=args.max_concurrency,
                    model=model,
                    top_k=20,
                    interval=args.interval,
                )
                budget = chain_budget(engine)
                budget.tolerance = args.tolerance
                t0 = time.perf_counter()
                with virtual_time() as run:
                    res = run(
                        run_chain(
                            engine, prompt, cfg, traversal=trav, size=size, seed=seed, budget=budget
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
