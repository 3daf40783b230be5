"""A reference model whose rows cost O(1) per token, for timing runs of the latency server.

:class:`~presto_client.core.reference.ReferenceModel` hashes the whole context for every row (its
logits depend on every token), which costs O(context) per generated token: at ``T = 1024`` the
latency server's worker thread cannot keep up with a GPU-speed step clock on a 2-core machine,
and the run then measures this machine's CPU instead of the cost model (``starved_share``).

This model draws its rows from a fixed table of ``rows`` log-softmaxed normal logit vectors (the
reference model's row law), picked by a hash of the position and the last ``memory`` tokens: a
finite-memory language model. Same row law, same sampling and rendering through the emulation,
but a row is one table lookup. Only timing runs use it (``--model windowed``); the exactness tests
and the latency server's default keep the reference model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from presto_client.core.engine_protocol import FloatArray
from presto_client.core.logprob_math import log_softmax
from presto_client.core.reference import ReferenceModel


class WindowedReferenceModel(ReferenceModel):
    """Rows from a table indexed by ``hash(position, last memory tokens)``."""

    def __init__(
        self,
        vocab_size: int,
        *,
        seed: int = 0,
        logit_scale: float = 1.5,
        memory: int = 8,
        rows: int = 1 << 14,
    ) -> None:
        super().__init__(vocab_size, seed=seed, logit_scale=logit_scale)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5EED,)))
        self._table = log_softmax(rng.normal(scale=logit_scale, size=(rows, vocab_size)))
        self._memory = memory

    def logprobs(self, context: Sequence[int]) -> FloatArray:
        # Python's hash of a tuple of ints is deterministic (no per-process salt for ints).
        key = hash((len(context), *context[-self._memory :]))
        row: FloatArray = self._table[key % self._table.shape[0]]
        return row

    def trim_cache(self, max_rows: int) -> None:
        return None
