"""PreSTO's prefetch tree: which proposals a round generates, and how the walk finds them.

A node of the tree is a possible future state of the chain; its accept child holds the node's
proposal, its reject child the node's own state. The *held cut* of a node bounds the tokens every
state below it shares with the root (root: ``T``; accept child: its parent's cut; reject child:
its parent's held cut). A proposal with cut ``c`` at a node can be generated this round iff
``c ≤ held cut`` (Condition 1): its prefix is then the root's.

A traversal rule is a pure function ``(PlanContext, n_pf) -> RoundPlan``; the round runner only
calls :meth:`RoundPlan.lookup` during the walk, so a new rule needs no change to it (it is
registered as a method: :func:`presto_client.core.methods.register_traversal`).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from presto_client.core.engine_protocol import ProposalRequest, ScoredTokens
from presto_client.core.kernels import Kernel
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.rng import ChainRandomness, TransitionDraws
from presto_client.core.state import ChainState

Path = tuple[bool, ...]


@dataclass(slots=True)
class PlannedProposal:
    """One prefetched proposal: its node (or depth), draws, speculated cut and requests."""

    depth: int
    path: Path | None
    """The node's path from the root (``None`` for a per-depth ``crn`` proposal)."""
    draws: TransitionDraws
    cut: int
    """The cut, drawn under the *root's* cut law (EntropyCut verifies it during the walk)."""
    held_cut: int
    requests: list[ProposalRequest]
    reach: float = 1.0
    results: list[ScoredTokens] = field(default_factory=list)


@dataclass(slots=True)
class RoundPlan:
    proposals: list[PlannedProposal]
    per_depth: bool
    """``crn``: one proposal per depth serves every node at that depth."""
    _index: dict[Path, PlannedProposal] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.per_depth:
            self._index = {p.path: p for p in self.proposals if p.path is not None}

    def lookup(self, path: Path) -> PlannedProposal | None:
        """The proposal planned for the node reached along ``path``, if any."""
        if self.per_depth:
            depth = len(path)
            return self.proposals[depth] if depth < len(self.proposals) else None
        return self._index.get(path)

    def requests(self) -> list[ProposalRequest]:
        return [r for p in self.proposals for r in p.requests]

    def attach(self, results: list[ScoredTokens]) -> None:
        """Hand each proposal its generated sequences (``results`` in :meth:`requests` order)."""
        i = 0
        for p in self.proposals:
            p.results = results[i : i + len(p.requests)]
            i += len(p.requests)
        if i != len(results):
            raise ValueError(f"engine returned {len(results)} results for {i} requests")


@dataclass(frozen=True, slots=True)
class PlanContext:
    kernel: Kernel
    randomness: ChainRandomness
    root: ChainState
    block: int
    root_k: int
    depth_cap: int
    """Transitions left in the block: no proposal deeper than this."""
    predictor: CertaintyPredictor | None = None

    def proposal(
        self, depth: int, path: Path | None, draws: TransitionDraws, held_cut: int, reach: float
    ) -> PlannedProposal | None:
        """The proposal of a node with these draws, or ``None`` if its cut is infeasible."""
        cut = self.kernel.cut(self.root, draws.u_cut)
        if cut > held_cut:
            return None
        prefix = self.root.prefix(cut)
        requests = self.kernel.requests(prefix, self.root.length - cut, draws)
        return PlannedProposal(depth, path, draws, cut, held_cut, requests, reach)


def plan_crn(ctx: PlanContext, n_pf: int) -> RoundPlan:
    """Common random numbers: transition ``k+d``'s own draws at depth ``d``, one per depth.

    Every node at depth ``d`` would ask for the same thing (the root's prefix up to ``c_{k+d}``
    with seed ``s_{k+d}``), so the subtree collapses to a path of ``min(n_pf, K−k)`` requests.
    Each is feasible at least for the all-reject path (held cut ``T``), so none is wasted a priori.
    """
    proposals = []
    for d in range(min(n_pf, ctx.depth_cap)):
        draws = ctx.randomness.transition(ctx.block, ctx.root_k + d)
        planned = ctx.proposal(d, None, draws, ctx.root.length, 1.0)
        if planned is None:  # cannot happen: every cut is < T
            raise AssertionError("a cut beyond the response length")
        proposals.append(planned)
    return RoundPlan(proposals, per_depth=True)


def plan_bfs(ctx: PlanContext, n_pf: int) -> RoundPlan:
    """The paper's default: breadth first, accept child first, each node with its own draws
    (:meth:`~presto_client.core.rng.ChainRandomness.node`: the transition's on the all-reject path).

    A node whose cut is infeasible gets no request and its subtree is pruned: the walk ends
    there if it gets there, so requests below it could never be used.
    """
    selected: list[PlannedProposal] = []
    queue: deque[tuple[Path, int]] = deque([((), ctx.root.length)])
    while queue and len(selected) < n_pf:
        path, held = queue.popleft()
        if len(path) >= ctx.depth_cap:
            continue
        draws = ctx.randomness.node(ctx.block, ctx.root_k, path)
        planned = ctx.proposal(len(path), path, draws, held, 1.0)
        if planned is None:
            continue
        selected.append(planned)
        queue.append(((*path, True), planned.cut))
        queue.append(((*path, False), held))
    return RoundPlan(selected, per_depth=False)


def plan_predictive(ctx: PlanContext, n_pf: int) -> RoundPlan:
    """Select the ``n_pf`` feasible nodes that maximise the expected completed transitions.

    The reach probability of a node is the product of predicted branch probabilities along its
    path; it never grows along a path, so expanding best-first by reach probability selects the
    same set as the paper's dynamic programme.
    """
    predictor = ctx.predictor or CertaintyPredictor.paper(ctx.kernel.config.sampler)
    length = ctx.root.length
    selected: list[PlannedProposal] = []
    counter = 0  # FIFO tie-break keeps the order deterministic
    heap: list[tuple[float, int, Path, int]] = [(-1.0, counter, (), length)]
    while heap and len(selected) < n_pf:
        neg_reach, _, path, held = heapq.heappop(heap)
        if len(path) >= ctx.depth_cap:
            continue
        draws = ctx.randomness.node(ctx.block, ctx.root_k, path)
        planned = ctx.proposal(len(path), path, draws, held, -neg_reach)
        if planned is None:
            continue
        selected.append(planned)
        h_accept = predictor.branch_probability(planned.cut / length)
        for child, child_held, p in (
            ((*path, True), planned.cut, h_accept),
            ((*path, False), held, 1.0 - h_accept),
        ):
            counter += 1
            heapq.heappush(heap, (neg_reach * p, counter, child, child_held))
    return RoundPlan(selected, per_depth=False)


PlanRule = Callable[[PlanContext, int], RoundPlan]

TRAVERSAL_RULES: Mapping[str, PlanRule] = MappingProxyType(
    {"bfs": plan_bfs, "predictive": plan_predictive, "crn": plan_crn}
)
"""The built-in prefetch-tree rules, name -> rule. Each is a method of
:mod:`presto_client.core.methods` (run by the ``PrestoRunner``); a new rule is registered there
(:func:`presto_client.core.methods.register_traversal`), the one list of method names."""
