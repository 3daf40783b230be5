"""The reference model's fast SeedSequence equals NumPy's ``spawn_key`` construction."""

from __future__ import annotations

import numpy as np
import pytest

from presto_client.core.reference import ReferenceModel


@pytest.mark.parametrize("seed", [0, 5, 2**32 - 1, 2**40, 2**200])
def test_fast_seed_sequence_matches_spawn_key(seed: int) -> None:
    model = ReferenceModel(64, seed=seed)
    rng = np.random.default_rng(1)
    for length in (0, 1, 3, 4, 5, 50, 700):
        key = tuple(int(x) for x in rng.integers(0, 64, length))
        slow = np.random.SeedSequence(seed, spawn_key=(len(key), *key))
        fast = model._seed_sequence(key)
        assert (slow.generate_state(8) == fast.generate_state(8)).all()


def test_large_token_ids_take_numpy_path() -> None:
    model = ReferenceModel(4, seed=3)
    key = (1, 2**33, 0)
    slow = np.random.SeedSequence(3, spawn_key=(len(key), *key))
    assert (slow.generate_state(4) == model._seed_sequence(key).generate_state(4)).all()


def test_iter_sample_is_sample() -> None:
    model = ReferenceModel(16, seed=2)
    ids, rows = model.sample([1, 2, 3], 20, 0.5, seed=9)
    pairs = list(ReferenceModel(16, seed=2).iter_sample([1, 2, 3], 20, 0.5, seed=9))
    assert ids == [t for t, _ in pairs]
    assert np.array_equal(rows, np.stack([r for _, r in pairs]))
