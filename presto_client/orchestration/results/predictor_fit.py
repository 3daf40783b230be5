"""Refit the predictive traversal's certainty predictor from a run directory's own decisions.

Each finished chain in ``samples.jsonl`` records its transitions as ``[block, k, cut, accepted,
log_accept, rejection_bound]`` (``log_accept`` null for an early rejection; runs written before
the bound was kept apart have five fields). A decision's class is read from ``log A`` and the
run's ε (accept if ``log A ≥ log(1−ε)``, reject if ``log A ≤ log ε``, else uncertain), and its
feature is the one
the predictive walk uses: ``cut / T``, with ``T`` the response length when the decision was
taken. Every block extends the response by exactly ``block_size`` tokens (an engine returns the
tokens asked for; an end token is cut only from the final response), so during block ``b``
``T = (b + 1) · block_size``.

The 3-class logistic regression is scikit-learn's. The held-out log-loss compares the refit with
the paper's coefficients on chains neither saw during the fit (the split is by (prompt, chain),
so a replaying arm's copy of a chain never lands on both sides). The predictor only steers which
proposals are prefetched: a refit changes speed, never a decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]
from sklearn.metrics import log_loss  # type: ignore[import-untyped]
from sklearn.model_selection import GroupShuffleSplit  # type: ignore[import-untyped]

from presto_client.core.predictor import (
    CLASS_ACCEPT,
    CLASS_REJECT,
    CLASS_UNCERTAIN,
    CertaintyPredictor,
)
from presto_client.errors import ConfigError
from presto_client.orchestration.run_dir.rundir import RunDir, finished_ok

CLASS_NAMES = ("accept", "reject", "uncertain")
"""The classes in the predictor's order (:data:`CLASS_ACCEPT`, ...)."""

HELD_OUT_FRACTION = 0.25
"""Share of the chains kept out of the fit to measure the log-loss on."""

_ABSENT_INTERCEPT = -30.0
"""A class never seen in the decisions gets a negligible probability (``e^-30``)."""


class PredictorFitError(ConfigError):
    """The run directory's decisions cannot be fitted (none recorded, or one class only)."""


@dataclass(frozen=True, slots=True)
class Decisions:
    """A run's MH decisions: feature, class and the chain each belongs to."""

    cut_fractions: np.ndarray
    classes: np.ndarray
    groups: np.ndarray
    """The (prompt, chain) of each decision: the unit of the held-out split."""
    sampler: str
    epsilon: float

    def __len__(self) -> int:
        return int(self.classes.shape[0])


@dataclass(frozen=True, slots=True)
class FitReport:
    predictor: CertaintyPredictor
    """Fitted on every decision (what ``presto fit-predictor`` writes)."""
    paper: CertaintyPredictor
    refit_log_loss: float
    """Held-out log-loss of a fit on the other chains."""
    paper_log_loss: float
    """Held-out log-loss of the paper's coefficients on the same chains."""
    decisions: int
    held_out: int
    class_counts: tuple[int, int, int]


def classify(log_accept: float, epsilon: float) -> int:
    """The ε-certainty class of a decision with acceptance log-ratio ``log_accept``."""
    if log_accept >= math.log1p(-epsilon):
        return CLASS_ACCEPT
    if log_accept <= math.log(epsilon):
        return CLASS_REJECT
    return CLASS_UNCERTAIN


def decisions_of(
    samples: Iterable[Mapping[str, Any]], *, block_size: int, epsilon: float, sampler: str
) -> Decisions:
    """Every decision of the finished chains. A (prompt, chain) run by several replaying arms
    holds the same decisions several times (the same ``(block, k, cut, accepted)`` in order):
    each distinct decision list counts once, with the exact ``log A`` any copy has. An early
    rejection (``log A`` null, the bound that proved it beside it) counts as a certain
    rejection when its bound is at most ``log ε``; otherwise, with no copy that computed its
    ``log A``, its class is unknown and it is left out."""
    x: list[float] = []
    y: list[int] = []
    groups: list[str] = []
    seen: dict[str, dict[tuple[tuple[int, int, int, bool], ...], list[float | None]]] = {}
    for row in finished_ok(samples).values():
        transitions = row.get("transitions") or []
        if not transitions:
            continue
        group = f"{row.get('engine')}/p{row.get('prompt_index')}/c{row.get('chain_index')}"
        decisions = tuple((int(t[0]), int(t[1]), int(t[2]), bool(t[3])) for t in transitions)
        copies = seen.setdefault(group, {})
        merged = copies.setdefault(decisions, [None] * len(decisions))
        for i, t in enumerate(transitions):
            log_accept = t[4]
            bound = t[5] if len(t) > 5 else None
            if log_accept is not None:
                merged[i] = float(log_accept)
            elif merged[i] is None and bound is not None and float(bound) <= math.log(epsilon):
                merged[i] = float(bound)  # certainly rejected: its class is known
    for group, copies in seen.items():
        for decisions, values in copies.items():
            for (block, _k, cut, _accepted), value in zip(decisions, values, strict=True):
                if value is None:
                    continue
                x.append(cut / ((block + 1) * block_size))
                y.append(classify(value, epsilon))
                groups.append(group)
    return Decisions(
        np.asarray(x, dtype=np.float64),
        np.asarray(y, dtype=np.int64),
        np.asarray(groups),
        sampler,
        epsilon,
    )


def read_decisions(run: RunDir) -> Decisions:
    """The decisions of a run directory, with the block size, ε and sampler it ran with."""
    if not run.exists():
        raise PredictorFitError(f"{run.path} is not a run directory (no run.json)")
    sampler = run.resolved_config().get("sampler") or {}
    try:
        block_size = int(sampler["block_size"])
        epsilon = float(sampler["epsilon"])
    except (KeyError, TypeError, ValueError):
        raise PredictorFitError(
            f"{run.path}: its resolved config names no sampler block_size/epsilon"
        ) from None
    return decisions_of(
        run.samples(),
        block_size=block_size,
        epsilon=epsilon,
        sampler=str(sampler.get("sampler", "power_mh")),
    )


def fit_predictor(
    cut_fractions: Sequence[float] | np.ndarray, classes: Sequence[int] | np.ndarray
) -> CertaintyPredictor:
    """The multinomial logistic regression of class on cut fraction (nearly unregularised)."""
    x = np.asarray(cut_fractions, dtype=np.float64).reshape(-1, 1)
    y = np.asarray(classes, dtype=np.int64)
    present = sorted(set(y.tolist()))
    if len(present) < 2:
        names = ", ".join(CLASS_NAMES[c] for c in present) or "none"
        raise PredictorFitError(
            f"the decisions are all of one class ({names}): a predictor needs at least two"
        )
    model = LogisticRegression(C=1e6, max_iter=1000).fit(x, y)
    intercepts = [_ABSENT_INTERCEPT] * 3
    slopes = [0.0] * 3
    if len(present) == 2:
        # A binary fit gives one decision function, the second class's against the first.
        intercepts[present[0]], slopes[present[0]] = 0.0, 0.0
        intercepts[present[1]] = float(model.intercept_[0])
        slopes[present[1]] = float(model.coef_[0, 0])
    else:
        for row, cls_id in enumerate(model.classes_):
            intercepts[int(cls_id)] = float(model.intercept_[row])
            slopes[int(cls_id)] = float(model.coef_[row, 0])
    return CertaintyPredictor(
        (intercepts[0], intercepts[1], intercepts[2]), (slopes[0], slopes[1], slopes[2])
    )


def predictor_log_loss(
    predictor: CertaintyPredictor,
    cut_fractions: Sequence[float] | np.ndarray,
    classes: Sequence[int] | np.ndarray,
) -> float:
    """Mean negative log-likelihood of ``classes`` under ``predictor``."""
    proba = np.asarray([predictor.probabilities(float(c)) for c in cut_fractions])
    return float(log_loss(np.asarray(classes), proba, labels=[0, 1, 2]))


def fit_and_evaluate(decisions: Decisions, *, seed: int = 0) -> FitReport:
    """Fit on every decision; measure the held-out log-loss of a fit on the other chains
    against the paper's coefficients."""
    if len(decisions) == 0:
        raise PredictorFitError(
            "no recorded transitions: run an MH traversal (e.g. sequential or predictive) with "
            "steps_per_block >= 1 first"
        )
    full = fit_predictor(decisions.cut_fractions, decisions.classes)  # (the one-class error)
    paper = CertaintyPredictor.paper(decisions.sampler)
    if len(set(decisions.groups.tolist())) < 2:
        raise PredictorFitError(
            "the decisions come from one chain: a held-out log-loss needs at least two chains"
        )
    split = GroupShuffleSplit(n_splits=1, test_size=HELD_OUT_FRACTION, random_state=seed)
    train, test = next(split.split(decisions.cut_fractions, groups=decisions.groups))
    x, y = decisions.cut_fractions, decisions.classes
    try:
        refit = fit_predictor(x[train], y[train])
    except PredictorFitError:
        refit = _constant(y[train])
    counts = np.bincount(y, minlength=3)
    return FitReport(
        predictor=full,
        paper=paper,
        refit_log_loss=predictor_log_loss(refit, x[test], y[test]),
        paper_log_loss=predictor_log_loss(paper, x[test], y[test]),
        decisions=len(decisions),
        held_out=int(test.shape[0]),
        class_counts=(int(counts[0]), int(counts[1]), int(counts[2])),
    )


def _constant(classes: np.ndarray) -> CertaintyPredictor:
    """The training chains hold one class only: the predictor that always says it."""
    only = int(classes[0])
    intercepts = [_ABSENT_INTERCEPT] * 3
    intercepts[only] = 0.0
    return CertaintyPredictor((intercepts[0], intercepts[1], intercepts[2]), (0.0, 0.0, 0.0))


def predictor_json(report: FitReport, source: str) -> dict[str, Any]:
    """What ``presto fit-predictor`` writes (and ``sampler.predictor`` reads)."""
    p = report.predictor
    return {
        "classes": list(CLASS_NAMES),
        "feature": "cut / response length",
        "intercepts": list(p.intercepts),
        "slopes": list(p.slopes),
        "fitted_on": source,
        "decisions": report.decisions,
        "class_counts": dict(zip(CLASS_NAMES, report.class_counts, strict=True)),
        "held_out_log_loss": {"refit": report.refit_log_loss, "paper": report.paper_log_loss},
    }
