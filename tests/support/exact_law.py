"""Exact laws on enumerable states: the ground truth of the exactness tests.

For a :class:`~presto_client.core.reference.ReferenceModel` with a tiny vocabulary and short
responses, every state can be listed, so the one-step transition matrix of each sampler, the
target ``π_α`` and the exact law of the chain after ``K`` transitions can be computed. The
matrices are built from the production kernels' own ``log A`` (and MultiTryMH weights), with
proposal probabilities taken from the model directly; detailed balance against ``π_α`` then
checks the kernels, and the law after ``K`` steps checks the runners.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from presto_client.core.engine_protocol import FloatArray, ScoredTokens, ScoreSpec
from presto_client.core.kernels import Kernel, MultiTryMH, make_kernel
from presto_client.core.logprob_math import exact_scores
from presto_client.core.reference import ReferenceModel
from presto_client.core.rng import TransitionDraws
from presto_client.core.sampler_config import SamplerConfig
from presto_client.core.state import ChainState

_NEUTRAL_DRAWS = TransitionDraws(0.0, (0,), (0,), 0.5, 0.5)


def all_sequences(vocab_size: int, length: int) -> list[tuple[int, ...]]:
    return list(itertools.product(range(vocab_size), repeat=length))


def score_exact(
    model: ReferenceModel, prefix: Sequence[int], tokens: Sequence[int], spec: ScoreSpec
) -> ScoredTokens:
    rows = model.rows(prefix, tokens)
    logp0, logq, entropy = exact_scores(tokens, rows, spec.temperatures)
    return ScoredTokens.exact(tokens, logp0, logq, entropy if spec.entropy else None)


def log_target(
    model: ReferenceModel, prompt: Sequence[int], length: int, alpha: float
) -> FloatArray:
    """Unnormalised ``α·log p0(x)`` of every response of ``length`` (lexicographic order)."""
    return np.array(
        [alpha * model.sequence_logp0(prompt, x) for x in all_sequences(model.vocab_size, length)]
    )


def target(model: ReferenceModel, prompt: Sequence[int], length: int, alpha: float) -> FloatArray:
    """``π_α`` over every response of ``length``."""
    logits = log_target(model, prompt, length, alpha)
    w: FloatArray = np.exp(logits - logits.max())
    normalised: FloatArray = w / w.sum()
    return normalised


def _suffix_log_q(
    model: ReferenceModel, prefix: Sequence[int], suffixes: list[tuple[int, ...]], tau: float
) -> FloatArray:
    out = np.empty(len(suffixes))
    for i, s in enumerate(suffixes):
        rows = model.rows(prefix, s)
        _, logq, _ = exact_scores(s, rows, (tau,))
        out[i] = logq[:, 0].sum()
    return out


def kernel_matrix(
    model: ReferenceModel, prompt: Sequence[int], length: int, config: SamplerConfig
) -> FloatArray:
    """The one-step transition matrix of ``config``'s kernel on responses of ``length``."""
    kernel = make_kernel(config)
    states = all_sequences(model.vocab_size, length)
    index = {s: i for i, s in enumerate(states)}
    matrix = np.zeros((len(states), len(states)))
    spec = kernel.score_spec
    for i, x in enumerate(states):
        x_state = ChainState(tuple(prompt), score_exact(model, prompt, x, spec))
        for cut in range(length):
            log_cut = kernel.log_cut_probability(x_state, cut)
            if log_cut == -math.inf:
                continue
            prefix = tuple(prompt) + x[:cut]
            suffixes = all_sequences(model.vocab_size, length - cut)
            scored = [score_exact(model, prefix, s, spec) for s in suffixes]
            targets = [index[x[:cut] + s] for s in suffixes]
            if isinstance(kernel, MultiTryMH):
                moves = _multi_try_moves(model, kernel, x_state, cut, prefix, suffixes, scored)
            else:
                moves = _single_moves(kernel, x_state, cut, prefix, suffixes, scored, model)
            for j, p in zip(targets, moves, strict=True):
                matrix[i, j] += math.exp(log_cut) * p
        matrix[i, i] += 1.0 - matrix[i].sum()
    return matrix


def _single_moves(
    kernel: Kernel,
    x_state: ChainState,
    cut: int,
    prefix: tuple[int, ...],
    suffixes: list[tuple[int, ...]],
    scored: list[ScoredTokens],
    model: ReferenceModel,
) -> FloatArray:
    """``q(s)·min(1, A)`` for every suffix ``s`` at this cut."""
    log_q = _suffix_log_q(model, prefix, suffixes, kernel.tau)
    moves = np.empty(len(suffixes))
    for n, y in enumerate(scored):
        verdict = kernel.evaluate(x_state, cut, [y], _NEUTRAL_DRAWS)
        moves[n] = math.exp(log_q[n]) * min(1.0, math.exp(verdict.log_accept))
    return moves


def _multi_try_moves(
    model: ReferenceModel,
    kernel: MultiTryMH,
    x_state: ChainState,
    cut: int,
    prefix: tuple[int, ...],
    suffixes: list[tuple[int, ...]],
    scored: list[ScoredTokens],
) -> FloatArray:
    """Probability of moving to each suffix, summed over every tuple of ``k_try`` candidates."""
    q_mix = np.zeros(len(suffixes))
    for tau in kernel.temperatures:
        q_mix += np.exp(_suffix_log_q(model, prefix, suffixes, tau))
    q_mix /= len(kernel.temperatures)
    log_w, _ = kernel.log_weight_bounds(x_state, cut, scored)
    w = np.exp(log_w)
    n = len(suffixes)
    grid = np.indices((n,) * kernel.k_try).reshape(kernel.k_try, -1)  # [k_try, n^k_try]
    weights = w[grid]
    tuple_prob = np.prod(q_mix[grid], axis=0)
    total = weights.sum(axis=0)
    moves = np.zeros(n)
    for j in range(kernel.k_try):
        select = weights[j] / total
        accept = np.minimum(1.0, total / (total - weights[j] + 1.0))
        np.add.at(moves, grid[j], tuple_prob * select * accept)
    return moves


def extension_law(
    model: ReferenceModel,
    prompt: Sequence[int],
    law: FloatArray,
    length: int,
    block_size: int,
    tau: float,
) -> FloatArray:
    """Push a law over responses of ``length`` through a ``block_size``-token extension."""
    states = all_sequences(model.vocab_size, length)
    blocks = all_sequences(model.vocab_size, block_size)
    out = np.empty(len(states) * len(blocks))
    for i, x in enumerate(states):
        log_q = _suffix_log_q(model, tuple(prompt) + x, blocks, tau)
        out[i * len(blocks) : (i + 1) * len(blocks)] = law[i] * np.exp(log_q)
    return out


def _next_block(
    model: ReferenceModel,
    prompt: Sequence[int],
    law: FloatArray,
    length: int,
    config: SamplerConfig,
) -> tuple[FloatArray, int]:
    """A law over responses of ``length`` pushed through one block: its extension, then its
    ``K`` transitions; returns the new law and length."""
    law = extension_law(model, prompt, law, length, config.block_size, config.proposal_temperature)
    length += config.block_size
    matrix = kernel_matrix(model, prompt, length, config)
    for _ in range(config.steps_per_block):
        law = law @ matrix
    return law, length


def law_after(model: ReferenceModel, prompt: Sequence[int], config: SamplerConfig) -> FloatArray:
    """The exact law of a chain's full response after every block and its ``K`` transitions."""
    law, length = np.ones(1), 0
    for _ in range(config.num_blocks):
        law, length = _next_block(model, prompt, law, length, config)
    return law


def law_with_stop(
    model: ReferenceModel, prompt: Sequence[int], config: SamplerConfig
) -> dict[tuple[int, ...], float]:
    """The exact law of a finished chain's full response under the stop rule (method §2 step
    3): after each block's ``K`` transitions, a state holding ``config.eos_token_id`` is
    final; the others go on to the next block. Keys are full responses (their length tells the
    blocks run)."""
    eos = config.eos_token_id
    if eos is None or not config.stop_at_eos:
        raise ValueError("the stop rule needs an eos_token_id and stop_at_eos")
    outcomes: dict[tuple[int, ...], float] = {}
    law, length = np.ones(1), 0
    for block in range(config.num_blocks):
        law, length = _next_block(model, prompt, law, length, config)
        last = block + 1 == config.num_blocks
        for i, x in enumerate(all_sequences(model.vocab_size, length)):
            if law[i] > 0 and (last or eos in x):
                outcomes[x] = outcomes.get(x, 0.0) + float(law[i])
                law[i] = 0.0  # a stopped chain runs no further block
    return outcomes


def state_index(tokens: Sequence[int], vocab_size: int) -> int:
    """Position of a response in :func:`all_sequences` order."""
    index = 0
    for t in tokens:
        index = index * vocab_size + int(t)
    return index


def chi_square_test(counts: Sequence[int], probs: FloatArray, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square goodness of fit (Wilson–Hilferty approximation).

    Cells expected to hold fewer than ``min_expected`` samples are pooled into one cell.
    """
    counts_arr = np.asarray(counts, dtype=np.float64)
    n = counts_arr.sum()
    expected = n * np.asarray(probs, dtype=np.float64)
    small = expected < min_expected
    obs = list(counts_arr[~small])
    exp = list(expected[~small])
    if small.any():
        obs.append(counts_arr[small].sum())
        exp.append(expected[small].sum())
    obs_a, exp_a = np.array(obs), np.array(exp)
    keep = exp_a > 0
    if (obs_a[~keep] > 0).any():
        return 0.0  # a state with zero probability was observed
    stat = float(((obs_a[keep] - exp_a[keep]) ** 2 / exp_a[keep]).sum())
    df = int(keep.sum()) - 1
    if df <= 0:
        return 1.0
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))
