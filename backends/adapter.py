"""The adapter contract and the dialect-independent turning of engine answers into scores.

An adapter is a set of *pure* functions of one serving dialect: request builders (plain objects
in, an :class:`HttpCall` out) and response parsers (a decoded JSON body in, a
:class:`TokenLogprobs` out). It never opens a socket; :class:`~backends.http_engine.HttpEngine`
sends what it builds over the shared :class:`~backends.transport.Transport`.

Every parser returns the same normalised record, :class:`TokenLogprobs`: the token ids, the
logprob the engine returned for each (raw ``log p0`` or temperature-scaled ``log q_τ``, as the
adapter's :attr:`Adapter.semantics` says), and the returned top-K, deduplicated by token id,
sorted, cut to the K asked for and padded with ``-inf``. :func:`scored_from_raw` and
:func:`scored_from_scaled` turn those records into
:class:`~presto_client.core.engine_protocol.ScoredTokens`, always through
:func:`presto_client.core.logprob_math.scores_from_topk`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any, ClassVar

import numpy as np

from backends.spec import Capabilities, EngineSpec
from presto_client.core.engine_protocol import (
    FloatArray,
    IntArray,
    ProposalRequest,
    ScoredTokens,
    ScoreSpec,
)
from presto_client.core.logprob_math import scores_from_topk
from presto_client.errors import ConfigError, InvalidResponseError

RAW = "raw"
SCALED = "scaled"

# vLLM writes -inf as -9999.0 (OpenAI's convention); SGLang clamps it to float32's minimum.
SENTINEL_THRESHOLD = -9999.0
FLOAT32_MIN = -3.4028234663852886e38


@dataclass(frozen=True, slots=True)
class HttpCall:
    """One HTTP request an adapter wants sent: ``POST path`` with a JSON ``payload``."""

    path: str
    payload: dict[str, Any]
    label: str
    """Names the request in error messages (e.g. ``proposal seed=7, 16 tokens``)."""
    stream: bool = False


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Per-token logprobs as an engine returned them, normalised (one row per token).

    ``logprobs`` is what the engine returned for each token (raw or scaled: see the adapter's
    semantics); ``top_ids``/``top_logprobs`` are the returned top-K, deduplicated by id, sorted
    by decreasing logprob, cut to K and padded with ``-1``/``-inf``.
    """

    token_ids: IntArray
    logprobs: FloatArray
    top_ids: IntArray
    top_logprobs: FloatArray

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @classmethod
    def empty(cls, k: int) -> TokenLogprobs:
        return cls(
            np.zeros(0, dtype=np.int64),
            np.zeros(0),
            np.zeros((0, k), dtype=np.int64),
            np.zeros((0, k)),
        )

    def concat(self, other: TokenLogprobs) -> TokenLogprobs:
        k = max(self.top_ids.shape[1], other.top_ids.shape[1])
        a, b = self.padded(k), other.padded(k)
        return TokenLogprobs(
            np.concatenate([a.token_ids, b.token_ids]),
            np.concatenate([a.logprobs, b.logprobs]),
            np.concatenate([a.top_ids, b.top_ids]),
            np.concatenate([a.top_logprobs, b.top_logprobs]),
        )

    def padded(self, k: int) -> TokenLogprobs:
        have = self.top_ids.shape[1]
        if have >= k:
            return self
        n = len(self)
        return TokenLogprobs(
            self.token_ids,
            self.logprobs,
            np.concatenate([self.top_ids, np.full((n, k - have), -1, dtype=np.int64)], axis=1),
            np.concatenate([self.top_logprobs, np.full((n, k - have), -np.inf)], axis=1),
        )


@dataclass(slots=True)
class ParsedModels:
    names: list[str] = field(default_factory=list)
    max_model_len: int | None = None


# --------------------------------------------------------------------------------------------
# Pure helpers shared by the parsers.


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


def token_id_value(value: Any, *, label: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str):
            text = value.removeprefix("token_id:")
            if text.lstrip("-").isdigit():
                return int(text)
        raise InvalidResponseError(f"{label}: token id is not an integer ({what}): {value!r}")
    return int(value)


def topk_rows(
    rows: Sequence[Iterable[tuple[int, float]]], k: int, *, label: str
) -> tuple[IntArray, FloatArray]:
    """``[n, k]`` ids and logprobs from per-position ``(id, logprob)`` pairs.

    Duplicated ids (vLLM's sampled token repeated among the top-K, key collisions) are merged;
    the entries are sorted by decreasing logprob and cut to ``k`` — a sampled token returned in
    addition to the top-K (rank > K) is dropped, so the set is a true top set, as the tail bound
    needs. Rows with fewer entries are padded with ``-1``/``-inf``.
    """
    n = len(rows)
    ids = np.full((n, max(k, 0)), -1, dtype=np.int64)
    lps = np.full((n, max(k, 0)), -np.inf)
    for i, row in enumerate(rows):
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
# Vectorised fast paths (issue 8): a whole response's logprob block becomes numpy arrays in a few
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
    # One reduction each for the common case (issue 8): the largest value catches NaN (max
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
    # Decreasing logprob, then increasing id (padding last: largest id, -inf).
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


# --------------------------------------------------------------------------------------------
# From normalised logprobs to ScoredTokens (the one place where this happens for HTTP engines).


def _derive(
    logp0: FloatArray,
    top: FloatArray,
    spec: ScoreSpec,
    vocab_size: int | None,
    *,
    entropy: bool | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray | None]:
    """``scores_from_topk``'s intervals, and its entropy when ``entropy`` (default: when
    ``spec`` asks for it; skipped otherwise, issue 8)."""
    want_entropy = spec.entropy if entropy is None else entropy
    try:
        derived = scores_from_topk(logp0, top, spec.temperatures, vocab_size, entropy=want_entropy)
    except ValueError as exc:
        if "vocabulary size" in str(exc):
            raise ConfigError(
                f"{exc}: set vocab_size in the engine spec to use temperatures above 1"
            ) from exc
        raise InvalidResponseError(str(exc)) from exc
    return derived.logq_lo, derived.logq_hi, derived.entropy


def scored_from_raw(
    raw: TokenLogprobs, spec: ScoreSpec, vocab_size: int | None = None
) -> ScoredTokens:
    """Scores from raw logprobs: ``log p0`` as returned, ``log q`` as certified intervals."""
    lo, hi, entropy = _derive(raw.logprobs, raw.top_logprobs, spec, vocab_size)
    return ScoredTokens(
        token_ids=raw.token_ids,
        logp0=raw.logprobs,
        logq_lo=lo,
        logq_hi=hi,
        entropy=entropy if spec.entropy else None,
    )


def scored_from_scaled(
    generated: TokenLogprobs,
    temperature: float,
    raw: TokenLogprobs,
    spec: ScoreSpec,
    vocab_size: int | None = None,
) -> ScoredTokens:
    """Scores from a scaled generation plus a raw scoring of the same tokens (two-call mode).

    ``generated.logprobs`` are exact ``log q_τ`` at the request ``temperature``: they fill the
    columns of that temperature exactly. ``log p0`` comes from ``raw``; the other temperatures
    and the entropy are derived from ``raw``'s top-K. ``meta["scaled_outside_interval"]`` is the
    largest distance of an exact value from its certified interval (numeric drift between the
    two calls; 0 when consistent).
    """
    if not np.array_equal(generated.token_ids, raw.token_ids):
        raise InvalidResponseError("the scoring call did not score the generated tokens")
    lo, hi, entropy = _derive(raw.logprobs, raw.top_logprobs, spec, vocab_size)
    lo = lo.copy()
    hi = hi.copy()
    drift = 0.0
    for m, tau in enumerate(spec.temperatures):
        if math.isclose(tau, temperature, rel_tol=1e-9, abs_tol=1e-12):
            exact = generated.logprobs
            outside = np.maximum(lo[:, m] - exact, exact - hi[:, m])
            if outside.size:
                drift = max(drift, float(np.max(np.where(np.isfinite(outside), outside, 0.0))))
            lo[:, m] = exact
            hi[:, m] = exact
    return ScoredTokens(
        token_ids=raw.token_ids,
        logp0=raw.logprobs,
        logq_lo=lo,
        logq_hi=hi,
        entropy=entropy if spec.entropy else None,
        meta={"scaled_outside_interval": drift},
    )


def exact_from_full_rows(
    token_ids: Sequence[int], raw: TokenLogprobs, spec: ScoreSpec, vocab_size: int
) -> ScoredTokens:
    """Exact scores from full-vocabulary raw rows (``raw.top_*`` holds every token)."""
    n = len(token_ids)
    full = np.full((n, vocab_size), -np.inf)
    for i in range(n):
        valid = raw.top_ids[i] >= 0
        ids = raw.top_ids[i][valid]
        if ids.size and ids.max() >= vocab_size:
            raise InvalidResponseError(
                f"token id {int(ids.max())} outside the vocabulary of {vocab_size}"
            )
        full[i, ids] = raw.top_logprobs[i][valid]
    # Renormalise over what was returned (rounding of a float32 softmax).
    logp0 = raw.logprobs
    logq = np.empty((n, len(spec.temperatures)))
    for m, tau in enumerate(spec.temperatures):
        scaled = full / tau
        top = np.max(scaled, axis=1, keepdims=True)
        log_z = (top + np.log(np.sum(np.exp(scaled - top), axis=1, keepdims=True)))[:, 0]
        logq[:, m] = logp0 / tau - log_z
    p = np.exp(full)
    entropy = -np.sum(np.where(p > 0, p * np.where(np.isfinite(full), full, 0.0), 0.0), axis=1)
    return ScoredTokens.exact(token_ids, logp0, logq, entropy if spec.entropy else None)


def exact_from_normalisers(
    raw: TokenLogprobs,
    scaled_next: dict[float, TokenLogprobs],
    spec: ScoreSpec,
    *,
    label: str,
) -> ScoredTokens:
    """Exact scores of given tokens from a raw scoring plus scaled next-token top-K rows.

    ``scaled_next[τ]`` row ``i`` holds the temperature-``τ`` top-K at position ``i`` (same
    context as ``raw`` row ``i``). For any token ``j`` in both top sets, ``log Z_τ =
    log p0(j)/τ − log q_τ(j)`` exactly, hence ``log q_τ(x) = log p0(x)/τ − log Z_τ``.
    """
    n = len(raw)
    logq = np.empty((n, len(spec.temperatures)))
    for m, tau in enumerate(spec.temperatures):
        if math.isclose(tau, 1.0, rel_tol=0.0, abs_tol=1e-12):
            logq[:, m] = raw.logprobs
            continue
        rows = scaled_next[tau]
        for i in range(n):
            raw_row = {
                int(t): float(v)
                for t, v in zip(raw.top_ids[i], raw.top_logprobs[i], strict=True)
                if t >= 0 and np.isfinite(v)
            }
            raw_row.setdefault(int(raw.token_ids[i]), float(raw.logprobs[i]))
            common = [
                (raw_row[int(t)], int(t), float(v))
                for t, v in zip(rows.top_ids[i], rows.top_logprobs[i], strict=True)
                if int(t) in raw_row and np.isfinite(v)
            ]
            if not common:
                raise InvalidResponseError(
                    f"{label}: no token in both the raw and the scaled top-K at position {i}"
                )
            lp_raw, _, lq = max(common)
            log_z = lp_raw / tau - lq
            logq[i, m] = raw.logprobs[i] / tau - log_z
    entropy = None
    if spec.entropy:
        entropy = _derive(raw.logprobs, raw.top_logprobs, ScoreSpec((1.0,)), None, entropy=True)[2]
    return ScoredTokens.exact(raw.token_ids, raw.logprobs, logq, entropy)


# --------------------------------------------------------------------------------------------
# The adapter contract.


class Adapter:
    """Base class of a dialect: pure builders and parsers plus what the dialect can do.

    Subclasses set the class attributes and implement the ``build_*``/``parse_*`` methods.
    ``build_score`` / ``parse_score`` (raw logprobs of given tokens) are needed for scaled
    semantics (two-call mode), for the start-up probe and for :meth:`Engine.score`.
    """

    dialect: ClassVar[str] = ""
    modes: ClassVar[tuple[str, ...]] = (RAW,)
    default_mode: ClassVar[str] = RAW
    health_path: ClassVar[str] = "/health"
    models_path: ClassVar[str] = "/v1/models"
    metrics_path: ClassVar[str] = "/metrics"
    metric_names: ClassVar[tuple[str, str] | None] = None
    """Prometheus names of the prefix-cache (queries, hits) token counters."""
    streaming: ClassVar[bool] = False
    max_top_k: ClassVar[int | None] = None
    start_hint: ClassVar[str] = ""
    """How to start this dialect's server (for 'unreachable' messages)."""

    def __init__(self, spec: EngineSpec) -> None:
        mode = spec.logprob_mode
        if mode == "auto":
            mode = self.default_mode
        if mode not in self.modes:
            raise ConfigError(
                f"logprob_mode {spec.logprob_mode!r} is not valid for backend "
                f"{self.dialect!r}; valid modes are: auto, {', '.join(self.modes)}"
            )
        if spec.top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {spec.top_k}")
        self.spec = spec
        self.mode = mode

    # ---- what the dialect can do

    @property
    def semantics(self) -> str:
        """``"raw"``: generation logprobs are ``log p0``; ``"scaled"``: exact ``log q_τ``."""
        return RAW

    def capabilities(
        self, *, seeds_honoured: bool | None = None, scoring_call: bool | None = None
    ) -> Capabilities:
        scaled = self.semantics == SCALED
        return Capabilities(
            dialect=self.dialect,
            logprob_mode=self.mode,
            logprob_semantics=self.semantics,
            exact_logq=scaled,
            calls_per_proposal=2 if scaled else 1,
            seeds_honoured=seeds_honoured,
            scoring_call=self.can_score if scoring_call is None else scoring_call,
            streaming=self.streaming and not scaled,
            max_top_k=self.max_top_k,
            metrics=self.metric_names or (),
        )

    @property
    def can_score(self) -> bool:
        return False

    # ---- builders and parsers (pure)

    def build_generate(
        self, request: ProposalRequest, model: str, *, label: str, stream: bool = False
    ) -> HttpCall:
        raise NotImplementedError

    def parse_generate(self, request: ProposalRequest, body: Any, *, label: str) -> TokenLogprobs:
        raise NotImplementedError

    def parse_stream_event(
        self, request: ProposalRequest, event: Any, *, label: str
    ) -> TokenLogprobs | None:
        raise NotImplementedError

    def parse_stream_events(
        self, request: ProposalRequest, events: Sequence[Any], *, label: str
    ) -> TokenLogprobs | None:
        """The tokens of consecutive stream events (those of one network read) as one chunk:
        a client that falls behind pays the per-chunk costs once per read, not per event."""
        out: TokenLogprobs | None = None
        for event in events:
            chunk = self.parse_stream_event(request, event, label=label)
            if chunk is None or len(chunk) == 0:
                continue
            out = chunk if out is None else out.concat(chunk)
        return out

    def build_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], model: str, top_k: int, *, label: str
    ) -> HttpCall:
        """Raw (temperature-1) logprobs of ``token_ids`` after ``prefix``, with top-``top_k``
        (``top_k == -1``: the whole vocabulary)."""
        raise NotImplementedError

    def parse_score(
        self, prefix: Sequence[int], token_ids: Sequence[int], body: Any, top_k: int, *, label: str
    ) -> TokenLogprobs:
        raise NotImplementedError

    def build_next_token_topk(
        self, contexts: Sequence[Sequence[int]], temperature: float, model: str, *, label: str
    ) -> list[HttpCall]:
        """Calls returning the top-K at ``temperature`` of the next token after each context."""
        raise NotImplementedError

    def parse_next_token_topk(
        self, calls: Sequence[HttpCall], bodies: Sequence[Any], n: int, *, label: str
    ) -> TokenLogprobs:
        raise NotImplementedError

    def parse_models(self, body: Any) -> ParsedModels:
        """Served model names from the models endpoint."""
        names: list[str] = []
        max_len: int | None = None
        if isinstance(body, dict):
            for entry in body.get("data") or []:
                if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                    names.append(entry["id"])
                    if max_len is None and isinstance(entry.get("max_model_len"), int):
                        max_len = entry["max_model_len"]
        return ParsedModels(names, max_len)

    # ---- the tokenizer (text prompts in, response text out): builders and parsers (pure)

    tokenize_paths: ClassVar[tuple[str, ...]] = ("/tokenize", "/v1/tokenize")
    """Tokenizer endpoints, tried in order: vLLM's (the embedded engine serves them too; SGLang
    serves the same shape on recent versions — *check*)."""
    detokenize_paths: ClassVar[tuple[str, ...]] = ("/detokenize", "/v1/detokenize")

    def build_tokenize(
        self,
        text: str,
        model: str | None,
        *,
        chat_template: bool = False,
        system_prompt: str | None = None,
    ) -> list[HttpCall]:
        """Calls that tokenize ``text`` (as a user turn through the model's chat template when
        ``chat_template``), one per endpoint to try, in order."""
        payload: dict[str, Any]
        if chat_template:
            messages = [{"role": "user", "content": text}]
            if system_prompt is not None:
                messages.insert(0, {"role": "system", "content": system_prompt})
            payload = {"messages": messages, "add_generation_prompt": True}
        else:
            payload = {"prompt": text, "add_special_tokens": True}
        if model is not None:
            payload = {"model": model, **payload}
        return [HttpCall(path, payload, "tokenize") for path in self.tokenize_paths]

    def parse_tokenize(self, body: Any) -> tuple[int, ...]:
        """The token ids of a tokenize answer (``{"tokens": [...]}``)."""
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise InvalidResponseError(
                f"/tokenize answered without a token list: {str(body)[:200]}"
            )
        if not tokens:
            raise InvalidResponseError("a prompt tokenized to zero tokens")
        return tuple(tokens)

    def build_detokenize(self, token_ids: Sequence[int], model: str | None) -> list[HttpCall]:
        """Calls that turn ``token_ids`` into text, one per endpoint to try, in order."""
        payload: dict[str, Any] = {"tokens": [int(t) for t in token_ids]}
        if model is not None:
            payload = {"model": model, **payload}
        return [HttpCall(path, payload, "detokenize") for path in self.detokenize_paths]

    def parse_detokenize(self, body: Any) -> str | None:
        """The text of a detokenize answer (``prompt`` or ``text``); ``None`` without one."""
        text = body.get("prompt", body.get("text")) if isinstance(body, dict) else None
        return text if isinstance(text, str) else None

    def full_vocab_top_k(self) -> int | None:
        """What to send as top-K to get the whole vocabulary (``None``: not possible)."""
        return None

    def hint_for_semantics(self, detected: str) -> str:
        """The fix to suggest when the server's logprob semantics are not the configured ones."""
        return ""

    def hint_for_seeds(self) -> str:
        return ""

    def hint_for_scoring(self) -> str:
        return ""


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
