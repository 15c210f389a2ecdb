"""The placement rows and the point intervals the search's speed-ups compute: the same as the plain forms."""

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from trnopt.optimizer.search.bounds import _times_array
from trnopt.optimizer.search.placements import rows_within
from trnopt.optimizer.search.space import block_step, divisors

AXES = st.lists(st.sampled_from([1, 2, 4, 8, 16, 3, 6, 12]), min_size=1, max_size=4).map(tuple)


def _plain_rows(left, degree):
    """Every row dividing ``left`` axis by axis whose product is ``degree``, in product order."""
    return [row for row in itertools.product(*(divisors(n) for n in left)) if math.prod(row) == degree]


@settings(max_examples=200, deadline=None)
@given(left=AXES, data=st.data())
def test_rows_keep_the_instance_blocks_as_block_step_does_in_the_same_order(left, data):
    degree = data.draw(st.sampled_from(divisors(math.prod(left))))
    inside = tuple(data.draw(st.sampled_from(divisors(n))) for n in left)
    cumulative = tuple(data.draw(st.sampled_from(divisors(n))) for n in inside)
    state = (cumulative, data.draw(st.booleans()))
    expected = [(row, block_step(inside, state, row)) for row in _plain_rows(left, degree)]
    assert list(rows_within(left, degree, inside, state)) == [(r, s) for r, s in expected if s is not None]
    assert [r for r, _ in rows_within(left, degree)] == _plain_rows(left, degree)


def test_one_number_intervals_multiply_as_two():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-2, 3, 50), rng.uniform(-1, 4, 50)
    one = _times_array((a, a), (b, b))
    two = _times_array((a, a.copy()), (b, b.copy()))
    assert one[0] is one[1]
    assert np.array_equal(one[0], two[0]) and np.array_equal(one[1], two[1])
