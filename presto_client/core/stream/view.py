"""What the speed policy sees of the walk, and what it answers: a snapshot in, a plan out.

The policy (:mod:`presto_client.core.stream.policy`) is given a :class:`WalkSnapshot` (the
kernel, the walk's position, what is in flight as read-only mappings, the transitions' draws
and the engine's marginal cost: no budget to take from, no walk to call) and returns a
:class:`Plan`: the proposals it wants, in order, each with why (how likely it is used), and the
accept branches to withdraw. The walk (:mod:`presto_client.core.stream.walk`) alone carries a
plan out: it takes each proposal's slots of the engine's budget, checks the proposal against
the rule, issues it, and gives the slots back if it is not issued. So the policy can neither
hold a slot nor change what is in flight.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from presto_client.core.kernels import Kernel
from presto_client.core.rng import TransitionDraws
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
    """A request the policy wants issued: transition ``k``'s proposal from ``state`` at
    ``cut``. The walk draws the transition's randomness and builds the request itself."""

    k: int
    cut: int
    state: ChainState
    """The state the policy took the prefix from (the tokens before ``cut`` count)."""
    origin: Origin = Origin.STATE
    base: int = -1
    """An accept branch: the transition whose accept it assumes."""
    candidate: int = -1
    """An accept branch: the sequence of ``base``'s proposal whose tokens follow its cut."""
    survival: float | None = None
    """Why it is wanted: how likely the walk uses it (the budget weighs its cost against it)."""
    reserved: int = 0
    """Slots the budget keeps for earlier transitions whose prefix is not in yet."""
    limit: int | None = None
    """Issued only while fewer proposals than this are in flight (``None``: no limit)."""
    group: int = 0
    """Proposals of one group go out in order: once one is refused, the rest of it wait."""


@dataclass(frozen=True, slots=True)
class Withdrawal:
    """Close the accept branch of transition ``base`` (its accept became unlikely)."""

    base: int


@dataclass(slots=True)
class Plan:
    """What the policy wants, in the order the walk carries it out."""

    steps: list[Proposal | Withdrawal] = field(default_factory=list)
    report_refusals: bool = False
    """A refused group's proposals are noted as the budget's (a wait for them is counted so)."""


class WalkSnapshot(NamedTuple):
    """The walk at one moment, read-only: all the policy is given."""

    kernel: Kernel
    steps: int
    """Transitions per block."""
    block_size: int
    """Tokens a block's extension adds to the response."""
    cap: int | None
    """The most proposals in flight (the walk's own included); ``None``: no cap."""
    accepts: int
    """Accepts of the chain so far (with :attr:`transitions`: its acceptance rate)."""
    transitions: int
    window: Mapping[int, InFlight]
    """Proposals in flight for the transitions ahead of the walk, by transition."""
    branches: Mapping[int, tuple[InFlight, Mapping[int, InFlight]]]
    """Accept branches by the transition whose accept they assume: its proposal, and the
    proposals of later transitions issued from the state that accept would make."""
    ahead: Mapping[int, InFlight]
    """The next block's proposals in flight, by transition."""
    block: int
    draws_of: Callable[[int, int], TransitionDraws]
    """A transition's keyed draws by (block, transition): a pure function of the chain's seed."""
    usable: Callable[[InFlight, ChainState], bool]
    """Whether a proposal is the request the sequential chain makes from a state (the rule)."""
    marginal_cost: Callable[[int], float]
    """The engine budget's :meth:`~presto_client.core.speculation.SpeculationBudget.
    marginal_cost`, a read."""

    def draws(self, k: int) -> TransitionDraws:
        """Transition ``k``'s draws in the block the walk is in."""
        return self.draws_of(self.block, k)

    def next_draws(self, k: int) -> TransitionDraws:
        """Transition ``k``'s draws in the next block."""
        return self.draws_of(self.block + 1, k)


def ready(cut: int, received: int) -> bool:
    """Whether a proposal at ``cut`` can be requested with ``received`` response tokens in: its
    prefix (the tokens before the cut) must all be there."""
    return cut <= received
