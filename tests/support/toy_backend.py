"""A complete backend in one small file: the example of docs/architecture.md ("add a backend").

The "toy" dialect: ``POST /toy/generate`` with ``{"prompt": [ids], "n": N, "temperature": T,
"seed": S, "k": K}`` answers ``{"tokens": [ids], "logprobs": [raw log p0 of each token],
"top": [[[id, raw logprob], ...] per token]}``. Raw logprobs make ``log q_τ`` a certified interval
from the top-K (the shared code in :mod:`backends.adapter` does that); the adapter only builds the
request and parses the answer, both pure functions of dicts.

Registered as ``kind: toy`` with ``backends.register_backend("toy", ToyAdapter)``, or by an
installed distribution's entry point in the group ``presto_client.backends``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from presto_client.backends.adapter import RAW, Adapter, DialectTraits, HttpCall
from presto_client.backends.parsing import TokenLogprobs, check_length, topk_rows
from presto_client.core.engine_protocol import ProposalRequest
from presto_client.errors import InvalidResponseError


class ToyAdapter(Adapter):
    # The whole required core: the traits, one builder and one parser (no optional part).
    traits: ClassVar[DialectTraits] = DialectTraits(dialect="toy", modes=(RAW,), default_mode=RAW)

    def build_generate(
        self, request: ProposalRequest, model: str, *, label: str, stream: bool = False
    ) -> HttpCall:
        payload = {
            "model": model,
            "prompt": list(request.prefix),
            "n": request.num_tokens,
            "temperature": request.temperature,
            "seed": request.seed,
            "k": self.spec.top_k,
        }
        return HttpCall("/toy/generate", payload, label)

    def parse_generate(self, request: ProposalRequest, body: Any, *, label: str) -> TokenLogprobs:
        if not isinstance(body, dict) or not isinstance(body.get("tokens"), list):
            raise InvalidResponseError(f"{label}: expected {{tokens, logprobs, top}}")
        check_length(len(body["tokens"]), request.num_tokens, label=label)
        rows = [[(int(i), float(lp)) for i, lp in row] for row in body["top"]]
        top_ids, top_lps = topk_rows(rows, self.spec.top_k, label=label)
        return TokenLogprobs(
            np.asarray(body["tokens"], dtype=np.int64),
            np.asarray(body["logprobs"], dtype=np.float64),
            top_ids,
            top_lps,
        )
