"""A whole-vocabulary row read in bulk (issue 48's stalls: a whole-row scoring of a proposal
held the event loop 2.6 s and took 750 MB on llama.cpp) gives the very record the entry-by-entry
reading gives, and every row it cannot read the same way falls back to it (and its errors)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import presto_client.backends.llamacpp as llamacpp
from presto_client.backends.parsing import BULK_ROW, bulk_row
from presto_client.core.scoring import TokenLogprobs
from presto_client.errors import InvalidResponseError


def _body(entries: list[dict[str, Any]]) -> dict[str, Any]:
    first = entries[0]
    return {
        "tokens": [first["id"]],
        "completion_probabilities": [
            {"id": first["id"], "logprob": first["logprob"], "top_logprobs": entries}
        ],
    }


def _both(body: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    bulk = llamacpp.parse_completion(body, -1, 1, label="x", full_row=True)
    monkeypatch.setattr(llamacpp, "BULK_ROW", 10**9)
    one_by_one = llamacpp.parse_completion(body, -1, 1, label="x", full_row=True)
    monkeypatch.setattr(llamacpp, "BULK_ROW", BULK_ROW)
    return bulk, one_by_one


def _same(a: TokenLogprobs, b: TokenLogprobs) -> None:
    for name in ("token_ids", "logprobs", "top_ids", "top_logprobs"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name


def _row(n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    ids = rng.permutation(n * 2)[:n]
    lps = np.log(rng.dirichlet(np.ones(n)))
    lps[rng.integers(0, n, 5)] = lps[0]  # ties: ordered by id
    entries = [
        {"id": int(t), "logprob": float(x), "token": "t", "bytes": [1]}
        for t, x in zip(ids, lps, strict=True)
    ]
    entries[3]["logprob"] = -9999.0  # a sentinel: -inf
    entries[4]["logprob"] = 0.0005  # rounding above 0: cut to 0
    entries[5]["logprob"] = float("-inf")
    return entries


@pytest.mark.parametrize("seed", range(4))
def test_a_bulk_row_is_the_entry_by_entry_row_bit_for_bit(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = _row(2000, np.random.default_rng(seed))
    assert bulk_row(entries) is not None
    bulk, one_by_one = _both(_body(entries), monkeypatch)
    _same(bulk, one_by_one)
    assert np.isneginf(bulk.top_logprobs).sum() == 2 and bulk.top_logprobs.max() == 0.0


def test_a_row_with_a_repeated_id_is_merged_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = _row(1000, np.random.default_rng(7))
    entries.append(dict(entries[10]))  # the same id and logprob twice: merged
    bulk, one_by_one = _both(_body(entries), monkeypatch)
    _same(bulk, one_by_one)
    assert bulk.top_ids.shape[1] == 1001 and (bulk.top_ids[0] >= 0).sum() == 1000


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"logprob": float("nan")}, "NaN logprob"),
        ({"id": True}, "token id is not an integer"),
        ({"logprob": "x"}, "logprob is not a number"),
        ({"logprob": 0.5}, "positive logprob"),
    ],
)
def test_what_bulk_cannot_read_falls_back_to_the_exact_error(
    change: dict[str, Any], error: str
) -> None:
    entries = _row(BULK_ROW + 10, np.random.default_rng(1))
    entries[20] = {**entries[20], **change}
    assert bulk_row(entries) is None
    with pytest.raises(InvalidResponseError, match=error):
        llamacpp.parse_completion(_body(entries), -1, 1, label="x", full_row=True)


def test_a_string_id_and_an_int_logprob_are_read_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = _row(BULK_ROW + 10, np.random.default_rng(2))
    entries[30] = {**entries[30], "id": "token_id:99999"}
    entries[31] = {**entries[31], "logprob": -3}
    assert bulk_row(entries) is None
    bulk, one_by_one = _both(_body(entries), monkeypatch)
    _same(bulk, one_by_one)


def test_rows_joined_at_once_equal_rows_joined_in_turn() -> None:
    rng = np.random.default_rng(3)
    parts = []
    for width in (3, 5, 2):
        n = int(rng.integers(1, 4))
        parts.append(
            TokenLogprobs(
                rng.integers(0, 9, n),
                -rng.random(n),
                rng.integers(0, 9, (n, width)),
                -rng.random((n, width)),
            )
        )
    in_turn = parts[0].concat(parts[1]).concat(parts[2])
    _same(TokenLogprobs.joined(parts), in_turn)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_exact_scores_from_whole_rows_are_the_same_built_a_few_rows_at_a_time(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import presto_client.core.scoring as scoring
    from presto_client.core.engine_protocol import ScoreSpec

    rng = np.random.default_rng(5)
    vocab, rows = 3000, []
    for _ in range(19):
        lp = np.log(rng.dirichlet(np.full(vocab, 0.3)))
        lp[rng.integers(0, vocab, 40)] = -np.inf
        order = np.argsort(-lp)
        rows.append(
            TokenLogprobs(
                order[:1], lp[order[:1]], order[None, :].astype(np.int64), lp[order][None]
            )
        )
    raw = TokenLogprobs.joined(rows)
    spec = ScoreSpec((0.25, 0.5, 1.0), True)
    ids = raw.token_ids.tolist()
    monkeypatch.setattr(scoring, "FULL_ROWS_AT_ONCE", 10**6)
    whole = scoring.exact_from_full_rows(ids, raw, spec, vocab)
    monkeypatch.setattr(scoring, "FULL_ROWS_AT_ONCE", chunk)
    chunked = scoring.exact_from_full_rows(ids, raw, spec, vocab)
    for name in ("logp0", "logq_lo", "logq_hi", "entropy"):
        assert np.array_equal(getattr(whole, name), getattr(chunked, name)), name
