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

Run it (needs ``bash scripts/gateways.sh setup``):
``python -m benchmarks.gateway_routing --chains 16 --steps 8``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.emulation import EmulationServer
from tests.support.gateways import (
    CONSISTENT_HASH,
    ROUTING_KEY_HEADER,
    gateway_binary,
    post_json,
    running_gateway,
)

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
def _workers(dialect: str, n: int) -> Iterator[list[EmulationServer]]:
    servers = [EmulationServer(dialect, max_model_len=4096).start() for _ in range(n)]
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_routing")
    parser.add_argument("--chains", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8, help="requests per chain")
    parser.add_argument("--prefix", type=int, default=64, help="tokens of a chain's first prompt")
    parser.add_argument("--grow", type=int, default=16, help="tokens a chain's prompt gains a step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
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
