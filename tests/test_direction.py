"""One meaning of better, best and reached (storage/direction.py), whichever way a metric goes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from goaltender.storage.direction import best_of, better, reached

finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
directions = st.sampled_from(["maximize", "minimize"])


@given(finite, finite, directions)
def test_better_is_strict_and_reached_is_not(a, b, direction):
    assert not better(a, a, direction) and reached(a, a, direction)
    assert better(a, b, direction) == (a > b if direction == "maximize" else a < b)
    assert reached(a, b, direction) == (a >= b if direction == "maximize" else a <= b)
    assert better(a, b, direction) == (reached(a, b, direction) and a != b)


@given(st.lists(finite, max_size=20), directions)
def test_the_best_is_the_first_of_equals(values, direction):
    items = list(enumerate(values))
    found = best_of(items, lambda item: item[1], direction)
    if not values:
        assert found is None
        return
    assert found is not None
    top = max(values) if direction == "maximize" else min(values)
    assert found[1] == top and found[0] == values.index(top)
