"""``presto fit-predictor RUN_DIR [-o FILE]``: refit the predictive traversal's certainty
predictor from a saved run's decisions and write it as JSON (``sampler.predictor`` reads it)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TextIO

from presto_client.errors import ConfigError


def add_parser(subs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = subs.add_parser(
        "fit-predictor",
        help="refit the predictive traversal's predictor from a saved run's decisions",
        description="Fit the 3-class certainty predictor (accept / reject / uncertain against "
        "cut / response length) to a run directory's MH decisions with scikit-learn, print the "
        "held-out log-loss (a split by chain) of the refit and of the paper's coefficients, "
        "and write the coefficients as JSON; use them with sampler.predictor: FILE.",
    )
    sub.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by presto run")
    sub.add_argument(
        "--output", "-o", metavar="FILE", help="where to write it (default RUN_DIR/predictor.json)"
    )
    sub.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the held-out split")


def cmd_fit_predictor(args: argparse.Namespace, out: TextIO) -> int:
    try:
        import sklearn  # noqa: F401  (the refit's only dependency beyond the base install)
    except ImportError:
        raise ConfigError(
            "presto fit-predictor needs scikit-learn: pip install 'presto-client[fit]'"
        ) from None
    from presto_client.orchestration.results.predictor_fit import (
        CLASS_NAMES,
        fit_and_evaluate,
        predictor_json,
        read_decisions,
    )
    from presto_client.orchestration.run_dir.rundir import RunDir, atomic_write_text

    run = RunDir(args.run_dir)
    report = fit_and_evaluate(read_decisions(run), seed=args.seed)
    target = Path(args.output) if args.output else run.path / "predictor.json"
    text = json.dumps(predictor_json(report, str(run.path)), indent=2) + "\n"
    atomic_write_text(target, text)  # (an unwritable target is a config error, exit 2)
    counts = ", ".join(f"{n} {c}" for n, c in zip(CLASS_NAMES, report.class_counts, strict=True))
    out.write(f"{report.decisions} decisions ({counts}); {report.held_out} held out\n")
    out.write(f"held-out log-loss: refit {report.refit_log_loss:.4f}")
    out.write(f", paper {report.paper_log_loss:.4f}\n")
    out.write(f"wrote {target} (use it with sampler.predictor: {target})\n")
    return 0
