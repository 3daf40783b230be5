"""The logprob block of OpenAI's completions shape (``choice.logprobs``: ``token_logprobs``,
``top_logprobs``, ``tokens``; vLLM adds ``choice.token_ids``) as :class:`TokenLogprobs`.

Shared by the dialects that answer in that shape (vLLM's, the generic OpenAI-compatible one);
pure functions, no I/O.
"""

from __future__ import annotations

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
