"""The prefix KV cache on its own (small tensors, no model)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.embedded

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from presto_client.embedded.batching import KVList, PrefixCache  # noqa: E402


def kv_for(tokens: list[int], layers: int = 2) -> KVList:
    """Fake per-layer KV whose values record the token at each position."""
    t = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1).expand(1, 2, -1, 3)
    return [(t.clone() + li, -t.clone() - li) for li in range(layers)]


def test_longest_common_prefix_is_returned() -> None:
    cache = PrefixCache(capacity_bytes=1 << 20)
    cache.insert([1, 2, 3, 4, 5], kv_for([1, 2, 3, 4, 5]))
    cache.insert([1, 2, 9], kv_for([1, 2, 9]))
    kv, n = cache.lookup([1, 2, 3, 4, 7, 8], limit=5)
    assert n == 4
    assert kv is not None and kv[0][0].shape[2] == 4
    assert kv[1][0][0, 0, :, 0].tolist() == [2.0, 3.0, 4.0, 5.0]  # tokens 1..4, layer offset 1
    assert cache.lookup([1, 2, 3, 4, 5], limit=4)[1] == 4  # the limit caps the reuse
    assert cache.lookup([7, 7], limit=1) == (None, 0)


def test_prefixes_are_subsumed_and_lru_evicts() -> None:
    one = sum(k.nelement() * k.element_size() * 2 for k, _ in kv_for([0] * 4))
    cache = PrefixCache(capacity_bytes=2 * one)
    cache.insert([1, 2], kv_for([1, 2]))
    cache.insert([1, 2, 3, 4], kv_for([1, 2, 3, 4]))  # covers [1, 2]
    assert len(cache) == 1
    cache.insert([1, 2, 3], kv_for([1, 2, 3]))  # already covered: nothing stored
    assert len(cache) == 1
    cache.insert([5, 6, 7, 8], kv_for([5, 6, 7, 8]))
    cache.lookup([1, 2, 3, 4], limit=4)  # touch the first entry
    cache.insert([9, 9, 9, 9], kv_for([9, 9, 9, 9]))  # evicts the least recently used
    assert cache.lookup([5, 6], limit=2) == (None, 0)
    assert cache.lookup([1, 2, 3], limit=3)[1] == 3
    assert cache.nbytes <= 2 * one


def test_stored_tensors_are_not_mutated_by_users() -> None:
    cache = PrefixCache(capacity_bytes=1 << 20)
    cache.insert([1, 2, 3], kv_for([1, 2, 3]))
    kv, _ = cache.lookup([1, 2, 3, 4], limit=3)
    assert kv is not None
    grown = torch.cat([kv[0][0], torch.zeros(1, 2, 1, 3)], dim=2)  # what DynamicLayer.update does
    grown.fill_(42.0)
    again, _ = cache.lookup([1, 2, 3], limit=3)
    assert again is not None and again[0][0][0, 0, :, 0].tolist() == [1.0, 2.0, 3.0]


def test_every_operation_waits_for_the_cache_lock() -> None:
    """The server resets and counts the cache from HTTP threads while the worker inserts and
    looks up: every operation holds one lock (a reset racing an insert once killed the worker
    with a KeyError during warm-up)."""
    import threading

    cache = PrefixCache(capacity_bytes=1 << 22)
    cache.insert([1, 2, 3], kv_for([1, 2, 3]))
    operations = {
        "clear": cache.clear,
        "len": lambda: len(cache),
        "insert": lambda: cache.insert([4, 5], kv_for([4, 5])),
        "lookup": lambda: cache.lookup([1, 2], limit=2),
    }
    for name, operation in operations.items():
        done = threading.Event()

        def run(op=operation, flag=done) -> None:  # type: ignore[no-untyped-def]
            op()
            flag.set()

        with cache._lock:
            thread = threading.Thread(target=run)
            thread.start()
            assert not done.wait(0.05), f"{name} did not wait for the lock"
        assert done.wait(5), f"{name} never finished"
        thread.join()
