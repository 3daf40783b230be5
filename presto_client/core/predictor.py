"""The certainty predictor of PreSTO's ``predictive`` traversal.

A 3-class logistic regression on the cut fraction ``c/T`` predicts whether a transition's
decision will be ε-certain accept, ε-certain reject, or uncertain; the branch probability
``h⁺ = ½(1 + P_acc − P_rej)`` weighs the accept child of a tree node. It only steers which
proposals are prefetched: it never touches a decision, so any predictor keeps the chain exact.
A refit from a run's own decisions (scikit-learn, outside the core) is
:mod:`presto_client.orchestration.results.predictor_fit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
