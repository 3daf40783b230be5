"""The prefetch tree: feasibility (Condition 1), held cuts, depth caps, selection rules."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from presto_client.core.engine_protocol import ScoredTokens
from presto_client.core.kernels import make_kernel
from presto_client.core.predictor import CertaintyPredictor
from presto_client.core.rng import ChainRandomness
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.state import ChainState
from presto_client.core.tree import PlanContext, plan_bfs, plan_crn, plan_predictive

T = 10


def _context(sampler: str = "power_mh", seed: int = 0, depth_cap: int = 8) -> PlanContext:
    config = SamplerConfig(sampler=sampler, block_size=T, steps_per_block=depth_cap)
    kernel = make_kernel(config)
    rng = np.random.default_rng(seed)
    m = len(kernel.score_spec.temperatures)
    root = ChainState(
        (7, 7),
        ScoredTokens.exact(
            rng.integers(0, 5, T), -rng.random(T), -rng.random((T, m)), rng.random(T)
        ),
    )
    randomness = ChainRandomness(seed, kernel.sequences_per_proposal, m)
    return PlanContext(kernel, randomness, root, block=0, root_k=3, depth_cap=depth_cap)


def _expected_held_cut(ctx: PlanContext, path: tuple[bool, ...]) -> int:
    held = ctx.root.length
    for i, accepted in enumerate(path):
        if accepted:
            draws = ctx.randomness.node(ctx.block, ctx.root_k, path[:i])
            held = ctx.kernel.cut(ctx.root, draws.u_cut)
    return held


@pytest.mark.parametrize("rule", [plan_bfs, plan_predictive])
@pytest.mark.parametrize("seed", range(6))
def test_tree_plans_are_feasible_closed_and_capped(rule, seed: int) -> None:  # type: ignore[no-untyped-def]
    ctx = _context(seed=seed, depth_cap=4)
    plan = rule(ctx, 12)
    paths = {p.path for p in plan.proposals}
    assert () in paths and len(paths) == len(plan.proposals) <= 12
    for p in plan.proposals:
        assert p.path is not None and len(p.path) == p.depth < 4
        assert p.path[:-1] in paths or p.depth == 0  # parent selected: the set is a rooted subtree
        assert p.held_cut == _expected_held_cut(ctx, p.path)
        assert p.cut <= p.held_cut  # Condition 1
        (request,) = p.requests
        assert request.prefix == ctx.root.prefix(p.cut)
        assert request.num_tokens == T - p.cut
        assert request.seed == ctx.randomness.node(0, 3, p.path).seeds[0]
        assert plan.lookup(p.path) is p
    assert plan.lookup((True,) * 5) is None


@pytest.mark.parametrize("seed", range(6))
def test_bfs_prunes_below_infeasible_nodes_and_goes_breadth_first(seed: int) -> None:
    ctx = _context(seed=seed, depth_cap=6)
    plan = plan_bfs(ctx, 20)
    depths = [p.depth for p in plan.proposals]
    assert depths == sorted(depths)
    selected = {p.path for p in plan.proposals}
    # Every selected node's ancestors were feasible, and any feasible node whose parent was
    # selected is selected unless the budget ran out first.
    budget_full = len(plan.proposals) == 20
    for p in plan.proposals:
        for child in ((*p.path, True), (*p.path, False)):
            if child in selected or len(child) >= 6:
                continue
            draws = ctx.randomness.node(0, 3, child)
            held = _expected_held_cut(ctx, child)
            feasible = ctx.kernel.cut(ctx.root, draws.u_cut) <= held
            assert budget_full or not feasible


def test_depth_caps_bound_every_rule() -> None:
    ctx = _context(depth_cap=2)
    assert max(p.depth for p in plan_bfs(ctx, 16).proposals) <= 1
    assert max(p.depth for p in plan_predictive(ctx, 16).proposals) <= 1
    assert len(plan_crn(ctx, 16).proposals) == 2
    assert len(plan_crn(_context(depth_cap=8), 5).proposals) == 5


def test_crn_plans_one_request_per_depth_with_the_transition_draws() -> None:
    ctx = _context(sampler="multi_try_mh", depth_cap=6)
    plan = plan_crn(ctx, 4)
    assert plan.per_depth and len(plan.proposals) == 4
    for d, p in enumerate(plan.proposals):
        draws = ctx.randomness.transition(0, 3 + d)
        assert p.draws == draws
        assert len(p.requests) == ctx.kernel.config.k_try
        assert [r.seed for r in p.requests] == list(draws.seeds)
        temps = ctx.kernel.config.temperatures
        assert [r.temperature for r in p.requests] == [temps[i] for i in draws.temperature_index]
        # The same proposal serves every node at its depth, whatever the path.
        assert plan.lookup((True,) * d) is p and plan.lookup((False,) * d) is p
    assert plan.lookup((False,) * 4) is None


def _brute_force_best_reach(ctx: PlanContext, n_pf: int, predictor: CertaintyPredictor) -> float:
    depth = ctx.depth_cap
    nodes = [p for d in range(depth) for p in itertools.product((True, False), repeat=d)]
    cut = {p: ctx.kernel.cut(ctx.root, ctx.randomness.node(0, ctx.root_k, p).u_cut) for p in nodes}
    feasible = {p: cut[p] <= _expected_held_cut(ctx, p) for p in nodes}

    def reach(path: tuple[bool, ...]) -> float:
        r = 1.0
        for i, accepted in enumerate(path):
            h = predictor.branch_probability(cut[path[:i]] / T)
            r *= h if accepted else 1.0 - h
        return r

    best = 0.0
    candidates = [p for p in nodes if feasible[p] and p != ()]
    for size in range(0, min(n_pf, len(candidates) + 1)):
        for subset in itertools.combinations(candidates, size):
            chosen = {(), *subset}
            if all(p[:-1] in chosen for p in subset):
                best = max(best, sum(reach(p) for p in chosen))
    return best


@pytest.mark.parametrize("n_pf", [2, 4, 6])
@pytest.mark.parametrize("seed", range(4))
def test_predictive_selection_equals_brute_force(seed: int, n_pf: int) -> None:
    ctx = _context(seed=seed, depth_cap=4)
    predictor = CertaintyPredictor.paper("power_mh")
    plan = plan_predictive(ctx, n_pf)
    achieved = sum(p.reach for p in plan.proposals)
    assert achieved == pytest.approx(_brute_force_best_reach(ctx, n_pf, predictor), rel=1e-12)


def test_predictor_branch_probabilities() -> None:
    predictor = CertaintyPredictor.paper("power_mh")
    p = predictor.probabilities(0.5)
    assert sum(p) == pytest.approx(1.0)
    # Late cuts (short suffixes) are more often accepted than early ones.
    assert predictor.branch_probability(0.95) > predictor.branch_probability(0.05)
    assert 0.0 <= predictor.branch_probability(0.0) <= 1.0
