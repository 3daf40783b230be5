"""The parsing toolkit of the dialects: the normalised record every parser returns, and the
pure helpers that turn a decoded JSON logprob block into it (no I/O).

:class:`TokenLogprobs` holds the token ids, the logprob the engine returned for each (raw
``log p0`` or temperature-scaled ``log q_τ``, as the adapter's semantics says), and the returned
top-K, deduplicated by token id, sorted, cut to the K asked for and padded with ``-inf``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from presto_client.core.engine_protocol import FloatArray, IntArray
from presto_client.core.scoring import TokenLogprobs
from presto_client.errors import InvalidResponseError

# vLLM writes -inf as -9999.0 (OpenAI's convention); SGLang clamps it to float32's minimum.
SENTINEL_THRESHOLD = -9999.0
FLOAT32_MIN = -3.4028234663852886e38

__all__ = ["TokenLogprobs"]  # (the record is the core's; the parsers build it)


def logprob_value(value: Any, *, label: str, what: str) -> float:
    """A returned logprob as a float: sentinels become ``-inf``; missing or NaN raise."""
    if value is None:
        raise InvalidResponseError(f"{label}: missing logprob ({what})")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidResponseError(f"{label}: logprob is not a number ({what}): {value!r}")
    x = float(value)
    if math.isnan(x):
        raise InvalidResponseError(f"{label}: NaN logprob ({what}); the engine failed on it")
    if x <= SENTINEL_THRESHOLD:
        return -math.inf
    if x > 1e-3:  # a logprob is <= 0; allow rounding noise
        raise InvalidResponseError(f"{label}: positive logprob {x} ({what})")
    return min(x, 0.0)


def check_token_ids(
    raw: TokenLogprobs, vocab_size: int | None, *, label: str, engine: str = ""
) -> TokenLogprobs:
    """``raw`` if every id in it can be a token: none negative (``-1`` pads a top-K row) and,
    when the vocabulary size is known (the config's, or the server's own: :mod:`.vocabulary`),
    none at or past it; :class:`InvalidResponseError` naming the engine, the first impossible id
    and the check otherwise (a stored sample would carry it, unreadable)."""
    for ids, floor, what in ((raw.token_ids, 0, "token"), (raw.top_ids, -1, "top-K")):
        if not ids.size:
            continue
        low, high = int(ids.min()), int(ids.max())
        if low < floor:
            raise InvalidResponseError(
                f"{label}: the server returned {what} id {low}, negative (the token-id check): "
                "a broken server",
                engine=engine,
            )
        if vocab_size is not None and high >= vocab_size:
            raise InvalidResponseError(
                f"{label}: the server returned {what} id {high}, outside the model's "
                f"vocabulary of {vocab_size} tokens (the vocab_size check): another model "
                "answers than the one measured at start, or a broken server; if the "
                "vocabulary is larger, state it as engines[].vocab_size",
                engine=engine,
            )
    return raw


def token_id_value(value: Any, *, label: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str):
            text = value.removeprefix("token_id:")
            if text.lstrip("-").isdigit():
                return int(text)
        raise InvalidResponseError(f"{label}: token id is not an integer ({what}): {value!r}")
    return int(value)


BULK_ROW = 256
"""Entries from which a row is read in bulk (:func:`bulk_row`): a whole vocabulary's row
(49,152 entries for SmolLM2) read entry by entry cost 67 ms, and a whole-row scoring of a
proposal (a row per position) held the event loop 2.6 s."""


def bulk_row(entries: list[Any]) -> tuple[IntArray, FloatArray] | None:
    """A long row of ``{id, logprob}`` entries as arrays, with what :func:`token_id_value` and
    :func:`logprob_value` make of each (sentinels ``-inf``, rounding above 0 cut to 0); ``None``
    where an entry is anything else (read entry by entry then, for the exact error)."""
    try:
        raw_ids = [e["id"] for e in entries]
        raw_lps = [e["logprob"] for e in entries]
    except (TypeError, KeyError, IndexError):
        return None
    if not all(type(t) is int for t in raw_ids) or not all(type(x) is float for x in raw_lps):
        return None
    lps = np.asarray(raw_lps, dtype=np.float64)
    if np.isnan(lps).any() or (lps > 1e-3).any():
        return None
    lps = np.where(lps <= SENTINEL_THRESHOLD, -np.inf, np.minimum(lps, 0.0))
    return np.asarray(raw_ids, dtype=np.int64), lps


def topk_rows(
    rows: Sequence[Iterable[tuple[int, float]] | tuple[IntArray, FloatArray]],
    k: int,
    *,
    label: str,
) -> tuple[IntArray, FloatArray]:
    """``[n, k]`` ids and logprobs from per-position ``(id, logprob)`` pairs (or a row's
    arrays of them, :func:`bulk_row`).

    Duplicated ids (vLLM's sampled token repeated among the top-K, key collisions) are merged;
    the entries are sorted by decreasing logprob and cut to ``k`` — a sampled token returned in
    addition to the top-K (rank > K) is dropped, so the set is a true top set, as the tail bound
    needs. Rows with fewer entries are padded with ``-1``/``-inf``.
    """
    n = len(rows)
    ids = np.full((n, max(k, 0)), -1, dtype=np.int64)
    lps = np.full((n, max(k, 0)), -np.inf)
    for i, row in enumerate(rows):
        if isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], np.ndarray):
            row_ids, row_lps = row
            if np.unique(row_ids).size == row_ids.size:  # (no id to merge: sorted at once,
                # by the same key as below: decreasing logprob, then increasing id)
                order = np.lexsort((row_ids, -row_lps))[: max(k, 0)]
                ids[i, : order.size] = row_ids[order]
                lps[i, : order.size] = row_lps[order]
                continue
            row = list(zip(row_ids.tolist(), row_lps.tolist(), strict=True))
        best: dict[int, float] = {}
        for token, lp in row:
            prev = best.get(token)
            if prev is not None and abs(prev - lp) > 1e-3 and math.isfinite(prev):
                raise InvalidResponseError(
                    f"{label}: token {token} listed twice at position {i} with different "
                    f"logprobs ({prev} and {lp})"
                )
            if prev is None or lp > prev:
                best[token] = lp
        ordered = sorted(best.items(), key=lambda item: (-item[1], item[0]))[:k]
        for j, (token, lp) in enumerate(ordered):
            ids[i, j] = token
            lps[i, j] = lp
    return ids, lps


# --------------------------------------------------------------------------------------------
# Vectorised fast paths: a whole response's logprob block becomes numpy arrays in a few
# C-level passes instead of per-token Python. Each returns ``None`` when anything is unusual
# (a non-number, NaN, a positive value, a malformed or repeated id, ...); the caller then runs the
# per-token path above on the same input, which raises the exact error (or handles the rare
# legitimate case, e.g. duplicates to merge). So behaviour on malformed input is unchanged.

_TOKEN_ID_PREFIX = b"token_id:"
_PREFIX_LETTERS = b"tokenid_:"
_DIGITS_AND_COMMAS = b"0123456789,"
_MAX_TOKEN_ID = 2**62
_PAD_ID = np.iinfo(np.int64).max


def logprob_array(values: Sequence[Any]) -> FloatArray | None:
    """:func:`logprob_value` over a list, vectorised: ``None`` when any value is unusual."""
    if not isinstance(values, list):
        return None
    if not values:
        return np.zeros(0, dtype=np.float64)
    try:
        arr = np.array(values)
    except (TypeError, ValueError, OverflowError):
        return None
    if arr.ndim != 1 or arr.dtype.kind not in "fi":
        return None  # None (missing), strings, bools only, nested lists
    arr = arr.astype(np.float64, copy=False)
    # One reduction each for the common case: the largest value catches NaN (max
    # propagates it) and positives; the smallest says whether a sentinel is there at all.
    top = arr.max()
    if not top <= 1e-3:
        return None
    if top >= 0.0:  # a zero somewhere (a bool False?) or rounding noise above it
        zeros = np.flatnonzero(arr == 0.0)
        if zeros.size and any(type(values[i]) is bool for i in zeros.tolist()):
            return None  # False is not a number here (True shows up as a positive value)
        np.minimum(arr, 0.0, out=arr)  # (also turns -0.0 into 0.0)
    if arr.min() <= SENTINEL_THRESHOLD:
        arr[arr <= SENTINEL_THRESHOLD] = -np.inf
    return arr


def token_id_array(values: Sequence[Any]) -> IntArray | None:
    """:func:`token_id_value` over a list of JSON integers, vectorised (``None``: unusual)."""
    if not isinstance(values, list):
        return None
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        arr = np.array(values)
    except (TypeError, ValueError, OverflowError):
        return None
    if arr.ndim != 1 or arr.dtype.kind != "i":
        return None  # strings, floats, bools, None: the per-token path decides
    small = np.flatnonzero((arr == 0) | (arr == 1))
    if small.size and any(type(values[i]) is bool for i in small.tolist()):
        return None
    return arr.astype(np.int64, copy=False)


def token_id_keys_array(keys: Sequence[str]) -> IntArray | None:
    """Ids from vLLM's ``"token_id:<id>"`` keys in a few C-level passes (``None``: unusual).

    Only keys that are exactly the prefix followed by decimal digits take this path; anything
    else (bare ids, negative ids, text keys) is left to :func:`token_id_value`.
    """
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    try:
        joined = ",".join(keys).encode("ascii")
    except (TypeError, UnicodeEncodeError):
        return None
    # Every key starts with the prefix, which occurs once per key and nowhere else: the n - 1
    # commas each open a key (the parsed count below rules out commas inside keys), and the
    # letter count below leaves no letter outside the n prefixes.
    if not joined.startswith(_TOKEN_ID_PREFIX) or joined.count(b"," + _TOKEN_ID_PREFIX) != n - 1:
        return None
    digits = joined.translate(None, _PREFIX_LETTERS)
    if len(digits) != len(joined) - n * len(_TOKEN_ID_PREFIX) or digits.translate(
        None, _DIGITS_AND_COMMAS
    ):
        return None
    try:
        ids = np.fromstring(digits, dtype=np.int64, sep=",")  # text mode: C parsing
    except ValueError:
        return None
    if ids.shape[0] != n or (ids >= _MAX_TOKEN_ID).any():
        return None
    return ids


def topk_from_flat(
    ids: IntArray, lps: FloatArray, lengths: IntArray, k: int
) -> tuple[IntArray, FloatArray] | None:
    """:func:`topk_rows` on flattened rows (``lengths[i]`` entries each), vectorised.

    Returns ``None`` when a row lists an id twice (merge or error: :func:`topk_rows` decides).
    """
    n = int(lengths.shape[0])
    k = max(k, 0)
    width = int(lengths.max()) if n else 0
    if n == 0 or width == 0 or k == 0:
        return np.full((n, k), -1, dtype=np.int64), np.full((n, k), -np.inf)
    # Rows of one length (vLLM's usual K, or K + 1 with the sampled token) are a reshape;
    # others are scattered into padded rows.
    uniform = int(lengths.min()) == width
    if uniform:
        ids2 = ids.reshape(n, width)
        lps2 = lps.reshape(n, width)
    else:
        mask = np.arange(width) < lengths[:, None]
        ids2 = np.full((n, width), _PAD_ID, dtype=np.int64)
        lps2 = np.full((n, width), -np.inf)
        ids2[mask] = ids
        lps2[mask] = lps
    if width > 1:
        by_id = np.sort(ids2, axis=1)
        same = by_id[:, 1:] == by_id[:, :-1]
        if not uniform:
            same &= by_id[:, 1:] != _PAD_ID
        if same.any():
            return None
    # Decreasing logprob, then increasing id (padding last: largest id, -inf). Rows the
    # server sent in that order already (the usual case) are kept as they are: the sort would
    # return them unchanged, at ten times the cost of checking.
    if uniform and bool(
        (
            (lps2[:, 1:] < lps2[:, :-1])
            | ((lps2[:, 1:] == lps2[:, :-1]) & (ids2[:, 1:] > ids2[:, :-1]))
        ).all()
    ):
        top_ids, top_lps = ids2[:, :k], lps2[:, :k]
    else:
        order = np.lexsort((ids2, -lps2), axis=-1)[:, :k]
        rows = np.arange(n)[:, None]
        top_ids = ids2[rows, order]
        top_lps = lps2[rows, order]
    if not uniform:
        pad = top_ids == _PAD_ID
        top_ids[pad] = -1
        top_lps[pad] = -np.inf
    cols = top_ids.shape[1]
    if cols == k:
        return top_ids, top_lps
    out_ids = np.full((n, k), -1, dtype=np.int64)
    out_lps = np.full((n, k), -np.inf)
    out_ids[:, :cols] = top_ids
    out_lps[:, :cols] = top_lps
    return out_ids, out_lps


def dict_rows_flat(
    rows: Sequence[Any],
) -> tuple[list[Any], list[Any], IntArray] | None:
    """Keys, values and lengths of a list of dicts (``None`` unless every row is a dict)."""
    if not all(type(row) is dict for row in rows):
        return None
    keys = list(chain.from_iterable(rows))
    values = list(chain.from_iterable(map(dict.values, rows)))
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return keys, values, lengths


def pair_rows_flat(
    rows: Sequence[Any], value_at: int, id_at: int
) -> tuple[list[Any], list[Any], IntArray] | None:
    """Ids, values and lengths of a list of lists of ``[.., ..]`` entries (SGLang's triples)."""
    if not all(type(row) is list for row in rows):
        return None
    flat = list(chain.from_iterable(rows))
    if flat and (
        not all(type(e) is list for e in flat) or min(map(len, flat)) <= max(value_at, id_at)
    ):
        return None
    ids = list(map(itemgetter(id_at), flat))
    values = list(map(itemgetter(value_at), flat))
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return ids, values, lengths


def check_length(got: int, want: int, *, label: str) -> None:
    if got != want:
        raise InvalidResponseError(
            f"{label}: the engine returned {got} tokens, {want} were requested "
            "(is max_model_len too small, or was EOS not ignored?)"
        )


def check_ids(got: IntArray, want: Sequence[int], *, label: str) -> None:
    if got.shape[0] != len(want) or not np.array_equal(got, np.asarray(want, dtype=np.int64)):
        raise InvalidResponseError(f"{label}: the scored tokens are not the tokens sent")


def error_message(body: Any, fallback: str) -> str:
    """The server's own error message from an error body (vLLM, SGLang, OpenAI shapes)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str) and err:
            return err
        for key in ("message", "detail"):
            val = body.get(key)
            if isinstance(val, str) and val:
                return val
            if isinstance(val, list) and val:  # FastAPI validation errors
                return "; ".join(
                    str(item.get("msg", item)) if isinstance(item, dict) else str(item)
                    for item in val
                )
    return fallback
