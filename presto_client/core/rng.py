"""Randomness keyed by transition (and, for the paper's trees, by node off the all-reject path).

Every random draw a chain makes is a pure function of ``(chain seed, key)``; no generator state
is carried between transitions. So the draws of transition ``k`` of block ``ℓ`` are the same
however transitions are grouped into engine calls: this is what lets the sequential sampler and
PreSTO-``crn`` replay the same chain, and what keeps every tree node's draws independent of
the draws that decided whether the walk reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_TAG_TRANSITION = 1
_TAG_EXTEND = 2
_TAG_NODE = 3
_SEED_LIMIT = 2**31 - 1  # engines take a signed 32-bit seed


@dataclass(frozen=True, slots=True)
class TransitionDraws:
    """All draws of one MH transition, fixed before the transition happens."""

    u_cut: float
    """Uniform that picks the cut: through the inverse CDF of a law of the length alone, or as
    the key of EntropyCut's exponential race (:func:`~presto_client.core.kernels.race_times`)."""
    seeds: tuple[int, ...]
    """Proposal seed(s): one, or one per MultiTryMH candidate."""
    temperature_index: tuple[int, ...]
    """MultiTryMH: index into the temperature list for each candidate."""
    u_select: float
    """MultiTryMH: uniform that selects a candidate."""
    u_accept: float
    """Uniform of the accept/reject decision (accept iff ``log u < log A``)."""


def _generator(seed: int, key: tuple[int, ...]) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _draws(rng: np.random.Generator, k_try: int, num_temperatures: int) -> TransitionDraws:
    # The same number of draws in the same order for every sampler, so the layout is stable.
    u_cut = float(rng.random())
    seeds = tuple(int(s) for s in rng.integers(0, _SEED_LIMIT, size=k_try))
    temps = tuple(int(i) for i in rng.integers(0, num_temperatures, size=k_try))
    u_select = float(rng.random())
    # 1 - U lies in (0, 1]: log u is finite.
    u_accept = float(1.0 - rng.random())
    return TransitionDraws(u_cut, seeds, temps, u_select, u_accept)


@dataclass(frozen=True, slots=True)
class ChainRandomness:
    """The keyed draws of one chain."""

    seed: int
    k_try: int = 1
    num_temperatures: int = 1

    def transition(self, block: int, k: int) -> TransitionDraws:
        """Draws of transition ``k`` of ``block`` (sequential and ``crn``)."""
        return _draws(
            _generator(self.seed, (_TAG_TRANSITION, block, k)), self.k_try, self.num_temperatures
        )

    def node(self, block: int, root_k: int, path: tuple[bool, ...]) -> TransitionDraws:
        """Draws of the tree node reached from the round rooted at ``root_k`` along ``path``.

        ``path`` lists the decisions from the root (``True`` = accept). A node with no accept on
        its path (the root, and the all-reject spine below it) holds the root's state, so it is
        the transition the sequential chain makes from that state: its draws are that
        transition's (:meth:`transition`), and a round that speculates nothing is the
        sequential chain's transition, token for token. Every other path has its own key
        (encoded with a leading 1 bit). Each transition of a chain still takes one key used by
        no other transition (a spine node at depth ``d`` is transition ``root_k + d``, which is
        visited once, at that node or as a later round's root), so the draws stay fresh.
        """
        if not any(path):
            return self.transition(block, root_k + len(path))
        code = 1
        for accepted in path:
            code = (code << 1) | int(accepted)
        return _draws(
            _generator(
                self.seed, (_TAG_NODE, block, root_k, len(path), code & 0xFFFFFFFF, code >> 32)
            ),
            self.k_try,
            self.num_temperatures,
        )

    def extension_seed(self, block: int) -> int:
        """Seed of the fixed-length extension that opens ``block``."""
        return int(_generator(self.seed, (_TAG_EXTEND, block)).integers(0, _SEED_LIMIT))


def chain_seeds(root_seed: int, count: int) -> list[int]:
    """Split one root seed into ``count`` independent chain seeds (numpy ``SeedSequence``)."""
    children = np.random.SeedSequence(root_seed).spawn(count)
    return [int(c.generate_state(1, dtype=np.uint32)[0] & _SEED_LIMIT) for c in children]
