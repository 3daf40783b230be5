"""The rule the ``stream`` traversal's law rests on, in one place.

A proposal for transition ``m`` is the request the sequential chain makes at ``m`` iff it has
``m``'s draws, the tokens before its cut are those of the state the walk holds at ``m``, and its
cut is the one the kernel's cut law draws from ``m``'s uniform on that state (for a law of the
length alone, such as PowerMH's, the cut follows from the length; for EntropyCut it must be
checked). Then it is the same request (same prefix, same seed, same length), and the chain is
the sequential chain's token for token, whatever was in flight and whenever it arrived.

The walk (:mod:`presto_client.core.stream.walk`) applies :func:`usable` where a proposal is used
and whenever its state changes, and :func:`admission_problem` where a proposal enters what is in
flight. A failed check at use means a bug (the window keeps only usable proposals), and is a
:class:`StreamRuleError` naming the transition, never a silent wrong sample.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from presto_client.core.kernels import Kernel
from presto_client.core.state import ChainState
from presto_client.core.stream.flight import InFlight


class StreamRuleError(RuntimeError):
    """Internal error: a proposal broke the rule where it entered the walk or was used."""

    def __init__(self, k: int, what: str) -> None:
        super().__init__(
            f"stream walk, transition {k}: {what} (an internal error of the stream traversal: "
            "its speed policy or walk is wrong; nothing was sampled from it)"
        )
        self.k = k


def usable(kernel: Kernel, flight: InFlight, state: ChainState) -> bool:
    """Whether ``flight`` is the request the sequential chain makes from ``state`` at its
    transition: the same tokens before the cut, and the cut the law draws there."""
    if not follows(flight, state):
        return False
    return kernel.cut(state, flight.draws.u_cut) == flight.cut


def follows(flight: InFlight, state: ChainState, length: int | None = None) -> bool:
    """Whether ``state``'s response has the tokens ``flight`` was issued after (and, given
    ``length``, ``flight`` fills a response of that length from its cut): a proposal for the
    next block, issued before this block ended, may join that block's window only so; its
    cut is checked against the law once the next extension is in (:func:`usable`)."""
    if length is not None and (
        flight.error is not None
        or any(r.num_tokens != length - flight.cut for r in flight.requests)
    ):
        return False
    return bool(np.array_equal(state.response.token_ids[: flight.cut], flight.response_prefix))


def admission_problem(
    kernel: Kernel,
    state: ChainState,
    cut: int,
    source: ChainState,
    received: int,
    length: int,
    u_cut: float,
    ready: Callable[[int, int], bool],
) -> str | None:
    """Why a proposal at ``cut`` from ``state`` may not enter (``None``: it may).

    ``source``: the walk's own copy of the state the proposal says it comes from (``received``
    of its tokens are in; ``length`` once complete). The prefix must be in, be ``source``'s, and
    the cut must be the one the law draws on it from the transition's uniform ``u_cut`` (for a
    response still streaming, the kernel's speculative cut: checked again where it is used)."""
    if not ready(cut, received):
        return f"its cut {cut} lies past the {received} tokens of its state received so far"
    same = state is source or (
        state.prompt == source.prompt
        and np.array_equal(state.response.token_ids[:cut], source.response.token_ids[:cut])
    )
    if not same:
        return f"its prefix (cut {cut}) is not the walk's: it was taken from another state"
    law = kernel.speculative_cut(source, length, u_cut)
    if law != cut:
        return f"its cut is {cut}, and the cut law draws {law} from the transition's uniform"
    return None
