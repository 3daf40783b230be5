"""The logprob block of OpenAI's completions shape (``choice.logprobs``: ``token_logprobs``,
``top_logprobs``, ``tokens``; vLLM adds ``choice.token_ids``) as :class:`TokenLogprobs`.

Shared by the dialects that answer in that shape (vLLM's, the generic OpenAI-compatible one);
pure functions, no I/O.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from presto_client.backends.parsing import (
    TokenLogprobs,
    check_length,
    dict_rows_flat,
    logprob_array,
    logprob_value,
    token_id_array,
    token_id_keys_array,
    token_id_value,
    topk_from_flat,
    topk_rows,
)
from presto_client.core.engine_protocol import FloatArray, IntArray
from presto_client.core.scoring import ROW_TOLERANCE
from presto_client.errors import InvalidResponseError


def parse_completion_logprobs(
    choice: dict[str, Any], k: int, *, label: str, expect: int | None
) -> TokenLogprobs:
    """A choice's ``logprobs`` block (legacy completions shape) as normalised records.

    The whole block is turned into arrays at once (:func:`fast_completion_logprobs`); anything
    unusual takes the per-token path, which raises the precise error.
    """
    fast = fast_completion_logprobs(choice, k, expect=expect)
    if fast is not None:
        return fast
    return completion_logprobs_per_token(choice, k, label=label, expect=expect)


def fast_completion_logprobs(
    choice: dict[str, Any], k: int, *, expect: int | None
) -> TokenLogprobs | None:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    token_logprobs = logprobs.get("token_logprobs")
    top = logprobs.get("top_logprobs")
    ids_field = choice.get("token_ids")
    if not isinstance(token_logprobs, list) or not isinstance(top, list):
        return None
    if not isinstance(ids_field, list):
        return None  # ids from logprobs.tokens: the per-token path
    n = len(ids_field)
    if (expect is not None and n != expect) or len(token_logprobs) != n or len(top) != n:
        return None
    ids = token_id_array(ids_field)
    values = logprob_array(token_logprobs)
    flat = dict_rows_flat(top)
    if ids is None or values is None or flat is None:
        return None
    keys, top_values, lengths = flat
    top_ids = token_id_keys_array(keys)
    top_lps = logprob_array(top_values)
    if top_ids is None or top_lps is None:
        return None
    rows = topk_from_flat(top_ids, top_lps, lengths, k)
    if rows is None:
        return None
    return TokenLogprobs(ids, values, rows[0], rows[1])


def completion_logprobs_per_token(
    choice: dict[str, Any], k: int, *, label: str, expect: int | None
) -> TokenLogprobs:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise InvalidResponseError(f"{label}: the response carries no logprobs")
    token_logprobs = logprobs.get("token_logprobs")
    tokens = logprobs.get("tokens")
    top = logprobs.get("top_logprobs")
    if not isinstance(token_logprobs, list) or not isinstance(top, list):
        raise InvalidResponseError(f"{label}: logprobs.token_logprobs/top_logprobs missing")
    ids_field = choice.get("token_ids")
    if isinstance(ids_field, list):
        ids = [token_id_value(t, label=label, what="token_ids") for t in ids_field]
    elif isinstance(tokens, list):
        ids = [token_id_value(t, label=label, what="logprobs.tokens") for t in tokens]
    else:
        raise InvalidResponseError(f"{label}: no token ids (return_token_ids ignored?)")
    n = len(ids)
    if expect is not None:
        check_length(n, expect, label=label)
    if len(token_logprobs) != n or len(top) != n:
        raise InvalidResponseError(
            f"{label}: {n} tokens but {len(token_logprobs)} logprobs and {len(top)} top-K rows"
        )
    values = np.array(
        [logprob_value(v, label=label, what=f"token {i}") for i, v in enumerate(token_logprobs)],
        dtype=np.float64,
    )
    rows: list[list[tuple[int, float]]] = []
    for i, entry in enumerate(top):
        if not isinstance(entry, dict):
            raise InvalidResponseError(f"{label}: top_logprobs[{i}] is missing")
        row = [
            (
                token_id_value(key, label=label, what=f"top_logprobs[{i}] key"),
                logprob_value(v, label=label, what=f"top_logprobs[{i}]"),
            )
            for key, v in entry.items()
        ]
        rows.append(row)
    top_ids, top_lps = topk_rows(rows, k, label=label)
    return TokenLogprobs(np.asarray(ids, dtype=np.int64), values, top_ids, top_lps)


class CanonicalKeys:
    """The ``token_id:<id>`` keys (vLLM's top-K rows) seen so far in canonical form: the prefix
    and the id's decimal digits, no sign, no leading zero, the id inside the vocabulary as known
    when the key was first seen.

    A row whose keys are all canonical lists no id twice (a dict holds a key once, and a
    canonical key is the only spelling of its id), every id is a token, and its values alone
    decide the scores: :func:`top_values_of_rows` then never parses an id. Bounded by the
    vocabulary (the keys a server can send); cleared past :data:`LIMIT` or when the vocabulary
    as known shrinks below an id already taken."""

    LIMIT = 1 << 18

    __slots__ = ("_keys", "_largest")

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._largest = -1

    def cover(self, rows: list[dict[str, Any]], vocab_size: int | None) -> bool:
        """Whether every key of ``rows`` is canonical (learning the ones not seen before)."""
        if vocab_size is not None and self._largest >= vocab_size:
            self._keys.clear()
            self._largest = -1
        keys = self._keys
        if keys.issuperset(chain.from_iterable(rows)):
            return True
        new = list(set(chain.from_iterable(rows)) - keys)
        ids = token_id_keys_array(new)
        if ids is None:
            return False
        listed = ids.tolist()
        if any(key[_PREFIX_LEN:] != str(i) for key, i in zip(new, listed, strict=True)):
            return False
        largest = max(listed)
        if vocab_size is not None and largest >= vocab_size:
            return False
        if len(keys) + len(new) > self.LIMIT:
            keys.clear()
            self._largest = -1
        keys.update(new)
        self._largest = max(self._largest, largest)
        return True


_PREFIX_LEN = len("token_id:")


def top_values_of_rows(
    token_ids: list[Any],
    token_logprobs: list[Any],
    rows: list[Any],
    k: int,
    known: CanonicalKeys,
    vocab_size: int | None,
) -> tuple[IntArray, FloatArray, FloatArray] | None:
    """``(token ids, their logprobs, [n, k] top-K values)`` of streamed rows in vLLM's shape,
    without parsing an id of the rows; ``None`` when anything is unusual (the caller then takes
    :func:`fast_completion_logprobs`, whose checks raise the precise error).

    The top values are those :func:`~presto_client.backends.parsing.topk_from_flat` keeps,
    value for value (decreasing; the ids that break its ties do not change a value), so the
    scores derived from them are bit-identical. Its checks are kept: ids are tokens and
    listed once (:class:`CanonicalKeys`), values are logprobs, and each sampled token's own
    entry in its row (vLLM always lists it) equals its logprob, which implies
    :func:`~presto_client.core.scoring.check_rows_match_tokens`."""
    n = len(rows)
    if k <= 0 or n == 0 or len(token_ids) != n or len(token_logprobs) != n:
        return None
    if not all(type(row) is dict for row in rows):
        return None
    ids = token_id_array(token_ids)
    logprobs = logprob_array(token_logprobs)
    if ids is None or logprobs is None or not known.cover(rows, vocab_size):
        return None
    if vocab_size is not None and int(ids.max()) >= vocab_size:
        return None
    own = logprob_array([row.get(f"token_id:{t}") for row, t in zip(rows, token_ids, strict=True)])
    values = logprob_array(list(chain.from_iterable(map(dict.values, rows))))
    if own is None or values is None:
        return None  # (a sampled token missing from its row: None among the values)
    # (only where the logprob is finite, as the full parse's check: -inf - -inf is no gap)
    gap = np.subtract(logprobs, own, out=np.zeros(n), where=np.isfinite(logprobs))
    if not bool((np.abs(gap) <= ROW_TOLERANCE).all()):
        return None
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=n)
    width = int(lengths.max())
    if int(lengths.min()) == width:
        top = values.reshape(n, width)
        if width > 1 and not bool((top[:, 1:] <= top[:, :-1]).all()):
            top = -np.sort(-top, axis=1)
    else:
        padded = np.full((n, width), -np.inf)
        padded[np.arange(width) < lengths[:, None]] = values
        top = -np.sort(-padded, axis=1)
    if width > k:
        # The full parse cuts rows to K: a sampled token cut from its row (at or below the
        # K-th value) is checked against that value instead, in its own arithmetic.
        kth = top[:, k - 1]
        cut = (lengths > k) & (own <= kth) & np.isfinite(logprobs)
        if bool((cut & ~(logprobs <= kth + ROW_TOLERANCE)).any()):
            return None
    if width >= k:
        return ids, logprobs, top[:, :k]
    out = np.full((n, k), -np.inf)
    out[:, :width] = top
    return ids, logprobs, out
