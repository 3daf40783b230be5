"""The vectorised parsers (issue 8) agree with the per-token ones, errors included."""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import numpy as np
import pytest

from presto_client.backends.completions import (
    CanonicalKeys,
    completion_logprobs_per_token,
    fast_completion_logprobs,
    parse_completion_logprobs,
    top_values_of_rows,
)
from presto_client.backends.parsing import (
    check_token_ids,
    logprob_array,
    token_id_array,
    token_id_keys_array,
    topk_from_flat,
    topk_rows,
)
from presto_client.backends.sglang import _fast_triples, _top_rows, _triples_per_token
from presto_client.core.scoring import check_rows_match_tokens
from presto_client.errors import InvalidResponseError

K = 20


def vllm_choice(rng: random.Random, n: int, k: int = K, vocab: int = 200) -> dict[str, Any]:
    """A choice shaped like vLLM's: sampled token first in each top dict, then the top-K."""
    ids: list[int] = []
    values: list[float] = []
    top: list[dict[str, float]] = []
    for _ in range(n):
        row = sorted(rng.sample(range(vocab), k + 1))
        lps = [round(math.log(rng.random() + 1e-12), 6) for _ in row]
        if rng.random() < 0.2:
            lps[0] = -9999.0
        if rng.random() < 0.2:
            lps[1] = 0.0
        sampled = rng.choice(row)
        lp = lps[row.index(sampled)]
        entries = {f"token_id:{sampled}": lp}
        pool = list(zip(row, lps, strict=True))
        rng.shuffle(pool)
        for t, v in pool[: k if rng.random() < 0.5 else k + 1]:
            entries[f"token_id:{t}"] = v
        ids.append(sampled)
        values.append(lp)
        top.append(entries)
    return {"token_ids": ids, "logprobs": {"token_logprobs": values, "top_logprobs": top}}


def same(a: Any, b: Any) -> None:
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_array_equal(a.logprobs, b.logprobs)
    np.testing.assert_array_equal(a.top_ids, b.top_ids)
    np.testing.assert_array_equal(a.top_logprobs, b.top_logprobs)
    assert a.top_ids.dtype == b.top_ids.dtype == np.int64
    assert a.logprobs.dtype == b.logprobs.dtype == np.float64


@pytest.mark.parametrize("n", [0, 1, 2, 7, 64])
@pytest.mark.parametrize("k", [1, 5, 20, 30])
def test_vllm_fast_path_equals_per_token(n: int, k: int) -> None:
    rng = random.Random(n * 100 + k)
    for _ in range(5):
        choice = vllm_choice(rng, n, k=min(k, 20))
        fast = fast_completion_logprobs(choice, k, expect=n)
        assert fast is not None, "a well-formed block must take the fast path"
        same(fast, completion_logprobs_per_token(choice, k, label="p", expect=n))


def _outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except InvalidResponseError as exc:
        return ("error", str(exc))
    except (ValueError, OverflowError) as exc:
        return ("error", type(exc).__name__)


CORRUPTIONS: list[tuple[str, Any]] = [
    ("value None", lambda c: c["logprobs"]["token_logprobs"].__setitem__(1, None)),
    ("value NaN", lambda c: c["logprobs"]["token_logprobs"].__setitem__(2, float("nan"))),
    ("value str", lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, "-1.0")),
    ("value True", lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, True)),
    ("value False", lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, False)),
    ("value positive", lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, 0.5)),
    ("value int", lambda c: c["logprobs"]["token_logprobs"].__setitem__(0, -3)),
    ("top None", lambda c: c["logprobs"]["top_logprobs"][1].update({"token_id:7": None})),
    ("top False", lambda c: c["logprobs"]["top_logprobs"][1].update({"token_id:7": False})),
    ("top NaN", lambda c: c["logprobs"]["top_logprobs"][1].update({"token_id:7": math.nan})),
    ("top positive", lambda c: c["logprobs"]["top_logprobs"][0].update({"token_id:7": 2.0})),
    ("key text", lambda c: c["logprobs"]["top_logprobs"][0].update({"hello": -1.0})),
    ("key bare", lambda c: c["logprobs"]["top_logprobs"][0].update({"7": -1.0})),
    ("key negative", lambda c: c["logprobs"]["top_logprobs"][0].update({"token_id:-7": -1.0})),
    ("key empty id", lambda c: c["logprobs"]["top_logprobs"][0].update({"token_id:": -1.0})),
    ("key dash", lambda c: c["logprobs"]["top_logprobs"][0].update({"token_id:-": -1.0})),
    ("key twice", lambda c: c["logprobs"]["top_logprobs"][0].update({"token_id:token_id:7": -1})),
    ("key suffix", lambda c: c["logprobs"]["top_logprobs"][0].update({"7token_id:": -1.0})),
    ("key comma", lambda c: c["logprobs"]["top_logprobs"][0].update({"token_id:7,8": -1.0})),
    ("key unicode", lambda c: c["logprobs"]["top_logprobs"][0].update({"token_id:٣": -1.0})),
    ("key huge", lambda c: c["logprobs"]["top_logprobs"][0].update({"token_id:" + "9" * 25: -1})),
    ("id str", lambda c: c["token_ids"].__setitem__(0, "token_id:5")),
    ("id bool", lambda c: c["token_ids"].__setitem__(0, True)),
    ("id float", lambda c: c["token_ids"].__setitem__(0, 5.0)),
    ("row missing", lambda c: c["logprobs"]["top_logprobs"].__setitem__(1, None)),
    ("short", lambda c: c["token_ids"].pop()),
    ("no ids", lambda c: c.pop("token_ids")),
    (
        "duplicate id, same value",
        lambda c: c["logprobs"]["top_logprobs"][0].update(
            {str(c["token_ids"][0]): c["logprobs"]["token_logprobs"][0]}
        ),
    ),
    (
        "duplicate id, other value",
        lambda c: c["logprobs"]["top_logprobs"][0].update({str(c["token_ids"][0]): -50.0}),
    ),
]


@pytest.mark.parametrize(("name", "corrupt"), CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_vllm_unusual_input_behaves_as_per_token(name: str, corrupt: Any) -> None:
    choice = vllm_choice(random.Random(7), 4)
    choice["logprobs"]["tokens"] = [f"token_id:{t}" for t in choice["token_ids"]]
    corrupt(choice)
    got = _outcome(
        lambda: parse_completion_logprobs(copy.deepcopy(choice), K, label="p 1", expect=4)
    )
    want = _outcome(lambda: completion_logprobs_per_token(choice, K, label="p 1", expect=4))
    assert got[0] == want[0]
    if got[0] == "error":
        assert got[1] == want[1]
    else:
        same(got[1], want[1])


def _values_of(choice: dict[str, Any], k: int, vocab: int | None = 200) -> Any:
    lp = choice["logprobs"]
    return top_values_of_rows(
        choice["token_ids"], lp["token_logprobs"], lp["top_logprobs"], k, CanonicalKeys(), vocab
    )


@pytest.mark.parametrize("n", [1, 2, 7, 64])
@pytest.mark.parametrize("k", [1, 5, 20, 30])
def test_streamed_rows_values_alone_are_the_full_parses_values(n: int, k: int) -> None:
    """The values-only reading of streamed rows (no id of a row parsed) keeps exactly the
    values the full parse keeps: sentinels, zeros, shuffled rows, rows of K + 1, rows shorter
    than K."""
    rng = random.Random(n * 31 + k)
    for _ in range(5):
        choice = vllm_choice(rng, n, k=min(k, 20))
        got = _values_of(choice, k)
        assert got is not None, "vLLM's rows must take the values-only path"
        want = fast_completion_logprobs(choice, k, expect=n)
        assert want is not None
        np.testing.assert_array_equal(got[0], want.token_ids)
        np.testing.assert_array_equal(got[1], want.logprobs)
        np.testing.assert_array_equal(got[2], want.top_logprobs)
        assert got[2].shape == (n, k)


STREAMED_ONLY: list[tuple[str, Any]] = [
    (
        "a second spelling of an id",
        lambda c: c["logprobs"]["top_logprobs"][0].update(
            {f"token_id:0{c['token_ids'][0]}": c["logprobs"]["token_logprobs"][0]}
        ),
    ),
    (
        "an id past the vocabulary in a row",
        lambda c: c["logprobs"]["top_logprobs"][1].update({"token_id:200": -30.0}),
    ),
    (
        "the sampled token missing from its row",
        lambda c: c["logprobs"]["top_logprobs"][2].pop(f"token_id:{c['token_ids'][2]}"),
    ),
    (
        "the sampled token's entry another value",
        lambda c: c["logprobs"]["top_logprobs"][3].update(
            {f"token_id:{c['token_ids'][3]}": c["logprobs"]["token_logprobs"][3] - 0.5}
        ),
    ),
]


@pytest.mark.parametrize(
    ("name", "corrupt"),
    CORRUPTIONS + STREAMED_ONLY,
    ids=[c[0] for c in CORRUPTIONS + STREAMED_ONLY],
)
def test_streamed_rows_values_alone_refuse_what_the_full_parse_would_not_take(
    name: str, corrupt: Any
) -> None:
    """Whatever the values-only reading takes, the full parse takes too, with the same values
    and rows whose sampled tokens match (so the scores are the same); anything else is handed
    to the full parse (``None``), whose checks say what is wrong."""
    choice = vllm_choice(random.Random(7), 4)
    corrupt(choice)
    try:
        got = _values_of(copy.deepcopy(choice), K)
    except (TypeError, AttributeError, KeyError):
        got = None  # (the scorer hands such a batch back too)
    if got is None:
        return
    want = fast_completion_logprobs(choice, K, expect=None)
    assert want is not None, name
    check_rows_match_tokens(want)
    check_token_ids(want, 200, label="")
    np.testing.assert_array_equal(got[1], want.logprobs)
    np.testing.assert_array_equal(got[2], want.top_logprobs)


def test_canonical_keys_are_learnt_once_and_forgotten_when_the_vocabulary_shrinks() -> None:
    keys = CanonicalKeys()
    rows = [{"token_id:5": -1.0, "token_id:17": -2.0}]
    assert keys.cover(rows, 100) and keys.cover(rows, 100)
    assert not keys.cover(rows, 10)  # 17 is no token of a 10-token vocabulary
    assert keys.cover([{"token_id:5": -1.0}], 10)
    assert not keys.cover([{"token_id:05": -1.0}], None)
    assert not keys.cover([{"token_id:5 ": -1.0}], None)


def test_vectorised_helpers_refuse_what_they_cannot_vouch_for() -> None:
    assert logprob_array([-1.0, None]) is None
    assert logprob_array([-1.0, False]) is None
    assert logprob_array([True]) is None
    assert logprob_array([[-1.0]]) is None
    np.testing.assert_array_equal(logprob_array([-9999.0, 0.0005, -1]), [-np.inf, 0.0, -1.0])
    assert token_id_array([1, True]) is None and token_id_array([1.0]) is None
    assert token_id_array([2**70]) is None
    np.testing.assert_array_equal(token_id_array([0, 1, 5]), [0, 1, 5])
    assert token_id_keys_array(["token_id:1", "2"]) is None
    np.testing.assert_array_equal(token_id_keys_array(["token_id:01", "token_id:9"]), [1, 9])


def test_topk_from_flat_matches_topk_rows() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(0, 6))
        lengths = rng.integers(0, 8, size=n)
        rows = []
        for m in lengths:
            ids = rng.choice(40, size=int(m), replace=False)
            lps = np.round(np.log(rng.random(int(m))), 2)
            lps[rng.random(int(m)) < 0.2] = -np.inf
            rows.append(list(zip(ids.tolist(), lps.tolist(), strict=True)))
        k = int(rng.integers(0, 7))
        flat_ids = np.array([t for r in rows for t, _ in r], dtype=np.int64)
        flat_lps = np.array([v for r in rows for _, v in r], dtype=np.float64)
        got = topk_from_flat(flat_ids, flat_lps, np.asarray(lengths, dtype=np.int64), k)
        assert got is not None
        want = topk_rows(rows, k, label="p")
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    assert topk_from_flat(np.array([3, 3]), np.array([-1.0, -1.0]), np.array([2]), 2) is None


@pytest.mark.parametrize("seed", range(4))
def test_topk_from_flat_keeps_rows_already_in_order_as_the_sort_would(seed: int) -> None:
    """Rows a server sends sorted (decreasing logprob, ties by increasing id) skip the sort;
    rows with a tie in the other order, or one pair out of order, take it: both as
    :func:`topk_rows` orders them."""
    rng = np.random.default_rng(seed)
    n, width = 30, 6
    rows = []
    for i in range(n):
        ids = rng.choice(50, size=width, replace=False)
        lps = np.round(np.sort(np.log(rng.random(width)))[::-1], 1)  # rounding makes ties
        order = np.lexsort((ids, -lps))
        ids, lps = ids[order], lps[order]
        if i % 5 == 1:  # a tie in decreasing id order
            lps[1] = lps[0]
            ids[0], ids[1] = max(ids[0], ids[1]), min(ids[0], ids[1])
        if i % 7 == 2:  # one pair out of order
            ids[[2, 3]], lps[[2, 3]] = ids[[3, 2]], lps[[3, 2]]
        rows.append(list(zip(ids.tolist(), lps.tolist(), strict=True)))
    for subset in (rows, [r for i, r in enumerate(rows) if i % 5 != 1 and i % 7 != 2]):
        flat_ids = np.array([t for r in subset for t, _ in r], dtype=np.int64)
        flat_lps = np.array([v for r in subset for _, v in r], dtype=np.float64)
        lengths = np.full(len(subset), width, dtype=np.int64)
        for k in (width, width - 2):
            got = topk_from_flat(flat_ids, flat_lps, lengths, k)
            assert got is not None
            want = topk_rows(subset, k, label="p")
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])


def test_sglang_fast_triples_and_rows_match_per_token() -> None:
    rng = random.Random(5)
    entries = [[round(math.log(rng.random()), 5), rng.randrange(100), None] for _ in range(9)]
    entries[3][0] = -3.4028234663852886e38
    ids, values = _fast_triples(entries, first_null=False) or (None, None)
    want_ids, want_values = _triples_per_token(entries, "p", "output_token_logprobs")
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(values, want_values)
    scoring = [[None, 4, None], *entries]
    got = _fast_triples(scoring, first_null=True)
    assert got is not None and math.isnan(got[1][0])
    np.testing.assert_array_equal(got[1][1:], want_values)
    assert _fast_triples([[None, 4, None], *entries], first_null=False) is None
    rows = [
        [[round(math.log(rng.random()), 4), t, None] for t in rng.sample(range(100), 6)]
        for _ in range(5)
    ]
    fast = _top_rows(rows, 5, 4, "p", "output_top_logprobs")
    pairs = [[(e[1], e[0]) for e in row] for row in rows]
    slow = topk_rows(pairs, 4, label="p")
    np.testing.assert_array_equal(fast[0], slow[0])
    np.testing.assert_array_equal(fast[1], slow[1])
    rows[2][1][0] = None
    with pytest.raises(InvalidResponseError, match=r"missing logprob \(output_top_logprobs\[2\]\)"):
        _top_rows(rows, 5, 4, "p", "output_top_logprobs")


def _events(rng: random.Random, sizes: list[int]) -> list[dict[str, Any]]:
    """Stream events of ``sizes`` tokens each (vLLM sends several with --stream-interval)."""
    out: list[dict[str, Any]] = []
    for n in sizes:
        choice = vllm_choice(rng, n)
        out.append({"choices": [{"index": 0, "text": "", **choice}]})
    out.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    out.append({"choices": [], "usage": {"completion_tokens": sum(sizes)}})
    return out


def test_vllm_stream_events_of_one_read_are_one_chunk() -> None:
    from presto_client.backends import EngineSpec
    from presto_client.backends.vllm import VllmAdapter
    from presto_client.core.engine_protocol import ProposalRequest, ScoreSpec

    adapter = VllmAdapter(EngineSpec("vllm", ("http://x",), top_k=K))
    req = ProposalRequest((1, 2), 9, 0.25, 1, ScoreSpec((1.0,)))
    events = _events(random.Random(11), [1, 3, 1, 4])
    merged = adapter.parse_stream_events(req, events, label="s")
    per_event = [adapter.parse_stream_event(req, e, label="s") for e in events]
    whole = None
    for chunk in per_event:
        if chunk is not None and len(chunk):
            whole = chunk if whole is None else whole.concat(chunk)
    assert merged is not None and whole is not None and len(merged) == 9
    same(merged, whole)
    # A bad value in the third event: the same error as event by event.
    events[2]["choices"][0]["logprobs"]["token_logprobs"][0] = None
    with pytest.raises(InvalidResponseError) as merged_error:
        adapter.parse_stream_events(req, events, label="s")
    with pytest.raises(InvalidResponseError) as single_error:
        adapter.parse_stream_event(req, events[2], label="s")
    assert str(merged_error.value) == str(single_error.value)
