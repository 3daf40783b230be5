"""The client's placement of requests on a server's slots (backends/slots.py)."""

from __future__ import annotations

import numpy as np
import pytest

from presto_client.backends.slots import SlotPlan, shared_prefix


def test_shared_prefix_counts_the_leading_tokens_in_common() -> None:
    a = np.array([1, 2, 3, 4])
    assert shared_prefix(a, np.array([1, 2, 9])) == 2
    assert shared_prefix(a, np.array([1, 2])) == 2
    assert shared_prefix(a, np.array([7])) == 0
    assert shared_prefix(np.zeros(0, dtype=np.int64), a) == 0


def test_a_request_goes_to_the_free_slot_sharing_its_longest_prefix() -> None:
    plan = SlotPlan(3)
    a, b, c = plan.take([1, 2]), plan.take([5, 6]), plan.take([9])
    assert sorted((a, b, c)) == [0, 1, 2]
    plan.give_back(a, [1, 2, 3, 4])
    plan.give_back(b, [5, 6, 7])
    plan.give_back(c, [9, 9])
    assert plan.take([5, 6, 7, 8]) == b
    assert plan.take([1, 2, 3]) == a
    assert plan.take([1, 2, 3]) == c  # the only one left
    assert plan.take([1]) is None  # every slot handed out: the server chooses


def test_with_nothing_shared_the_least_recently_used_slot_is_taken() -> None:
    plan = SlotPlan(2)
    s0, s1 = plan.take([1]), plan.take([2])
    assert s0 is not None and s1 is not None
    plan.give_back(s1, [2])
    plan.give_back(s0, [1])
    assert plan.take([7]) == s1


def test_a_plan_needs_a_slot() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        SlotPlan(0)
