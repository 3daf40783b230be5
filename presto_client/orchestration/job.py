"""A planned job, run (or resumed) into its run directory, then summarised.

The faces layer (the CLI, or a Python caller) hands a validated job config and its prompts to
:func:`~presto_client.orchestration.planning.plan.make_plan` and the plan (plain frozen data,
:mod:`~presto_client.orchestration.planned`) to :func:`run_job` (blocking) or
:func:`run_job_async`; nothing here sees the config's models. The engines are opened by
:mod:`presto_client.orchestration.engines.opening`, the chains run by the
:class:`~presto_client.orchestration.executors.orchestrator.Orchestrator`, every round and finished
chain written by :class:`RunDirSink`, and the summary by
:mod:`presto_client.orchestration.results.summary`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from presto_client.child_servers.lifecycle import ChildServer
from presto_client.concurrency import LoopLag, fewer_gc_passes
from presto_client.core.engine_protocol import Engine
from presto_client.core.settings import SamplerConfig
from presto_client.core.stats import RoundRecord, TransitionRecord
from presto_client.errors import ConfigError
from presto_client.orchestration.engines.eos_discovery import (
    EOS_IDENTITY_KEY,
    check_eos_ids,
    resolve_eos_token_ids,
    vocab_of,
)
from presto_client.orchestration.engines.opening import (
    METRICS_TIMEOUT_S,
    METRICS_TIMEOUT_STOPPING_S,
    OpenedEngine,
    check_lengths,
    engine_identities,
    open_engines,
    probe_drift,
    read_prefix_cache_counters,
    start_embedded_servers,
)
from presto_client.orchestration.engines.server_watch import ServerFailedError, ServerWatch
from presto_client.orchestration.engines.vocab_discovery import (
    VOCAB_IDENTITY_KEY,
    check_prompt_vocab,
    resolve_vocab_sizes,
)
from presto_client.orchestration.executors.executor import ChainExecutor, open_executor
from presto_client.orchestration.executors.orchestrator import (
    ChainOutcome,
    ChainSink,
    ChainSpec,
    EnginePool,
    JobFailedError,
    OrchestratorResult,
)
from presto_client.orchestration.planned import JobPlan, PlannedChain, routing_key
from presto_client.orchestration.prompts.prompt_tokens import decode, encode, encode_messages
from presto_client.orchestration.results.quality import (
    ChainGrader,
    answers_of,
    graded_answer_first,
    make_chain_grader,
)
from presto_client.orchestration.results.summary import prefix_cache_delta, summarize, summary_rows
from presto_client.orchestration.run_dir.rundir import ENGINE_IDENTITY, RunDir, check_output_dir

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


def transition_row(t: TransitionRecord) -> list[Any]:
    """A transition as ``samples.jsonl`` holds it: ``[block, k, cut, accepted, log_accept,
    rejection_bound]``; ``log_accept`` is null for an early rejection (never computed) and
    ``rejection_bound`` (the bound that proved it) is null for every other decision."""
    return [
        t.block,
        t.k,
        t.cut,
        int(t.accepted),
        None if t.early else round(float(t.log_accept), 6),
        round(float(t.rejection_bound), 6) if t.early else None,
    ]


class RunDirSink:
    """Writes rounds and finished chains to the run directory as they complete."""

    def __init__(self, run: RunDir, sampler_name: str, grader: ChainGrader | None = None) -> None:
        self.run = run
        self.sampler_name = sampler_name
        self.grader = grader
        self.started = time.time()
        self._grading: set[asyncio.Task[None]] = set()
        """Finished chains being graded (written once graded: :meth:`drain` waits for them)."""

    def chain_started(self, spec: ChainSpec, replica: int) -> None:
        return None

    def round_done(self, spec: ChainSpec, record: RoundRecord, queue_s: float) -> None:
        self.round_done_at(spec, record, queue_s, time.time())

    def round_done_at(
        self, spec: ChainSpec, record: RoundRecord, queue_s: float, at: float
    ) -> None:
        """A round that ran at epoch time ``at`` (a Ray worker's, reported when its chain
        finished)."""
        self.run.append_record(
            {
                "chain_id": spec.chain_id,
                "arm": spec.arm,
                "engine": spec.engine,
                "traversal": spec.traversal,
                "prompt_index": spec.prompt_index,
                "chain_index": spec.chain_index,
                **record.as_dict(),
                "queue_s": queue_s,
                "t": round(at - self.started, 6),
            }
        )

    def chain_done(self, outcome: ChainOutcome) -> None:
        spec = outcome.spec
        row: dict[str, Any] = {
            "chain_id": spec.chain_id,
            "arm": spec.arm,
            "engine": spec.engine,
            "sampler": self.sampler_name,
            "traversal": spec.traversal,
            "size": spec.size,
            "prompt_index": spec.prompt_index,
            "chain_index": spec.chain_index,
            "seed": spec.seed,
            "replica": outcome.replica,
            "status": "ok" if outcome.ok else "failed",
            "error": outcome.error,
            "prompt_len": len(spec.prompt_ids),
            "wall_s": outcome.wall_s,
            "queue_s": outcome.queue_s,
            "session": self.run.session,
        }
        result = outcome.result
        if result is not None:
            row["token_ids"] = list(result.token_ids)
            row["text"] = outcome.text
            if result.alternatives:
                row["alternatives"] = [list(ids) for ids in result.alternatives]
                row["alternative_texts"] = outcome.alternative_texts
            row["stats"] = result.stats.as_dict()
            row["transitions"] = [transition_row(t) for t in result.transitions]
            if self.grader is not None:  # (graded off the loop, then written)
                task = asyncio.get_running_loop().create_task(self._graded(outcome, row))
                self._grading.add(task)
                task.add_done_callback(self._grading.discard)
                return
        self.run.append_sample(row)

    async def _graded(self, outcome: ChainOutcome, row: dict[str, Any]) -> None:
        result = outcome.result
        assert self.grader is not None and result is not None
        grade = await self.grader.grade(
            outcome.spec.prompt_index,
            outcome.text,
            result.token_ids,
            alternatives=answers_of(result.alternatives, outcome.alternative_texts),
        )
        if grade is not None:
            row["grade"] = grade
            graded_answer_first(row)
        self.run.append_sample(row)

    async def drain(self) -> None:
        """Wait for the chains being graded to be written (each within the grader's limit)."""
        while self._grading:
            await asyncio.gather(*self._grading)


@dataclass(slots=True)
class JobResult:
    plan: JobPlan
    run_dir: Path
    summary: dict[str, Any]
    planned: int
    skipped: int
    completed: int
    failed: int
    wall_s: float
    workers: list[dict[str, Any]] = field(default_factory=list)
    """Each Ray worker's process: node, pid, chains, CPU seconds, peak RSS (executor ray)."""
    client: dict[str, Any] = field(default_factory=dict)
    """This process: its event loop's lag and peak memory (:meth:`LoopLag.report`)."""


async def _tokenized_prompts(
    plan: JobPlan, engines: Mapping[str, OpenedEngine]
) -> dict[str, list[tuple[int, ...]]]:
    """Prompt ids per engine (text prompts are tokenized by each engine's own tokenizer)."""
    settings = plan.settings
    out: dict[str, list[tuple[int, ...]]] = {}
    for name, handle in engines.items():
        ids: list[tuple[int, ...]] = []
        for p in plan.prompts:
            if p.token_ids is not None:
                ids.append(p.token_ids)
            elif p.messages is not None:
                ids.append(await encode_messages(handle.replicas[0], p.messages))
            else:
                assert p.text is not None
                ids.append(
                    await encode(
                        handle.replicas[0],
                        p.text,
                        chat_template=settings.chat_template,
                        system_prompt=settings.system_prompt,
                    )
                )
        out[name] = ids
    return out


async def _discovered_eos(
    plan: JobPlan, run: RunDir, engines: Mapping[str, OpenedEngine]
) -> dict[str, int | None]:
    """The EOS of each opened text engine whose config gives none while the stop rule is on:
    the one ``run.json`` recorded where chains already finished on it (none recorded: none),
    else the server's chat template's (:mod:`.engines.eos_discovery`)."""
    wanted = [
        name
        for name, handle in engines.items()
        if handle.takes_text
        and handle.replicas
        and plan.engines[name].eos_token_id is None
        and plan.samplers[name].stop_at_eos
    ]
    if not wanted:
        return {}
    stored = run.run_info().get(ENGINE_IDENTITY, {})
    ran = {str(row.get("engine")) for row in run.finished.values()}
    recorded = {
        name: (stored.get(name) or {}).get(EOS_IDENTITY_KEY) for name in wanted if name in ran
    }
    return await resolve_eos_token_ids(
        wanted, {n: engines[n].replicas[0] for n in wanted}, recorded
    )


def _with_eos(sampler: SamplerConfig, eos: int | None) -> SamplerConfig:
    """``sampler`` with the engine's discovered EOS (the config's, where it gives one, wins)."""
    if eos is None or sampler.eos_token_id is not None:
        return sampler
    return dataclasses.replace(sampler, eos_token_id=eos)


def write_summary(run: RunDir, plan: JobPlan) -> dict[str, Any]:
    summary = summarize(
        run.samples(),
        run.metrics(),
        job=plan.settings.name,
        engine_order=list(plan.engines),
        compare_to=plan.settings.compare_to,
    )
    run.write_summary(summary, summary_rows(summary))
    return summary


async def run_job_async(
    plan: JobPlan,
    *,
    embedded_urls: Mapping[str, str] | None = None,
    engine_overrides: Mapping[str, Sequence[Engine]] | None = None,
    sinks: Sequence[ChainSink] = (),
    probe: bool = True,
    on_start: Any = None,
    servers: Mapping[str, ChildServer] | None = None,
) -> JobResult:
    """Run (or resume) a planned job into its run directory.

    ``engine_overrides`` replaces engines by name with ready-made replicas (tests, Python
    callers). ``on_start(total, finished)`` is called once the run directory is open.
    ``servers`` (engine name → the server presto started for it) are watched: one gone for
    good stops the job at once with :class:`JobFailedError` naming its cause and log.
    Cancellation stops every chain and is re-raised, with the summary of what finished written.
    """
    start = time.perf_counter()
    started: list[Any] = []
    async with contextlib.AsyncExitStack() as executors:
        lag = await executors.enter_async_context(LoopLag())
        executor = await open_executor(
            plan,
            executors,
            # (a peek at the run directory only where workers must be told what to open)
            engines=pending_engines(plan) if plan.settings.executor.kind != "local" else (),
            embedded_urls=embedded_urls or {},
            probe=probe,
            overridden=bool(engine_overrides),
            started=started,
        )
        run = RunDir(plan.output_dir)
        finished = run.open(
            fingerprint=plan.fingerprint,
            resolved_config=plan.settings.resolved_config,
            chains=[c.as_dict() for c in plan.chains],
        )
        todo = [c for c in plan.chains if c.chain_id not in finished]
        skipped = len(plan.chains) - len(todo)
        if on_start is not None:
            on_start(len(plan.chains), skipped)
        result = OrchestratorResult()
        completed_ok = not todo
        try:
            if not todo:
                logger.info("all %d chain(s) already finished in %s", len(plan.chains), run.path)
            else:
                async with ServerWatch(servers) as watch:
                    # (a dead server would otherwise be retried for the engine's restart
                    # window, then fail the chains without naming why)
                    result = await watch.race(
                        _run_chains(
                            plan, run, todo, embedded_urls, engine_overrides, sinks, probe, executor
                        )
                    )
                completed_ok = True
        except ServerFailedError as exc:
            raise JobFailedError(f"{exc}\n{_resume_note(run)}") from None
        finally:
            run.close(completed=completed_ok)
            # (a fresh run that never wrote anything is removed at close: no summary of
            # nothing; after a failed write, the summary is left to the rerun)
            summary = {} if run.removed or run.write_error else write_summary(run, plan)
    return JobResult(
        plan=plan,
        run_dir=run.path,
        summary=summary,
        planned=len(plan.chains),
        skipped=skipped,
        completed=len(result.completed),
        failed=len(result.failed),
        wall_s=time.perf_counter() - start,
        workers=[w for ex in started for w in ex.worker_stats],
        client=_client_report(lag),
    )


def _client_report(lag: LoopLag) -> dict[str, Any]:
    report = lag.report()
    logger.info(
        "client: event-loop lag p99 %.1f ms, max %.1f ms; peak memory %.0f MB",
        report["loop_lag_p99_ms"],
        report["loop_lag_max_ms"],
        report["peak_rss_mb"],
    )
    return report


def _resume_note(run: RunDir) -> str:
    return (
        f"Finished chains are saved in {run.path}; fix the cause and rerun the same command "
        "to resume (finished chains are skipped, failed ones retried)."
    )


async def _run_chains(
    plan: JobPlan,
    run: RunDir,
    todo: Sequence[PlannedChain],
    embedded_urls: Mapping[str, str] | None,
    engine_overrides: Mapping[str, Sequence[Engine]] | None,
    sinks: Sequence[ChainSink],
    probe: bool,
    executor: ChainExecutor,
) -> OrchestratorResult:
    settings = plan.settings
    async with contextlib.AsyncExitStack() as stack:
        engines = await _open_used_engines(
            plan, stack, todo, embedded_urls, engine_overrides, probe
        )
        discovered, vocab = await _settle_identities(plan, run, engines)
        check_lengths(plan, engines)  # before tokenizing: a clear error early
        prompt_ids = await _tokenized_prompts(plan, engines)
        check_lengths(plan, engines, prompt_ids)
        check_prompt_vocab(prompt_ids, vocab)
        specs = _chain_specs(plan, todo, prompt_ids, discovered)
        try:
            grader = make_chain_grader(settings.grader, {p.index: p.answer for p in plan.prompts})
        except ValueError as exc:
            raise ConfigError(f"grader: {exc}") from None
        for name, handle in engines.items():  # (the summary reads it: replay not expected)
            if (drift := probe_drift(handle)) is not None:
                run.append_metrics({"engine": name, **drift})
        pools = {
            n: EnginePool(n, h.replicas, h.max_concurrency, h.budgets) for n, h in engines.items()
        }
        before = {n: await read_prefix_cache_counters(h) for n, h in engines.items()}
        stopping = True  # (interrupted or failed, until the executor returns)
        written = RunDirSink(run, settings.sampler_name, grader)
        try:
            ran = await executor.run(
                specs,
                pools=pools,
                sinks=[written, *sinks],
                finish=_text_decoder(engines),
                settings=settings,
            )
            stopping = False
            return ran
        except JobFailedError as exc:
            raise JobFailedError(f"{exc}\n{_resume_note(run)}") from None
        finally:
            try:
                await written.drain()  # (finished chains are kept, graded, whatever ended the job)
            finally:
                if grader is not None:
                    grader.close()
                await _record_prefix_cache(run, engines, before, stopping=stopping)


async def _open_used_engines(
    plan: JobPlan,
    stack: contextlib.AsyncExitStack,
    todo: Sequence[PlannedChain],
    embedded_urls: Mapping[str, str] | None,
    engine_overrides: Mapping[str, Sequence[Engine]] | None,
    probe: bool,
) -> dict[str, OpenedEngine]:
    """The engines the chains still to run use (closed when ``stack`` closes): the plan's,
    or the ready-made replicas ``engine_overrides`` gives for a name."""
    used = {c.arm.engine for c in todo}
    overrides = dict(engine_overrides or {})
    engines = await open_engines(
        plan,
        stack,
        embedded_urls=embedded_urls,
        only=[n for n in used if n not in overrides],
        probe=probe,
    )
    for name, replicas in overrides.items():
        if name in used:
            engines[name] = OpenedEngine.of(
                plan.engines[name], replicas, plan.settings.max_concurrency
            )
    return engines


async def _settle_identities(
    plan: JobPlan, run: RunDir, engines: Mapping[str, OpenedEngine]
) -> tuple[dict[str, int | None], dict[str, int | None]]:
    """What the job fixes about each engine before a chain runs, recorded in ``run.json``
    (which refuses one that differs from a resumed run's): its identity, the EOS discovered
    where the config gives none, and the vocabulary size. Returns the EOS and the sizes."""
    identities = await engine_identities(engines)
    discovered = await _discovered_eos(plan, run, engines)
    for name, eos in discovered.items():  # (fixed for the whole job, recorded in run.json)
        identities.setdefault(name, {})[EOS_IDENTITY_KEY] = eos
        engines[name].eos_token_id = eos
    # (the recorded size, where there is one, spares a search; a different one is refused
    # by the identity check below)
    stored = run.run_info().get(ENGINE_IDENTITY, {})
    vocab = await resolve_vocab_sizes(
        engines, {n: (stored.get(n) or {}).get(VOCAB_IDENTITY_KEY) for n in engines}
    )
    for name, size in vocab.items():
        identities.setdefault(name, {})[VOCAB_IDENTITY_KEY] = size
    check_eos_ids(
        plan.samplers,
        list(plan.engines),
        discovered,
        {n: vocab_of(n, engines[n].replicas, vocab) for n in engines},
    )
    run.record_engine_identity(identities)
    return discovered, vocab


def _chain_specs(
    plan: JobPlan,
    todo: Sequence[PlannedChain],
    prompt_ids: Mapping[str, Sequence[tuple[int, ...]]],
    discovered: Mapping[str, int | None],
) -> list[ChainSpec]:
    """What the executor runs for each planned chain: its sampler (with the engine's
    discovered EOS), its prompt's token ids on its engine, and its routing keys."""
    arms_per_engine = Counter(a.engine for a in plan.arms)
    return [
        ChainSpec(
            chain_id=c.chain_id,
            arm=c.arm.arm,
            engine=c.arm.engine,
            traversal=c.arm.traversal,
            sampler=_with_eos(
                c.sampler or plan.samplers[c.arm.engine], discovered.get(c.arm.engine)
            ),
            prompt_index=c.prompt_index,
            chain_index=c.chain_index,
            seed=c.seed,
            prompt_ids=prompt_ids[c.arm.engine][c.prompt_index],
            size=c.size,
            predictor=plan.predictor,
            replica_key=f"p{c.prompt_index}/c{c.chain_index}",
            routing_key=routing_key(plan.fingerprint, f"p{c.prompt_index}/c{c.chain_index}"),
            warm_prompt=arms_per_engine[c.arm.engine] > 1,
        )
        for c in todo
    ]


def _text_decoder(
    engines: Mapping[str, OpenedEngine],
) -> Callable[[ChainOutcome], Awaitable[None]]:
    """The executor's ``finish`` step: a finished chain on a text engine gets its response
    (and its alternatives) decoded by the replica that ran it."""

    async def add_text(outcome: ChainOutcome) -> None:
        if outcome.result is not None and engines[outcome.spec.engine].takes_text:
            replica = engines[outcome.spec.engine].replicas[outcome.replica]
            outcome.text = await decode(replica, outcome.result.token_ids)
            if outcome.result.alternatives:
                outcome.alternative_texts = [
                    await decode(replica, ids) for ids in outcome.result.alternatives
                ]

    return add_text


async def _record_prefix_cache(
    run: RunDir,
    engines: Mapping[str, OpenedEngine],
    before: Mapping[str, list[dict[str, float]] | None],
    *,
    stopping: bool,
) -> None:
    """The session's prefix-cache counter deltas per engine, appended to ``metrics.jsonl``
    (an engine without counters before or after, or a run directory that failed a write,
    records none)."""
    # Every engine's counters at once; briefly when stopping (engines.py says why).
    timeout_s = METRICS_TIMEOUT_STOPPING_S if stopping else METRICS_TIMEOUT_S
    metered = [n for n in engines if before.get(n) is not None]
    afters = await asyncio.gather(
        *(read_prefix_cache_counters(engines[n], timeout_s=timeout_s) for n in metered)
    )
    for n, after in zip(metered, afters, strict=True):
        b = before[n]
        if b is None or after is None or run.write_error is not None:
            continue
        delta = prefix_cache_delta(b, after)
        if delta["restarted_replicas"]:
            logger.warning(
                "engine %s: %d replica(s) restarted during this session (start time "
                "changed or counters went back); its prefix-cache hit rate covers only "
                "what they served after the restart",
                n,
                delta["restarted_replicas"],
            )
        run.append_metrics({"engine": n, **delta})


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (the ``fast`` extra) and ``PRESTO_UVLOOP`` is
    not ``0``; ``None``: asyncio's own. It makes the client's event loop cheaper per request
    (docs/benchmarks.md); nothing else depends on it."""
    if os.environ.get("PRESTO_UVLOOP", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def pending_engines(plan: JobPlan) -> list[str]:
    """Engines with chains still to run in the plan's run directory (read-only peek)."""
    done = RunDir(plan.output_dir).finished_chains()
    return sorted({c.arm.engine for c in plan.chains if c.chain_id not in done})


def run_job(plan: JobPlan, **kwargs: Any) -> JobResult:
    """Blocking :func:`run_job_async`, starting (and stopping) embedded servers around it."""
    check_output_dir(plan.output_dir)  # a config error before any engine starts
    with contextlib.ExitStack() as stack:
        servers: dict[str, ChildServer] = {}
        urls = start_embedded_servers(plan, stack, only=pending_engines(plan), started=servers)
        factory = event_loop_factory()
        logger.debug("event loop: %s", "uvloop" if factory is not None else "asyncio")
        with fewer_gc_passes(), asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(run_job_async(plan, embedded_urls=urls, servers=servers, **kwargs))
