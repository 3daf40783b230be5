"""How a job's bounds are shared by the workers of a sharded executor, and which chains each runs.

Every bound of a job (the job's ``max_concurrency`` and ``max_active_chains``, each engine's
``max_concurrency`` and each replica's speculation capacity) is split over the ``N`` workers by
a floor split with the remainder to the first workers: ``total // N`` each, plus one for the
first ``total % N``. The shares add up to the bound, so ``N`` workers never have more requests
in flight to an engine than its ``max_concurrency``, nor more speculative sequences on a replica
than one process would; a bound smaller than ``N`` is refused (a worker with no slot could run
nothing). Chains are dealt round robin in plan order (chain ``i`` to worker ``i mod N``), so
every worker gets the same mix of prompts and arms; a chain's replica is still chosen from its
replica key (:meth:`~presto_client.orchestration.executors.orchestrator.EnginePool.replica_for`),
the same in every worker, so a chain lands on the replica it would use in one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from presto_client.errors import ConfigError

T = TypeVar("T")


def split(total: int, parts: int, *, what: str = "a bound") -> list[int]:
    """``total`` over ``parts`` workers: floor split, the remainder to the first ones."""
    if parts < 1:
        raise ConfigError(f"executor.workers must be at least 1 (got {parts})")
    if total < parts:
        raise ConfigError(
            f"executor.workers = {parts} exceeds {what} = {total}: each worker needs at least "
            f"one slot of it; use at most {total} workers or raise {what}"
        )
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@dataclass(frozen=True, slots=True)
class WorkerShare:
    """One worker's part of the job's bounds."""

    index: int
    max_concurrency: int
    max_active_chains: int | None
    engine_slots: Mapping[str, int]
    """Its share of each engine's ``max_concurrency`` (all replicas together)."""
    budget_capacity: Mapping[str, int]
    """Its share of the speculation capacity of each replica of each engine."""


def worker_shares(
    workers: int,
    *,
    max_concurrency: int,
    max_active_chains: int | None,
    engine_concurrency: Mapping[str, int],
) -> list[WorkerShare]:
    """The share of each of ``workers`` workers; a replica's speculation capacity is the bound
    its requests run under in one process (``min(engine, job)``, as
    :meth:`~presto_client.orchestration.engines.opening.OpenedEngine.of` sizes it)."""
    job = split(max_concurrency, workers, what="max_concurrency")
    active = (
        split(max_active_chains, workers, what="max_active_chains")
        if max_active_chains is not None
        else None
    )
    engines = {
        n: split(c, workers, what=f"engine {n}'s max_concurrency")
        for n, c in engine_concurrency.items()
    }
    budgets = {
        n: split(min(c, max_concurrency), workers, what=f"engine {n}'s max_concurrency")
        for n, c in engine_concurrency.items()
    }
    return [
        WorkerShare(
            index=i,
            max_concurrency=job[i],
            max_active_chains=active[i] if active is not None else None,
            engine_slots={n: s[i] for n, s in engines.items()},
            budget_capacity={n: s[i] for n, s in budgets.items()},
        )
        for i in range(workers)
    ]


def deal(items: Sequence[T], workers: Sequence[int]) -> dict[int, list[T]]:
    """``items`` dealt round robin in order over the worker indices ``workers``."""
    if not workers:
        raise ValueError("no worker to deal to")
    out: dict[int, list[T]] = {w: [] for w in workers}
    for i, item in enumerate(items):
        out[workers[i % len(workers)]].append(item)
    return out
