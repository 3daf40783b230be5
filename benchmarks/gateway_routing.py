"""Where a real gateway sends a chain's requests, and what that costs the prefix cache.

Chains of requests whose prompts share a per-chain prefix that grows at every step (as a power
sampling chain's does) go through ``smg`` or ``vllm-router`` in front of two emulation servers,
with and without a per-chain routing key, under each gateway's policies. Printed per arm:
requests per replica, chains split over both replicas, and the prefix-cache hit rate (cached
prompt tokens / prompt tokens looked up, the emulation's accounting: vLLM's block cache, or
SGLang's longest-prefix match) next to the same workload against one server alone.

Token ids travel on the route each gateway carries unchanged: vLLM's ``/v1/completions``
through ``vllm-router``, SGLang's ``/generate`` through ``smg`` (``smg`` 1.13 refuses token ids
on ``/v1/completions``; see docs/backends.md).

Two parts, in one run:

* ``requests``: scripted chains of plain HTTP requests, one at a time (the placement each
  policy makes, with nothing else going on);
* ``presto``: presto itself, a job of power-sampling chains (``sequential`` and ``crn`` arms,
  many chains in flight) through the real client path, the engine's ``base_url`` the gateway,
  with and without ``routing_key_header``; a chain is told apart on the workers by its
  prompt's first token.

Run it (needs ``bash scripts/gateways.sh setup``):
``python -m benchmarks.gateway_routing --chains 16 --steps 8 --jobs-chains 32``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from presto_client.orchestration.config.loading import validate_job_config
from presto_client.orchestration.job import run_job_async
from tests.support.emulation import EmulationServer
from tests.support.gateways import (
    CONSISTENT_HASH,
    ROUTING_KEY_HEADER,
    gateway_binary,
    post_json,
    running_gateway,
)
from tests.support.plans import plan_of

ROUTE = {"vllm-router": ("vllm", "/v1/completions"), "smg": ("sglang", "/generate")}
POLICIES = {
    "vllm-router": ("consistent_hash", "cache_aware", "round_robin", "power_of_two"),
    "smg": ("consistent_hashing", "cache_aware", "round_robin", "power_of_two"),
}


@dataclass(frozen=True)
class Arm:
    gateway: str
    policy: str
    keyed: bool
    per_replica: tuple[int, ...]
    split_chains: int
    hit_rate: float


def _prompts(
    chains: int, steps: int, prefix: int, grow: int, seed: int
) -> list[tuple[int, list[int]]]:
    """(chain, prompt) in send order: every chain's step i, in a shuffled order (chains do not
    finish their steps in lockstep; a fixed order would let round robin pin each chain), then
    step i + 1."""
    rng = random.Random(seed)
    full = [[rng.randrange(64) for _ in range(prefix + grow * steps)] for _ in range(chains)]
    out: list[tuple[int, list[int]]] = []
    for s in range(steps):
        order = list(range(chains))
        rng.shuffle(order)
        out.extend((c, full[c][: prefix + grow * s]) for c in order)
    return out


def _body(dialect: str, prompt: list[int]) -> dict[str, Any]:
    if dialect == "vllm":
        return {"model": "reference-64", "prompt": prompt, "max_tokens": 4, "seed": 1}
    return {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4, "sampling_seed": 1}}


@contextmanager
def _workers(dialect: str, n: int, **options: Any) -> Iterator[list[EmulationServer]]:
    servers = [EmulationServer(dialect, max_model_len=4096, **options).start() for _ in range(n)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def _send(
    url: str,
    path: str,
    dialect: str,
    workers: Sequence[EmulationServer],
    prompts: list[tuple[int, list[int]]],
    key_header: str | None,
) -> tuple[tuple[int, ...], int, float]:
    touched: dict[int, set[int]] = {}
    for chain, prompt in prompts:
        headers = {key_header: f"chain-{chain}"} if key_header else {}
        before = [w.stats.requests.get(path, 0) for w in workers]
        status, answer = post_json(url + path, _body(dialect, prompt), headers)
        if status != 200:
            raise RuntimeError(f"HTTP {status} from {url}{path}: {answer}")
        after = [w.stats.requests.get(path, 0) for w in workers]
        touched.setdefault(chain, set()).update(
            j for j, (a, b) in enumerate(zip(after, before, strict=True)) if a > b
        )
    per_replica = tuple(w.stats.requests.get(path, 0) for w in workers)
    queries = sum(w.stats.prefix_queries for w in workers)
    hits = sum(w.stats.prefix_hits for w in workers)
    split = sum(1 for replicas in touched.values() if len(replicas) > 1)
    return per_replica, split, hits / queries if queries else 0.0


def run(chains: int, steps: int, prefix: int, grow: int, seed: int) -> list[Arm]:
    prompts = _prompts(chains, steps, prefix, grow, seed)
    arms: list[Arm] = []
    with tempfile.TemporaryDirectory(prefix="gateway-routing-") as logs:
        for kind in ("vllm-router", "smg"):
            dialect, path = ROUTE[kind]
            with _workers(dialect, 1) as (alone,):
                counts, split, rate = _send(alone.base_url, path, dialect, [alone], prompts, None)
            arms.append(Arm(kind, "(one replica, no gateway)", False, counts, split, rate))
            if gateway_binary(kind) is None:
                raise SystemExit(f"{kind} is not set up: run `bash scripts/gateways.sh setup`")
            for policy in POLICIES[kind]:
                for keyed in (True, False) if policy == CONSISTENT_HASH[kind] else (False,):
                    with (
                        _workers(dialect, 2) as workers,
                        running_gateway(
                            kind, policy, [w.base_url for w in workers], log_dir=Path(logs)
                        ) as gateway,
                    ):
                        header = ROUTING_KEY_HEADER[kind] if keyed else None
                        counts, split, rate = _send(
                            gateway.base_url, path, dialect, workers, prompts, header
                        )
                    arms.append(Arm(kind, policy, keyed, counts, split, rate))
    return arms


# ---- presto itself through the gateways

JOB_KIND = {"vllm-router": "vllm", "smg": "sglang"}
"""The engine kind whose route each gateway carries (its workers' dialect)."""
JOB_VOCAB = 512
FIRST = 256
"""A job's chain i has a prompt starting with token FIRST + i (the probe's starts with 1)."""
JOB_POLICIES = {
    "vllm-router": ("consistent_hash", "cache_aware", "round_robin"),
    "smg": ("consistent_hashing", "cache_aware", "round_robin"),
}


@dataclass(frozen=True)
class JobArm:
    gateway: str
    policy: str
    keyed: bool
    per_replica: tuple[int, ...]
    split_chains: int
    hit_rate: float
    wall_s: float


@dataclass(frozen=True)
class JobShape:
    chains: int
    prefix: int
    block_size: int
    num_blocks: int
    concurrency: int
    seed: int

    def prompts(self) -> list[list[int]]:
        rng = random.Random(self.seed)
        return [
            [FIRST + i, *(rng.randrange(FIRST) for _ in range(self.prefix - 1))]
            for i in range(self.chains)
        ]


def _job(shape: JobShape, kind: str, url: str, header: str | None, out: Path) -> Any:
    return validate_job_config(
        {
            "name": "gateway-routing",
            "engines": [
                {
                    "kind": kind,
                    "name": "gw",
                    "base_url": url,
                    "vocab_size": JOB_VOCAB,
                    "max_concurrency": shape.concurrency,
                    "routing_key_header": header,
                }
            ],
            "prompts": {"token_ids": shape.prompts()},
            "sampler": {
                "alpha": 4.0,
                "block_size": shape.block_size,
                "num_blocks": shape.num_blocks,
                "steps_per_block": 4,
                "traversals": ["sequential", "crn"],
                "n_pf": 4,
            },
            "chains_per_prompt": 1,
            "seed": shape.seed,
            "output_dir": str(out),
            "max_concurrency": shape.concurrency,
        }
    )


def _run_job(
    shape: JobShape, kind: str, url: str, header: str | None, workers: Sequence[EmulationServer]
) -> tuple[tuple[int, ...], int, float, float]:
    """One presto job through ``url``; per-replica chain requests, chains split, hit rate."""
    with tempfile.TemporaryDirectory(prefix="gateway-job-") as out:
        cfg = _job(shape, kind, url, header, Path(out) / "run")
        start = time.perf_counter()
        result = asyncio.run(run_job_async(plan_of(cfg)))
        wall = time.perf_counter() - start
    if result.failed:
        raise RuntimeError(f"{result.failed} chain(s) failed through {url}")
    field = "prompt" if kind == "vllm" else "input_ids"
    per_replica: list[int] = []
    touched: dict[int, set[int]] = {}
    for j, w in enumerate(workers):
        mine = [p[field] for p in w.stats.payloads if isinstance(p.get(field), list)]
        mine = [ids for ids in mine if ids and FIRST <= ids[0] < FIRST + shape.chains]
        per_replica.append(len(mine))
        for ids in mine:
            touched.setdefault(ids[0] - FIRST, set()).add(j)
    queries = sum(w.stats.prefix_queries for w in workers)
    hits = sum(w.stats.prefix_hits for w in workers)
    split = sum(1 for replicas in touched.values() if len(replicas) > 1)
    return tuple(per_replica), split, hits / queries if queries else 0.0, wall


def run_jobs(
    shape: JobShape,
    gateways: Sequence[str] = ("vllm-router", "smg"),
    policies: dict[str, tuple[str, ...]] | None = None,
) -> list[JobArm]:
    """presto jobs: one replica alone, then each gateway's policies (the key-reading one with
    and without ``routing_key_header``), each arm on fresh workers."""
    arms: list[JobArm] = []
    with tempfile.TemporaryDirectory(prefix="gateway-routing-") as logs:
        for kind in gateways:
            dialect = JOB_KIND[kind]
            # exact scoring where an interval cannot settle a decision (vLLM: --max-logprobs
            # -1), and seeds honoured (SGLang: deterministic inference), as a real job asks
            options: dict[str, Any] = {"vocab_size": JOB_VOCAB}
            options.update({"max_logprobs": -1} if dialect == "vllm" else {"deterministic": True})
            with _workers(dialect, 1, **options) as (alone,):
                counts, split, rate, wall = _run_job(shape, dialect, alone.base_url, None, [alone])
            arms.append(JobArm(kind, "(one replica, no gateway)", False, counts, 0, rate, wall))
            if gateway_binary(kind) is None:
                raise SystemExit(f"{kind} is not set up: run `bash scripts/gateways.sh setup`")
            for policy in (policies or JOB_POLICIES)[kind]:
                for keyed in (True, False) if policy == CONSISTENT_HASH[kind] else (False,):
                    with (
                        _workers(dialect, 2, **options) as workers,
                        running_gateway(
                            kind, policy, [w.base_url for w in workers], log_dir=Path(logs)
                        ) as gateway,
                    ):
                        header = ROUTING_KEY_HEADER[kind] if keyed else None
                        counts, split, rate, wall = _run_job(
                            shape, dialect, gateway.base_url, header, workers
                        )
                    arms.append(JobArm(kind, policy, keyed, counts, split, rate, wall))
    return arms


def _print_jobs(shape: JobShape, arms: Sequence[JobArm]) -> None:
    print(
        f"presto jobs: {shape.chains} chains x arms sequential+crn, prompts {shape.prefix} "
        f"tokens, {shape.num_blocks} blocks of {shape.block_size}, {shape.concurrency} "
        "requests in flight, two emulation replicas"
    )
    print(
        f"{'gateway':<12} {'policy':<27} {'key':<4} {'per replica':<12} {'split':>5} "
        f"{'hit':>6} {'wall':>7}"
    )
    for arm in arms:
        replicas = "/".join(str(n) for n in arm.per_replica)
        print(
            f"{arm.gateway:<12} {arm.policy:<27} {'yes' if arm.keyed else 'no':<4} "
            f"{replicas:<12} {arm.split_chains:>5} {arm.hit_rate:>6.1%} {arm.wall_s:>6.1f}s"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_routing")
    parser.add_argument("--chains", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8, help="requests per chain")
    parser.add_argument("--prefix", type=int, default=64, help="tokens of a chain's first prompt")
    parser.add_argument("--grow", type=int, default=16, help="tokens a chain's prompt gains a step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--part", choices=("requests", "presto", "both"), default="both", help="what to run"
    )
    parser.add_argument("--jobs-chains", type=int, default=32, help="chains of a presto job")
    parser.add_argument("--jobs-prefix", type=int, default=64, help="prompt tokens of a chain")
    parser.add_argument("--jobs-block", type=int, default=16, help="sampler.block_size")
    parser.add_argument("--jobs-blocks", type=int, default=4, help="sampler.num_blocks")
    parser.add_argument("--jobs-concurrency", type=int, default=16, help="requests in flight")
    args = parser.parse_args(argv)
    # The probe's warning that a gateway gets no routing key is what the unkeyed arms measure.
    logging.basicConfig(level=logging.ERROR)
    if args.part in ("presto", "both"):
        shape = JobShape(
            args.jobs_chains,
            args.jobs_prefix,
            args.jobs_block,
            args.jobs_blocks,
            args.jobs_concurrency,
            args.seed,
        )
        _print_jobs(shape, run_jobs(shape))
    if args.part == "presto":
        return
    arms = run(args.chains, args.steps, args.prefix, args.grow, args.seed)
    print(
        f"{args.chains} chains x {args.steps} requests, prompts {args.prefix} tokens + "
        f"{args.grow} a step, two emulation replicas"
    )
    print(f"{'gateway':<12} {'policy':<27} {'key':<4} {'per replica':<12} {'split':>5} {'hit':>6}")
    for arm in arms:
        replicas = "/".join(str(n) for n in arm.per_replica)
        print(
            f"{arm.gateway:<12} {arm.policy:<27} {'yes' if arm.keyed else 'no':<4} "
            f"{replicas:<12} {arm.split_chains:>5} {arm.hit_rate:>6.1%}"
        )


if __name__ == "__main__":
    main()
