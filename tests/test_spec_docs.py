"""docs/spec.md states what the spec reader accepts and what the curves do as the code has
them: the `attention` keys' allowed values, and the Hilbert and Morton curves' orientation."""

import re

import numpy as np
import pytest

from helpers import REPO
from svgen.core.curves import curve_places
from svgen.spec import parse_spec
from svgen.spec.errors import SpecError
from svgen.spec.limits import MAX_HEADS
from svgen.spec.model import DTYPES, HEAD_DIMS, SOFTMAX_MODES

DOC = (REPO / "docs" / "spec.md").read_text()


def _attention_row(key: str) -> str:
    """The `allowed` cell of the key's row in the `attention` table."""
    (row,) = [line for line in DOC.splitlines() if line.startswith(f"| `{key}` |")]
    return row.split("|")[2]


def _quoted(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_attention_values_are_the_readers():
    assert _quoted(_attention_row("head_dim")) == [str(d) for d in HEAD_DIMS]
    assert _quoted(_attention_row("dtype")) == list(DTYPES)
    assert _quoted(_attention_row("softmax")) == list(SOFTMAX_MODES)
    assert f"1 to {MAX_HEADS:,}" in _attention_row("heads")


@pytest.mark.parametrize("key, value", [("head_dim", "32"), ("dtype", "float16")])
def test_a_value_the_docs_do_not_list_is_refused_naming_the_allowed(key, value):
    text = (REPO / "examples" / "first_kernel.yaml").read_text()
    default = {"head_dim": "64", "dtype": "float32"}[key]
    with pytest.raises(SpecError, match=f"attention.{key}: must be one of"):
        parse_spec(text.replace(f"{key}: {default}", f"{key}: {value}"))


def _positions(kind: str, side: int) -> np.ndarray:
    """Each place's position along the curve, as a side x side grid (row 0 on top)."""
    order = curve_places(kind, side, side)
    grid = np.empty(side * side, np.int64)
    grid[order] = np.arange(side * side)
    return grid.reshape(side, side)


def test_the_hilbert_orientation_is_the_curves():
    """The 4 x 4 and 2 x 2 grids printed in docs/spec.md are the curve's; every power-of-two
    square starts at (0, 0) and ends at row 0's last column, its first step down a row where
    the side's exponent is odd, along the row where it is even."""
    block = DOC.split("Its orientation:", 1)[1].split("```\n", 2)[1]
    rows = [line.split() for line in block.splitlines()]
    four = np.array([row[:4] for row in rows], np.int64)
    two = np.array([row[4:] for row in rows[:2]], np.int64)
    assert (four == _positions("hilbert", 4)).all() and (two == _positions("hilbert", 2)).all()
    for k in range(1, 6):
        grid = _positions("hilbert", 2**k)
        assert grid[0, 0] == 0 and grid[0, -1] == 4**k - 1
        assert grid[1, 0] == 1 if k % 2 else grid[0, 1] == 1, k


def test_the_morton_orientation_is_the_curves():
    assert (_positions("morton", 2) == [[0, 1], [2, 3]]).all()
    assert "the column's the lowest" in DOC
