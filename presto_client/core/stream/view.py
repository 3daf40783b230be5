"""What the speed policy sees of the walk, and the one thing it can do: propose.

The policy (:mod:`presto_client.core.stream.policy`) reads the walk through :class:`WalkView`
(read-only: the kernel, the engine's budget, the window and the accept branches in flight) and
acts only through :class:`ProposalSink`: it proposes a request (:class:`Proposal`: which
transition, from which state, at what cut), withdraws an accept branch it no longer wants, and
reports what the engine's budget refused. The walk (:mod:`presto_client.core.stream.walk`)
implements both, checks every proposal against the rule before it issues it, and is the only
writer of what is in flight.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from presto_client.core.kernels import Kernel
from presto_client.core.rng import TransitionDraws
from presto_client.core.speculation import SpeculationBudget
from presto_client.core.state import ChainState
from presto_client.core.stream.flight import InFlight


class Origin(enum.Enum):
    """Where a proposal's prefix comes from (the walk checks it against its own copy)."""

    STATE = "state"
    """The state the walk holds at its head transition."""
    EXTENSION = "extension"
    """The block's extension, as far as it has been received."""
    BRANCH = "branch"
    """The state an in-flight proposal's accept would make: its prefix, then the tokens of one
    of its sequences received so far (an accept branch)."""
    NEXT_BLOCK = "next_block"
    """The state the walk holds at its head transition, for a transition of the next block
    whose cut lies in this state's response (its prefix is this state's, the request's length
    the response's once the next extension is in)."""


@dataclass(frozen=True, slots=True)
class Proposal:
    """A request the policy asks the walk to issue: transition ``k``'s proposal from ``state``
    at ``cut``. The walk draws the transition's randomness and builds the request itself."""

    k: int
    cut: int
    state: ChainState
    """The state the policy took the prefix from (the tokens before ``cut`` count)."""
    origin: Origin = Origin.STATE
    base: int = -1
    """An accept branch: the transition whose accept it assumes."""
    candidate: int = -1
    """An accept branch: the sequence of ``base``'s proposal whose tokens follow its cut."""


class WalkView(Protocol):
    """The walk, read-only."""

    @property
    def kernel(self) -> Kernel: ...

    @property
    def budget(self) -> SpeculationBudget: ...

    @property
    def steps(self) -> int:
        """Transitions per block."""
        ...

    @property
    def block_size(self) -> int:
        """Tokens a block's extension adds to the response."""
        ...

    @property
    def cap(self) -> int | None:
        """The most proposals in flight (the walk's own included); ``None``: no cap."""
        ...

    @property
    def accepts(self) -> int:
        """Accepts of the chain so far (with :attr:`transitions`: its acceptance rate)."""
        ...

    @property
    def transitions(self) -> int: ...

    @property
    def window(self) -> Mapping[int, InFlight]:
        """Proposals in flight for the transitions ahead of the walk, by transition."""
        ...

    @property
    def branches(self) -> Mapping[int, tuple[InFlight, Mapping[int, InFlight]]]:
        """Accept branches by the transition whose accept they assume: its proposal, and the
        proposals of later transitions issued from the state that accept would make."""
        ...

    @property
    def ahead(self) -> Mapping[int, InFlight]:
        """The next block's proposals in flight, by transition."""
        ...

    def draws(self, k: int) -> TransitionDraws:
        """Transition ``k``'s draws in the block the walk is in."""
        ...

    def next_draws(self, k: int) -> TransitionDraws:
        """Transition ``k``'s draws in the next block."""
        ...

    def ready(self, cut: int, received: int) -> bool:
        """Whether a proposal at ``cut`` can be requested with ``received`` tokens in."""
        ...

    def usable(self, flight: InFlight, state: ChainState) -> bool:
        """Whether ``flight`` is the request the sequential chain makes from ``state``."""
        ...


class ProposalSink(Protocol):
    """What the policy may ask of the walk."""

    def propose(self, proposal: Proposal) -> InFlight:
        """Issue ``proposal`` (after the walk's check: an error if it breaks the rule)."""
        ...

    def withdraw(self, base: int) -> None:
        """Close the accept branch of transition ``base``."""
        ...

    def refused(self, k: int, first: bool) -> None:
        """The engine's budget refused transition ``k``'s proposal (``first``: the first
        refusal of this pass), so that a wait for it is counted as the budget's."""
        ...
