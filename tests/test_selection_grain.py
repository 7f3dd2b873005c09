"""bench/selection_grain.py: how VMoBA's key blocks fall on svgen's compute blocks, counted
from coordinates, checked here against counts made by hand and against each layout's order."""

from __future__ import annotations

import sys

import pytest

sys.path.insert(0, "bench")
from selection_grain import Partition, measure  # noqa: E402


def test_one_frame_blocks_counted_by_hand():
    """3 frames of 4 x 5 = 20 tokens, compute blocks of 16: blocks [0, 20), [20, 40),
    [40, 60) touch compute blocks of 16 + 16, 16 + 16 and 16 + 12 keys (92 for 60), and two of
    the four compute blocks hold two frames."""
    row = measure(Partition("1-D", (1,)), 3, 4, 5, 16)
    assert row["one_run"] and not row["exact"]
    assert row["key_excess"] == pytest.approx(92 / 60 - 1, abs=1e-4)
    assert row["shared_query_blocks"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "partition, compute, exact",
    [
        (Partition("2-D", (2, 4)), 24, True),  # 3 frames x 2 x 4 = 24 tokens a block
        (Partition("2-D", (2, 4)), 16, False),
        (Partition("3-D", (1, 2, 8)), 16, True),
        (Partition("3-D", (3, 2, 8)), 32, False),  # 48-token cubes
    ],
)
def test_blocks_are_runs_of_the_tiled_order(partition, compute, exact):
    """The tiled layout reproduces VMoBA's permutation: every block one run of kernel
    positions; exact exactly when each block is a whole number of compute blocks."""
    row = measure(partition, 3, 4, 8, compute)
    assert row["one_run"]
    assert row["exact"] == exact
    assert (row["key_excess"] == 0) == exact


def test_frame_major_does_not_make_patches_runs():
    """A 2-D patch across frames is no run of the frame-major order: the check can fail."""
    p = Partition("2-D", (2, 4))
    assert measure(p, 3, 4, 8, 24)["one_run"]

    class FrameMajor(Partition):
        def layout(self, video):
            return video

    assert not measure(FrameMajor(p.kind, p.sizes), 3, 4, 8, 24)["one_run"]


def test_sizes_that_do_not_divide_are_refused():
    with pytest.raises(ValueError, match="does not divide"):
        measure(Partition("2-D", (3, 4)), 3, 4, 8, 16)
