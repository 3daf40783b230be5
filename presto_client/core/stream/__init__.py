"""The ``stream`` traversal: PreSTO with a window of proposals streamed ahead of the walk.

Where the law is, and where the speed (``docs/exactness.md`` says which tests show what):

* the law: :mod:`.rule` (when a proposal is the request the sequential chain makes at its
  transition) and :mod:`.walk` (:class:`~.walk.StreamRunner`: transitions in order, every
  decision the kernel's against the state it holds; the only writer of what is in flight and
  the only taker of the engine's budget slots; it checks the rule where a proposal enters and
  again where it is used);
* the speed: :mod:`.policy` (what to propose: given a :mod:`.view` snapshot of the walk, it
  returns a plan),
  :mod:`.predictor` (how likely a head accepts, for accept branches), :mod:`.tuning` (every
  constant of the policy, with its reason) and the engine's shared budget
  (:mod:`presto_client.core.speculation`);
* plumbing: :mod:`.streams` (issuing, streaming, closing, records) and :mod:`.flight` (what is
  in flight).

The block's own generation is overlapped too. The extension streams in, and a transition whose
cut lies inside the prefix already received can have its proposal issued at once: those tokens
are the state's (a stream that breaks and restarts may rewrite them, which the walk's token check
catches), and the draws are the transition's, so it is the request the sequential chain will make
(for EntropyCut the cut is a guess from the received entropies, used only if the realised state
draws it). Decisions still wait for the whole extension: ``log A`` needs the state's suffix.

So is the head's accept branch. While the head's proposal (cut ``c``) streams in, the state its
accept would make is the head's prefix followed by the tokens received so far; a later
transition whose cut lies past ``c`` and inside them can have its proposal issued from that
state (the draws are the transition's: it is the request the sequential chain makes if the head
accepts). Most heads reject, so this is done only while the head is likely to accept
(:class:`~presto_client.core.stream.predictor.AcceptPredictor`, from its partial ``log A`` and the
transition's known uniform) and the engine's budget allows. Once the head is decided, an
accept-branch proposal is kept iff it passes the same check as every proposal against the
decided state (after a reject its prefix holds the head's tokens, so it is closed); the
predictor only decides what is issued.
"""

from presto_client.core.stream.tuning import DEFAULT_TUNING, StreamTuning
from presto_client.core.stream.walk import StreamRunner

__all__ = ["DEFAULT_TUNING", "StreamRunner", "StreamTuning"]
