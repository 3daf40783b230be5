"""The demo's speculation decisions on a simulated engine, in virtual time.

How much the demo speculates is decided by the engine's shared speculation budget from the
timings the engine shows (its cost fit, :mod:`presto_client.core.speculation`). On the embedded
CPU engine those timings move with the machine's load, so two runs of ``presto run
configs/demo.yaml`` differ even on the same code, and a difference between two checkouts says
little by itself. Here the engine's cost is a fixed curve and the clock is virtual: a decode step
with ``n`` sequences in flight costs ``a + b·n`` seconds per token after a first-token latency,
and the event loop's clock (and ``time.perf_counter``, which the runners read) jumps straight to
the next timer. The decisions are then a function of the code alone: two checkouts that feed and
consult the budget alike print the same requests issued per arm and the same digest of every
round (requests, used, wall time).

``python benchmarks/budget_replay.py`` runs the demo's arms and sampler settings
(``configs/demo.yaml``, the engine replaced by the reference model behind the curve) on three
curves. Run it from another checkout's root with ``PYTHONPATH=.`` to compare that checkout's
decisions with this one's: it uses only the job API (``validate_job_config``, ``make_plan``,
``run_job_async``), which earlier releases have too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import selectors
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens, ScoreRequest
from presto_client.core.reference import ReferenceEngine, ReferenceModel
from presto_client.orchestration.config.loading import validate_job_config
from presto_client.orchestration.job import run_job_async
from presto_client.orchestration.planning.plan import make_plan
from presto_client.orchestration.prompts.prompt_rows import load_prompts

DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
PROMPTS = ([1, 2, 3], [1, 2, 4], [1, 2, 5])
"""One prompt per text of the demo (token ids of the reference model)."""
VOCAB_SIZE = 64
CURVES: dict[str, tuple[float, float, float]] = {
    "flat": (0.006, 0.0005, 0.01),
    "mixed": (0.003, 0.003, 0.02),
    "compute-bound": (0.05, 0.02, 0.1),
    "cpu": (0.005, 0.05, 0.1),
}
"""Named cost curves: ``(a, b, first-token latency)`` in seconds. ``cpu`` is the embedded engine's
bound on two cores: a batch of ``n`` sequences costs about ``n`` times one."""


class VirtualClock:
    """A clock that advances only when the event loop would otherwise wait."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class _VirtualSelector(selectors.DefaultSelector):
    """Waits for nothing: a timed wait moves the clock to its deadline at once."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:  # no timer pending: only real I/O (a thread's wake-up) can come
            return super().select(None)
        self._clock.now += max(timeout, 0.0)
        return []


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_VirtualSelector(clock))
        self._clock = clock

    def time(self) -> float:
        return self._clock()


@contextlib.contextmanager
def virtual_time() -> Iterator[Callable[[Any], Any]]:
    """``run(coroutine)`` on an event loop in virtual time; ``time.perf_counter`` and
    ``time.monotonic`` read the same clock meanwhile (the runners time their calls with them)."""
    clock = VirtualClock()
    saved = time.perf_counter, time.monotonic
    loop = _VirtualLoop(clock)
    time.perf_counter = time.monotonic = clock
    try:
        yield loop.run_until_complete
    finally:
        time.perf_counter, time.monotonic = saved
        loop.close()


class CostCurveEngine:
    """The reference model served at a fixed cost: every token of a request takes
    ``a + b·n`` seconds with ``n`` sequences in flight, after a first-token latency ``first``;
    the first token comes alone, the rest in chunks of ``interval`` tokens (a server's stream
    interval). ``model``/``top_k``: the reference model served and its top-K (the defaults:
    this demo's)."""

    def __init__(
        self,
        a: float,
        b: float,
        first: float,
        *,
        name: str,
        max_concurrency: int,
        model: ReferenceModel | None = None,
        top_k: int | None = None,
        interval: int = 1,
    ) -> None:
        model = ReferenceModel(VOCAB_SIZE, seed=5) if model is None else model
        self.inner = ReferenceEngine(model, top_k=top_k, name=name)
        self.name = name
        self.a, self.b, self.first, self.interval = a, b, first, interval
        self._max_concurrency = max_concurrency
        self.active = 0

    @property
    def max_concurrency(self) -> int:
        return self._max_concurrency

    async def _served(self, whole: ScoredTokens) -> AsyncIterator[ScoredTokens]:
        self.active += 1
        try:
            await asyncio.sleep(self.first)
            i, j = 0, 1
            while i < len(whole):
                for _ in range(j - i):
                    await asyncio.sleep(self.a + self.b * self.active)
                yield whole.slice(i, j)
                i, j = j, min(j + self.interval, len(whole))
        finally:
            self.active -= 1

    async def _one(self, request: ProposalRequest) -> ScoredTokens:
        (whole,) = await self.inner.generate([request])
        async for _ in self._served(whole):
            pass
        return whole

    async def generate(self, requests: Sequence[ProposalRequest]) -> list[ScoredTokens]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def stream(self, request: ProposalRequest) -> AsyncIterator[ScoredTokens]:
        (whole,) = await self.inner.generate([request])
        async for chunk in self._served(whole):
            yield chunk

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoredTokens]:
        return await self.inner.score(requests)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass(frozen=True, slots=True)
class ReplayFigures:
    curve: str
    issued: dict[str, int]
    """Requests issued per arm (its traversal)."""
    digest: str
    """Of every round record in run order: chain, kind, requests, used, wall time."""
    wall: dict[str, float]
    """Virtual end-to-end seconds per arm: its chains' ``chain_wall_s``, summed."""
    speedup_wall: dict[str, float]
    """Per arm, the summary's median end-to-end speedup over the sequential chain."""


def demo_job(output_dir: Path, seed: int | None = None) -> dict[str, Any]:
    """The demo's config with its engine replaced by a reference engine of the same bound
    (``seed``: the job's seed instead of the demo's)."""
    data = yaml.safe_load(DEMO_CONFIG.read_text())
    if seed is not None:
        data["seed"] = seed
    (engine,) = validate_job_config(data, source=str(DEMO_CONFIG)).engines  # (its bound resolved)
    data["engines"] = [
        {
            "kind": "reference",
            "name": engine.name,
            "vocab_size": VOCAB_SIZE,
            "max_concurrency": engine.max_concurrency,
        }
    ]
    data["prompts"] = {"token_ids": [list(p) for p in PROMPTS]}
    data["output_dir"] = str(output_dir)
    return data


async def _replay(
    curve: str, a: float, b: float, first: float, output_dir: Path, seed: int | None
) -> ReplayFigures:
    cfg = validate_job_config(demo_job(output_dir, seed))
    (engine,) = cfg.engines
    name = str(engine.name)
    served = CostCurveEngine(a, b, first, name=name, max_concurrency=engine.max_concurrency)
    plan = make_plan(cfg, prompts=load_prompts(cfg))
    result = await run_job_async(plan, engine_overrides={name: [served]}, probe=False)
    issued: dict[str, int] = {}
    digest = hashlib.sha256()
    for line in (output_dir / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        digest.update(
            repr(
                (r["chain_id"], r["kind"], r["requests"], r["used"], round(r["wall_s"], 9))
            ).encode()
        )
        if r["kind"] != "extend":
            issued[r["traversal"]] = issued.get(r["traversal"], 0) + int(r["requests"])
    wall: dict[str, float] = {}
    speedup_wall: dict[str, float] = {}
    for arm in result.summary["arms"]:
        wall[arm["traversal"]] = float(arm["chain_wall_s"])
        if arm["speedup_wall_median"] is not None:
            speedup_wall[arm["traversal"]] = float(arm["speedup_wall_median"])
    return ReplayFigures(curve, issued, digest.hexdigest()[:12], wall, speedup_wall)


def replay(
    curve: str, a: float, b: float, first: float, *, seed: int | None = None
) -> ReplayFigures:
    """The demo's job on the cost curve ``(a, b, first)``, in virtual time."""
    with tempfile.TemporaryDirectory() as tmp, virtual_time() as run:
        figures: ReplayFigures = run(_replay(curve, a, b, first, Path(tmp) / "run", seed))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curve", choices=sorted(CURVES), action="append")
    args = parser.parse_args(argv)
    for curve in args.curve or list(CURVES):
        f = replay(curve, *CURVES[curve])
        arms = "  ".join(f"{t} {n}" for t, n in f.issued.items())
        print(f"{curve:14s} issued: {arms}  digest {f.digest}")
        walls = "  ".join(
            f"{t} {w:.2f}s ({f.speedup_wall.get(t, 1.0):.2f}x)" for t, w in f.wall.items()
        )
        print(f"{'':14s} end to end: {walls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
