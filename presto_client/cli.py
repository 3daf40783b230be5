"""``presto``: run power-sampling jobs, compare engines and traversals, report on saved runs.

The only module that writes to the terminal. Library code logs through ``logging``; this module
configures the handler (``-v``: info, ``-vv``: debug, ``-q``: errors only) and turns errors into
one clear message and a non-zero exit (a traceback only with ``-v``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from presto_client import cli_fit_predictor, cli_quick_run
from presto_client.errors import ConfigError, PrestoError
from presto_client.progress_bar import ProgressBar
from presto_client.urls import redact_text

logger = logging.getLogger("presto_client.cli")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_PARTIAL = 3  # finished, but some chains failed (within the failure budget)
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM

_EPILOG = """\
examples:
  presto run configs/demo.yaml                      run the demo (llama.cpp on this CPU)
  presto run configs/demo_embedded.yaml             the demo on the embedded engine (torch)
  presto run configs/vllm.yaml --set engines[0].base_url=http://gpu:8000 --set sampler.alpha=4
  presto compare configs/demo.yaml                  the demo's arms side by side
  presto compare configs/vllm_vs_sglang.yaml --traversals sequential,crn
  presto report runs/demo                           tables and PNG plots of a saved run
  presto validate configs/vllm.yaml --probe         check a config (and the servers)
  presto fit-predictor runs/demo -o predictor.json refit the predictive traversal's predictor
  presto serve-embedded --port 8001                 serve the embedded engine (vLLM dialect)

Rerunning `presto run` on the same output directory resumes it: finished chains are skipped.
Exit status: 0 all chains finished, 3 some failed (rerun to retry them), 1 engine/job error,
2 config error (or an output that cannot be written: disk full), 130/143 interrupted
(Ctrl-C / SIGTERM; rerun to resume).
"""


class _Interrupted(Exception):
    """Ctrl-C (or SIGTERM) during a job, already reported to the user."""

    def __init__(self, status: int = EXIT_INTERRUPTED) -> None:
        super().__init__(status)
        self.status = status


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("presto-client")
    except Exception:
        return "unknown"


# --------------------------------------------------------------------------------------------
# Argument parsing
# --------------------------------------------------------------------------------------------


def _common(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="more logging (-v info, -vv debug); tracebacks on errors",
    )
    sub.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="only errors (and the final table)",
    )


def _config_options(sub: argparse.ArgumentParser) -> None:
    """The config file and its ``--set`` overrides (every command that reads a config)."""
    sub.add_argument("config", metavar="CONFIG", help="job config (YAML)")
    sub.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set sampler.alpha=4 --set engines[0].base_url=...",
    )


def _job_options(sub: argparse.ArgumentParser) -> None:
    _config_options(sub)
    sub.add_argument("--output", "-o", metavar="DIR", help="run directory (overrides output_dir)")
    sub.add_argument("--seed", type=int, metavar="N", help="root seed (overrides seed)")
    sub.add_argument(
        "--max-concurrency",
        type=int,
        metavar="N",
        help="most requests in flight over all engines (overrides max_concurrency)",
    )
    sub.add_argument("--no-progress", action="store_true", help="no progress bar")
    sub.add_argument("--no-probe", action="store_true", help="skip the engines' start-up probe")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="presto",
        description="Fast, exact LLM power sampling (PowerMH, EntropyCut, MultiTryMH) with "
        "PreSTO prefetching, against vLLM / SGLang / llama.cpp servers or an embedded CPU "
        "engine.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"presto {_version()}")
    _common(parser)
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = subs.add_parser(
        "run",
        help="run (or resume) a job and print its summary",
        description="Run the job's chains (prompts x chains x engines x traversals), write the "
        "run directory, print the summary table. Rerunning resumes.",
    )
    _job_options(run)
    cli_quick_run.add_options(run)  # (presto run --base-url URL --dataset NAME|FILE ...)
    _common(run)

    compare = subs.add_parser(
        "compare",
        help="run arms side by side (same prompts and seeds) and compare them",
        description="Run the same prompts and seeds on several engines and/or traversals, arms "
        "interleaved chain by chain, then print a side-by-side table.",
    )
    _job_options(compare)
    compare.add_argument(
        "--traversals", metavar="LIST", help="comma-separated traversals (default: the config's)"
    )
    compare.add_argument(
        "--engines", metavar="LIST", help="comma-separated engine names (default: all)"
    )
    compare.add_argument(
        "--baseline",
        metavar="ARM",
        help="also show paired speedups against this arm (e.g. vllm/sequential)",
    )
    _common(compare)

    report = subs.add_parser(
        "report",
        help="tables and PNG plots from saved runs (never re-runs)",
        description="Read run directories and print their summary tables; write PNG plots "
        "(cumulative model-call time vs completed transitions, transitions per call, speedup "
        "per prompt) into RUN_DIR/plots (or --output).",
    )
    report.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run directory written by presto run"
    )
    report.add_argument("--output", "-o", metavar="DIR", help="where to write the plots")
    report.add_argument("--no-plots", action="store_true", help="tables only")
    report.add_argument(
        "--regrade", metavar="GRADER", help="grade every finished chain again first (and keep it)"
    )
    _common(report)

    cli_fit_predictor.add_parser(subs)
    _common(subs.choices["fit-predictor"])

    validate = subs.add_parser(
        "validate",
        help="check a config and say what would run",
        description="Parse and validate a job config and describe the chains it would run.",
    )
    _config_options(validate)
    cli_quick_run.add_options(validate)  # (what `presto run` would run, flags and all)
    validate.add_argument("--output", "-o", metavar="DIR", help="run directory to check")
    validate.add_argument(
        "--probe", action="store_true", help="also contact the engines and probe them"
    )
    _common(validate)

    from presto_client.serve.command import add_serve_parser

    add_serve_parser(subs, _config_options, _common)

    serve = subs.add_parser(
        "serve-embedded",
        help="serve the embedded CPU engine (vLLM dialect) on loopback",
        description="Serve SmolLM2-135M on the CPU with the vLLM HTTP dialect. Options are "
        "passed on to the embedded server (see presto serve-embedded --help).",
        add_help=False,
    )
    serve.add_argument("serve_args", nargs=argparse.REMAINDER)
    return parser


# --------------------------------------------------------------------------------------------
# Terminal helpers
# --------------------------------------------------------------------------------------------


class _RedactingFormatter(logging.Formatter):
    """Log lines (tracebacks included) with credentials in URLs shown as ``***@``."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def _configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING
    if quiet:
        level = logging.ERROR
    elif verbose >= 2:
        level = logging.DEBUG
    elif verbose == 1:
        level = logging.INFO
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_presto", False):
            root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("%(levelname)s %(name)s: %(message)s"))
    handler._presto = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    # What a user waits for (the embedded engine's first start): shown unless -q.
    progress = logging.getLogger("presto_client.progress")
    for h in list(progress.handlers):
        if getattr(h, "_presto", False):
            progress.removeHandler(h)
    note = logging.StreamHandler(sys.stderr)
    note.setFormatter(_RedactingFormatter("presto: %(message)s"))
    note._presto = True  # type: ignore[attr-defined]
    progress.addHandler(note)
    progress.propagate = False
    progress.setLevel(logging.ERROR if quiet else logging.INFO)
    for noisy in ("matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


@contextlib.contextmanager
def _sigterm_as_interrupt(received: dict[str, int]) -> Iterator[None]:
    """SIGTERM (``kill``, ``timeout``, a batch scheduler, ``docker stop``) stops a job as Ctrl-C
    does: running chains are cancelled, finished ones stay on disk, embedded servers are stopped.
    Without this the process dies at once and leaves an embedded server running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        received["signal"] = signum
        on_sigint = signal.getsignal(signal.SIGINT)  # asyncio.run's handler while a job runs
        if callable(on_sigint) and on_sigint is not signal.default_int_handler:
            on_sigint(signal.SIGINT, frame)
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _progress_mode(args: argparse.Namespace) -> str | None:
    """``"bar"`` on a terminal, ``"lines"`` elsewhere, ``None`` with --no-progress or -q."""
    if args.no_progress or getattr(args, "quiet", False):
        return None
    return "bar" if sys.stderr.isatty() else "lines"


def _split_list(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _load(args: argparse.Namespace) -> Any:
    overrides = list(args.overrides)
    if getattr(args, "output", None):
        overrides.append(f"output_dir={args.output}")
    if getattr(args, "seed", None) is not None:
        overrides.append(f"seed={args.seed}")
    if getattr(args, "max_concurrency", None) is not None:
        overrides.append(f"max_concurrency={args.max_concurrency}")
    return cli_quick_run.load(args, overrides)  # (CONFIG, a ready config's name, or flags)


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def _execute(args: argparse.Namespace, plan: Any, out: TextIO) -> Any:
    from presto_client.core.methods import baseline_names
    from presto_client.orchestration.job import run_job

    settings = plan.settings
    baselines = sum(c.arm.traversal in baseline_names() for c in plan.chains)
    progress = ProgressBar(
        _progress_mode(args),
        per_chain=settings.num_blocks * settings.steps_per_block,
        baseline_blocks=settings.num_blocks,
        baseline_share=baselines / max(1, len(plan.chains)),
    )
    state: dict[str, int] = {}
    received: dict[str, int] = {}

    def on_start(total: int, finished: int) -> None:
        state.update(total=total, finished=finished)
        if finished and not getattr(args, "quiet", False):
            print(
                f"resuming {plan.output_dir}: {finished} of {total} chain(s) already finished",
                file=sys.stderr,
            )
        progress.start(total, finished)

    try:
        with progress.logging_redirected(), _sigterm_as_interrupt(received):
            return run_job(plan, sinks=[progress], probe=not args.no_probe, on_start=on_start)
    except KeyboardInterrupt:
        progress.close()
        from presto_client.orchestration.run_dir.rundir import RunDir, finished_ok

        run = RunDir(plan.output_dir)
        terminated = received.get("signal") == signal.SIGTERM
        what = "terminated (SIGTERM)" if terminated else "interrupted"
        total = state.get("total", len(plan.chains))
        if run.exists():
            done = len(finished_ok(run.samples()))
            told = (
                f"{done} of {total} chain(s) finished are saved in {plan.output_dir}; rerun "
                "the same command to resume"
            )
        else:  # (a fresh run stopped before it wrote anything is removed)
            told = (
                f"stopped before any chain ran; nothing was saved ({plan.output_dir} was not "
                "kept); rerun the same command to start"
            )
        print(f"{what}: {told}", file=sys.stderr)
        raise _Interrupted(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None
    finally:
        progress.close()


def _result_footer(result: Any) -> str:
    parts = [f"{result.completed} chain(s) run"]
    if result.skipped:
        parts.append(f"{result.skipped} already finished")
    if result.failed:
        parts.append(f"{result.failed} failed (see samples.jsonl)")
    client = getattr(result, "client", None) or {}
    load = (
        f"client: peak memory {client['peak_rss_mb']:.0f} MB, event-loop lag p99 "
        f"{client['loop_lag_p99_ms']:.0f} ms (max {client['loop_lag_max_ms']:.0f} ms)\n"
        if client
        else ""
    )
    return (
        f"{', '.join(parts)} in {result.wall_s:.1f} s; run directory: {result.run_dir}\n"
        f"{load}plots: presto report {result.run_dir}"
    )


def _exit_status(result: Any) -> int:
    """0 when every chain finished; 3 when some failed within the budget (rerun to retry them),
    so scripts can tell an incomplete run; 1 when none of this session's chains finished."""
    if not result.failed:
        return EXIT_OK
    return EXIT_ERROR if not result.completed else EXIT_PARTIAL


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    from presto_client.orchestration.planning.plan import make_plan
    from presto_client.orchestration.prompts.prompt_rows import load_prompts
    from presto_client.reporting.tables import format_summary_table

    cfg = _load(args)
    plan = make_plan(cfg, load_prompts(cfg))
    result = _execute(args, plan, out)
    print(format_summary_table(result.summary), file=out)
    for extra in _run_notes(plan, result):
        print(file=out)
        print(extra, file=out)
    print(file=out)
    print(_result_footer(result), file=out)
    return _exit_status(result)


def _run_notes(plan: Any, result: Any) -> list[str]:
    """What ``presto run`` prints under its tables: an excerpt of the answers, and on an engine
    that computes on this machine's CPU (llama.cpp as presto builds it) why PreSTO cannot be
    faster there and the command that shows its speed-up (issue 40)."""
    from presto_client.orchestration.planned import LlamaCppServer
    from presto_client.orchestration.run_dir.rundir import RunDir
    from presto_client.reporting.answers import format_answers, format_cpu_note

    prompts = {p.index: p.text for p in plan.prompts if p.text is not None}
    cpu = [e.name for e in plan.engines.values() if isinstance(e.server, LlamaCppServer)]
    notes = [
        format_answers(RunDir(result.run_dir).samples(), prompts),
        format_cpu_note(result.summary, cpu),
    ]
    return [n for n in notes if n]


def cmd_compare(args: argparse.Namespace, out: TextIO) -> int:
    from presto_client.orchestration.prompts.prompt_rows import load_prompts
    from presto_client.orchestration.run_dir.rundir import RunDir
    from presto_client.reporting.compare import check_baseline, compare_plan, format_comparison

    cfg = _load(args)
    plan = compare_plan(
        cfg,
        load_prompts(cfg),
        engines=_split_list(args.engines),
        traversals=_split_list(args.traversals),
    )
    check_baseline(plan.arms, args.baseline)
    result = _execute(args, plan, out)
    arms = {a.arm for a in plan.arms}
    summary = dict(result.summary)
    summary["arms"] = [a for a in summary.get("arms", []) if a["arm"] in arms]
    samples = RunDir(result.run_dir).samples()
    print(format_comparison(summary, samples, args.baseline), file=out)
    print(file=out)
    print(_result_footer(result), file=out)
    return _exit_status(result)


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    from presto_client.orchestration.results.quality import regrade_run
    from presto_client.orchestration.results.summary import summarize_run
    from presto_client.orchestration.run_dir.rundir import RunDir
    from presto_client.reporting.plots import write_plots
    from presto_client.reporting.tables import (
        format_runs_table,
        format_speedup_per_prompt,
        format_summary_table,
        runs_table_rows,
    )

    combined: list[list[str]] = []
    for i, d in enumerate(args.run_dirs):
        run = RunDir(d)
        if args.regrade:
            n = asyncio.run(regrade_run(run, args.regrade))
            print(f"{run.path}: {n} chain(s) graded again with {args.regrade}", file=out)
        summary = summarize_run(run)
        print(
            f"== {run.path} ({summary['chains_ok']} chain(s) ok, "
            f"{summary['chains_failed']} failed)",
            file=out,
        )
        print(format_summary_table(summary), file=out)
        per_prompt = format_speedup_per_prompt(summary)
        if per_prompt:
            print(file=out)
            print(per_prompt, file=out)
        if not args.no_plots:
            target = None
            if args.output:
                target = Path(args.output)
                if len(args.run_dirs) > 1:
                    target = target / f"{i:02d}_{run.path.name}"
            files = write_plots(run, target)
            for f in files:
                print(f"wrote {f}", file=out)
        print(file=out)
        combined.extend(runs_table_rows(run.path, summary))
    if len(args.run_dirs) > 1 and combined:
        print("== all runs", file=out)
        print(format_runs_table(combined), file=out)
    return EXIT_OK


def cmd_validate(args: argparse.Namespace, out: TextIO) -> int:
    from presto_client.orchestration.planning.plan import describe_plan, make_plan
    from presto_client.orchestration.run_dir.rundir import RunDir

    cfg = _load(args)
    prompts, not_loaded = cli_quick_run.validate_prompts(cfg)  # (no network: no Hub dataset)
    plan = make_plan(cfg, prompts)
    # the same check as `presto run` (a directory run would refuse is an error here too)
    finished = {} if not_loaded else RunDir(plan.output_dir).check_resumable(plan.fingerprint)
    done = {c.chain_id for c in plan.chains} & set(finished)
    print(f"{args.config}: valid", file=out)
    print(describe_plan(cfg, plan, finished=len(done)), file=out)
    if not_loaded:
        print(f"  {not_loaded}", file=out)
    elif prompts:  # (what the engine is sent, seen before any compute is spent)
        print(f"  {first_prompt_text(cfg, prompts[0])}", file=out)
    if args.probe:
        from presto_client.orchestration.engines.opening import probe_job

        lines = probe_job(plan)
        print("probe:", file=out)
        print("\n".join(lines), file=out)
    return EXIT_OK


def first_prompt_text(cfg: Any, prompt: Any) -> str:
    """The first prompt as the job renders it (its template filled), in one escaped line."""
    if prompt.text is None:
        return f"first prompt: token ids {list(prompt.token_ids or ())[:16]}"
    text = prompt.text if len(prompt.text) <= 300 else prompt.text[:297] + "..."
    where = " (the server's chat template wraps it)" if cfg.prompts.chat_template else ""
    return f"first prompt{where}: {text!r}"


def cmd_serve_embedded(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from presto_client.embedded.__main__ import main as serve_main
    except ImportError as exc:
        raise ConfigError(
            f"the embedded engine is not available ({exc}); install it with "
            "pip install 'presto-client[embedded]'"
        ) from None
    rest = list(args.serve_args)
    if rest and rest[0] == "--":
        rest = rest[1:]
    return int(serve_main(rest) or 0)


def cmd_serve(args: argparse.Namespace, out: TextIO) -> int:
    from presto_client.serve.command import run_serve

    return run_serve(args, _load(args))


_COMMANDS = {
    "serve": cmd_serve,
    "run": cmd_run,
    "compare": cmd_compare,
    "report": cmd_report,
    "validate": cmd_validate,
    "fit-predictor": cli_fit_predictor.cmd_fit_predictor,
    "serve-embedded": cmd_serve_embedded,
}


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """The ``presto`` command; returns the exit status."""
    arglist = list(argv) if argv is not None else sys.argv[1:]
    if arglist and arglist[0] == "serve-embedded":
        # Everything after the command belongs to the embedded server (its own --help too).
        try:
            return cmd_serve_embedded(argparse.Namespace(serve_args=arglist[1:]), sys.stdout)
        except PrestoError as exc:
            print(f"presto: error: {redact_text(str(exc))}", file=sys.stderr)
            return EXIT_CONFIG
    parser = build_parser()
    args = parser.parse_args(arglist)
    stream = out or sys.stdout
    verbose = int(getattr(args, "verbose", 0) or 0)
    quiet = bool(getattr(args, "quiet", False))
    if args.command is None:
        parser.print_help(stream)
        return EXIT_CONFIG
    _configure_logging(verbose, quiet)
    start = time.perf_counter()
    try:
        status = _COMMANDS[args.command](args, stream)
    except ConfigError as exc:
        if verbose:
            logger.exception("configuration error")
        print(f"presto: error: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_CONFIG
    except PrestoError as exc:
        if verbose:
            logger.exception("error")
        print(f"presto: error: {redact_text(str(exc))}", file=sys.stderr)
        return EXIT_ERROR
    except _Interrupted as exc:
        return exc.status
    except KeyboardInterrupt:
        print("presto: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    logger.info("%s took %.1f s", args.command, time.perf_counter() - start)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
