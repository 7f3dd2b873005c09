import numpy as np
import pytest

from svgen.analysis.intervals import IntervalSet, ragged_arange


def _as_set(s: IntervalSet) -> set[int]:
    return {x for a, b in zip(s.starts.tolist(), s.ends.tolist()) for x in range(a, b)}


def _random_set(rng, n, span):
    starts = rng.integers(0, span, n)
    return IntervalSet.normalized(starts, starts + rng.integers(0, 8, n))


def _check_invariant(s: IntervalSet):
    assert np.all(s.ends > s.starts)
    assert np.all(s.starts[1:] > s.ends[:-1])  # sorted, disjoint, not touching


@pytest.mark.parametrize("seed", range(40))
def test_set_algebra_matches_python_sets(seed):
    rng = np.random.default_rng(seed)
    a, b = _random_set(rng, rng.integers(0, 12), 60), _random_set(rng, rng.integers(0, 12), 60)
    universe = IntervalSet(np.array([0, 70]), np.array([50, 90]))
    for s in (a, b, a.union(b), a.intersection(b), a.complement_within(universe)):
        _check_invariant(s)
    assert _as_set(a.union(b)) == _as_set(a) | _as_set(b)
    assert _as_set(a.intersection(b)) == _as_set(a) & _as_set(b)
    assert _as_set(a.complement_within(universe)) == _as_set(universe) - _as_set(a)
    assert a.total_length() == len(_as_set(a))


def test_touching_intervals_merge():
    s = IntervalSet.normalized([5, 0, 3], [7, 3, 4])
    assert s.starts.tolist() == [0, 5] and s.ends.tolist() == [4, 7]


def test_ragged_arange():
    assert ragged_arange(np.array([2, 0, 3])).tolist() == [0, 1, 0, 1, 2]
