"""The certainty predictor of PreSTO's ``predictive`` traversal.

A 3-class logistic regression on the cut fraction ``c/T`` predicts whether a transition's
decision will be ε-certain accept, ε-certain reject, or uncertain; the branch probability
``h⁺ = ½(1 + P_acc − P_rej)`` weighs the accept child of a tree node. It only steers which
proposals are prefetched: it never touches a decision, so any predictor keeps the chain exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Paper coefficients for the classes (accept, reject, uncertain).
_PAPER: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "power_mh": ((-0.780255, 2.041824, -1.261570), (1.128515, -2.920097, 1.791582)),
    "entropy_cut": ((-0.822343, 1.783249, -0.960906), (0.936869, -2.248380, 1.311511)),
}

CLASS_ACCEPT, CLASS_REJECT, CLASS_UNCERTAIN = 0, 1, 2


@dataclass(frozen=True, slots=True)
class CertaintyPredictor:
    intercepts: tuple[float, float, float]
    slopes: tuple[float, float, float]

    @classmethod
    def paper(cls, sampler: str) -> CertaintyPredictor:
        """The paper's fit. It was fitted for PowerMH and EntropyCut only; MultiTryMH reuses the
        PowerMH fit (its cut is uniform too). That choice affects speed only, never exactness."""
        intercepts, slopes = _PAPER.get(sampler, _PAPER["power_mh"])
        return cls(intercepts, slopes)

    def probabilities(self, cut_fraction: float) -> tuple[float, float, float]:
        logits = [a + b * cut_fraction for a, b in zip(self.intercepts, self.slopes, strict=True)]
        top = max(logits)
        exps = [math.exp(v - top) for v in logits]
        total = sum(exps)
        return exps[0] / total, exps[1] / total, exps[2] / total

    def branch_probability(self, cut_fraction: float) -> float:
        """``h⁺``: predicted probability that the walk takes the accept edge."""
        p_acc, p_rej, _ = self.probabilities(cut_fraction)
        return 0.5 * (1.0 + p_acc - p_rej)

    @classmethod
    def fit(cls, cut_fractions: Sequence[float], classes: Sequence[int]) -> CertaintyPredictor:
        """Refit on recorded decisions (e.g. from a run's transitions) with scikit-learn."""
        from sklearn.linear_model import LogisticRegression  # type: ignore[import-untyped]

        x = np.asarray(cut_fractions, dtype=np.float64).reshape(-1, 1)
        y = np.asarray(classes, dtype=np.int64)
        present = sorted(set(y.tolist()))
        if len(present) < 2:
            raise ValueError("need decisions of at least two classes to fit the predictor")
        model = LogisticRegression(C=1e6, max_iter=1000).fit(x, y)
        intercepts = [-30.0, -30.0, -30.0]  # a class never seen gets a negligible probability
        slopes = [0.0, 0.0, 0.0]
        if len(present) == 2:
            # Binary fit: sklearn gives one decision function for the second class.
            intercepts[present[0]], slopes[present[0]] = 0.0, 0.0
            intercepts[present[1]] = float(model.intercept_[0])
            slopes[present[1]] = float(model.coef_[0, 0])
        else:
            for row, cls_id in enumerate(model.classes_):
                intercepts[int(cls_id)] = float(model.intercept_[row])
                slopes[int(cls_id)] = float(model.coef_[row, 0])
        return cls((intercepts[0], intercepts[1], intercepts[2]), (slopes[0], slopes[1], slopes[2]))
