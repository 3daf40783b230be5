"""The walk as the speed policy sees it: :class:`Face`, the read-only
:class:`~presto_client.core.stream.view.WalkView` and the
:class:`~presto_client.core.stream.view.ProposalSink` over one
:class:`~presto_client.core.stream.walk.StreamRunner` (apart from the walk so that the walk's
module keeps to what it decides)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from presto_client.core.kernels import Kernel
from presto_client.core.rng import TransitionDraws
from presto_client.core.settings import SamplerConfig
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.core.stats import ChainStats
from presto_client.core.stream.flight import InFlight
from presto_client.core.stream.view import Proposal


class _Walk(Protocol):
    """What :class:`Face` reads of the walk (:class:`~presto_client.core.stream.walk.
    StreamRunner`, not imported: the walk imports this module)."""

    kernel: Kernel
    budget: SpeculationBudget
    config: SamplerConfig
    window: int | None
    stats: ChainStats
    _window: dict[int, InFlight]
    _branches: dict[int, tuple[InFlight, dict[int, InFlight]]]
    _ahead: dict[int, InFlight]
    _block: int

    def _transition_draws(self, block: int, k: int) -> TransitionDraws: ...

    def _ready(self, cut: int, received: int) -> bool: ...

    def _usable(self, flight: InFlight, state: ChainState) -> bool: ...

    def propose(self, proposal: Proposal) -> InFlight: ...

    def withdraw(self, base: int) -> None: ...

    def refused(self, k: int, first: bool) -> None: ...


class Face:
    """The walk as the policy sees it: read-only, plus the three requests of the sink."""

    __slots__ = ("_walk",)

    def __init__(self, walk: _Walk) -> None:
        self._walk = walk

    @property
    def kernel(self) -> Kernel:
        return self._walk.kernel

    @property
    def budget(self) -> SpeculationBudget:
        return self._walk.budget

    @property
    def steps(self) -> int:
        return self._walk.config.steps_per_block

    @property
    def block_size(self) -> int:
        return self._walk.config.block_size

    @property
    def cap(self) -> int | None:
        return self._walk.window

    @property
    def accepts(self) -> int:
        return self._walk.stats.accepts

    @property
    def transitions(self) -> int:
        return self._walk.stats.transitions

    @property
    def window(self) -> Mapping[int, InFlight]:
        return self._walk._window

    @property
    def branches(self) -> Mapping[int, tuple[InFlight, Mapping[int, InFlight]]]:
        return self._walk._branches

    @property
    def ahead(self) -> Mapping[int, InFlight]:
        return self._walk._ahead

    def draws(self, k: int) -> TransitionDraws:
        return self._walk._transition_draws(self._walk._block, k)

    def next_draws(self, k: int) -> TransitionDraws:
        return self._walk._transition_draws(self._walk._block + 1, k)

    def ready(self, cut: int, received: int) -> bool:
        return self._walk._ready(cut, received)

    def usable(self, flight: InFlight, state: ChainState) -> bool:
        return self._walk._usable(flight, state)

    def propose(self, proposal: Proposal) -> InFlight:
        """The walk's :meth:`propose`. The policy took the proposal's slots of the engine's
        budget before asking: a proposal the walk refuses (the policy's bug, raised) or fails
        to issue gives them back, or every chain on that engine would lose them for good."""
        walk = self._walk
        issued = walk.stats.requests_issued
        try:
            return walk.propose(proposal)
        except BaseException:
            if walk.stats.requests_issued == issued:  # (not issued: its slots never used)
                walk.budget.release(walk.kernel.sequences_per_proposal)
            raise

    def withdraw(self, base: int) -> None:
        self._walk.withdraw(base)

    def refused(self, k: int, first: bool) -> None:
        self._walk.refused(k, first)
