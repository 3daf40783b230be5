"""The streamed chunks of all a replica's streams that arrive in one turn of the event loop,
parsed and scored in one vectorised pass.

A streamed chunk is a token or a few; parsing its rows into arrays and deriving its ``log q``
intervals costs some fifty numpy calls whatever its size, ~40 µs a chunk, four fifths of the
client's CPU per streamed token (``benchmarks/bench_client.py --cprofile``). The streams of a
GPU server's batch deliver their tokens together, one event each per decode step: the chunks
that completed in one turn are concatenated, parsed and scored once, and each stream gets its
rows back (views), one loop turn later.

Every row is computed by the same operations on the same values whatever the rows beside it
(the parse and the scores are row-wise), so a chunk's scores are bit-identical scored alone or
in a batch (``tests/backends/test_stream_scoring.py``). Anything unusual in a batch (a
malformed row, an impossible id, rows that do not match their tokens) hands every chunk of it
back unscored: each stream then parses its own chunk alone, which raises the precise error for
the stream at fault and scores the others.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from presto_client.backends.completions import (
    CanonicalKeys,
    fast_completion_logprobs,
    top_values_of_rows,
)
from presto_client.backends.parsing import check_token_ids
from presto_client.core.engine_protocol import ScoredTokens, ScoreSpec
from presto_client.core.scoring import scored_from_raw, scored_from_top_values


@dataclass(slots=True)
class _Chunk:
    choice: dict[str, Any]
    scores: ScoreSpec
    vocab_size: int | None
    future: asyncio.Future[ScoredTokens | None]


MAX_WAIT_S = 0.001
"""The longest a chunk waits for others (a decode step of a GPU server is 10-30 ms)."""
MAX_CHUNKS = 512
"""A pass scores at most this many chunks (its arrays stay small)."""


class StreamScorer:
    """Scores the chunks submitted in one loop turn together (see the module doc).

    A pass runs at the first turn of the loop that brought no new chunk (the reads of one
    burst of events are taken in over several turns), or once its first chunk has waited
    :data:`MAX_WAIT_S`, or at :data:`MAX_CHUNKS`.
    """

    def __init__(self, top_k: int) -> None:
        self.top_k = top_k
        self._pending: list[_Chunk] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seen = 0
        self._since = 0.0
        self.keys = CanonicalKeys()
        """vLLM's row keys seen so far (the replica's whole answers read them too)."""
        self.batches = 0
        """Passes run (with :attr:`chunks`: how many chunks a pass scored on average)."""
        self.chunks = 0

    def score(
        self, choice: dict[str, Any], scores: ScoreSpec, vocab_size: int | None
    ) -> asyncio.Future[ScoredTokens | None]:
        """The scores of ``choice`` (one chunk's rows in the completions shape: ``token_ids``,
        ``logprobs.token_logprobs``, ``logprobs.top_logprobs``), its ids checked against
        ``vocab_size`` (the engine's as now known), at the loop's next turn; ``None``: the
        batch held something unusual, parse and score this chunk alone."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ScoredTokens | None] = loop.create_future()
        if not self._pending or self._loop is not loop:
            # (A loop that closed with chunks pending left futures no one awaits.)
            self._pending = []
            self._loop = loop
            self._seen = 0
            self._since = loop.time()
            loop.call_soon(self._flush)
        self._pending.append(_Chunk(choice, scores, vocab_size, future))
        return future

    def _flush(self) -> None:
        pending, loop = self._pending, self._loop
        if loop is None or not pending or asyncio.get_running_loop() is not loop:
            return  # (a flush left on a loop the scorer has since moved from)
        if (
            len(pending) > self._seen
            and len(pending) < MAX_CHUNKS
            and loop.time() - self._since < MAX_WAIT_S
        ):
            self._seen = len(pending)  # chunks came in the last turn: more may come
            loop.call_soon(self._flush)
            return
        self._pending = []
        groups: dict[tuple[ScoreSpec, int | None], list[_Chunk]] = {}
        for chunk in pending:
            if not chunk.future.done():  # (a cancelled consumer)
                groups.setdefault((chunk.scores, chunk.vocab_size), []).append(chunk)
        for (scores, vocab_size), chunks in groups.items():
            try:
                results = self._scored(chunks, scores, vocab_size)
            except Exception:  # anything unforeseen: each stream parses its own, and says it
                results = [None] * len(chunks)
            for chunk, result in zip(chunks, results, strict=True):
                chunk.future.set_result(result)

    def _scored(
        self, chunks: list[_Chunk], scores: ScoreSpec, vocab_size: int | None
    ) -> list[ScoredTokens | None]:
        """The chunks' scores (``None`` each where the batch's rows are unusual); raises what
        the checks raise (the caller hands the chunks back unscored)."""
        self.batches += 1
        self.chunks += len(chunks)
        if len(chunks) == 1:
            choice = chunks[0].choice
            logprobs = choice["logprobs"]
            ids, values, rows = (
                choice["token_ids"],
                logprobs["token_logprobs"],
                logprobs["top_logprobs"],
            )
        else:
            ids, values, rows = [], [], []
            for chunk in chunks:
                ids += chunk.choice["token_ids"]
                logprobs = chunk.choice["logprobs"]
                values += logprobs["token_logprobs"]
                rows += logprobs["top_logprobs"]
        # The rows' values alone where their keys are vLLM's own (no id of a row parsed: half
        # of a pass's cost); anything else through the full parse.
        fast = top_values_of_rows(ids, values, rows, self.top_k, self.keys, vocab_size)
        if fast is not None:
            scored = scored_from_top_values(*fast, scores, vocab_size)
        else:
            choice = {
                "token_ids": ids,
                "logprobs": {"token_logprobs": values, "top_logprobs": rows},
            }
            raw = fast_completion_logprobs(choice, self.top_k, expect=None)
            if raw is None:
                return [None] * len(chunks)
            check_token_ids(raw, vocab_size, label="")
            scored = scored_from_raw(raw, scores, vocab_size)
        if len(chunks) == 1:
            return [scored]
        out: list[ScoredTokens | None] = []
        start = 0
        entropy = scored.entropy
        for chunk in chunks:
            end = start + len(chunk.choice["token_ids"])
            out.append(
                ScoredTokens(
                    scored.token_ids[start:end],
                    scored.logp0[start:end],
                    scored.logq_lo[start:end],
                    scored.logq_hi[start:end],
                    None if entropy is None else entropy[start:end],
                )
            )
            start = end
        return out
