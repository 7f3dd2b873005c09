"""`neighborhood` and `radial` against brute force written from their papers' definitions,
in all three token orders, with text tokens on either side: the clamped window at the
borders, dilations that do not divide the axis, the causal frame window, radial bands at
frame distances 0, 1, 2-3, 4-7, ... and windows below one place. Their analysis is exact."""

import numpy as np
import pytest

from svgen.analysis.classify import TileGrid, classify_tiles

from helpers import (
    brute_force_kinds,
    dense_keep,
    lower_mask_dict,
    random_any_layout,
    random_neighborhood,
)


def _natten_axis(x_q, x_k, size, kernel, dilation, causal):
    """NATTEN on one axis, from its definition: the query's residue class r = x mod d is a
    sub-sequence of ceil((size - r) / d) positions; the window is `kernel` consecutive ones
    of it, centered on the query and shifted inward at the sub-sequence's ends (causal: the
    kernel - 1 before the query's and its own, cut at the start)."""
    if kernel is None:
        return np.ones(np.broadcast_shapes(x_q.shape, x_k.shape), bool)
    same = (x_q % dilation) == (x_k % dilation)
    i_q, i_k = x_q // dilation, x_k // dilation
    if causal:
        return same & (i_k <= i_q) & (i_k >= i_q - (kernel - 1))
    length = -(-(size - x_q % dilation) // dilation)
    start = np.clip(i_q - kernel // 2, 0, np.maximum(length - kernel, 0))
    return same & (i_k >= start) & (i_k < start + kernel)


def _natten_keep(lay, params):
    pos = np.arange(lay.seq_len)
    c = lay.coordinates(pos)
    q = {a: getattr(c, a)[:, None] for a in ("frame", "row", "col")}
    k = {a: getattr(c, a)[None, :] for a in ("frame", "row", "col")}
    keep = ~c.is_text[:, None] & ~c.is_text[None, :]
    for axis, name, size in (
        ("frame", "frames", lay.frames),
        ("row", "rows", lay.height),
        ("col", "cols", lay.width),
    ):
        keep = keep & _natten_axis(
            q[axis],
            k[axis],
            size,
            params.get(name),
            params.get(f"{name[:-1]}_dilation", 1),
            bool(params.get("causal")) and axis == "frame",
        )
    return keep


def _radial_keep(lay, params):
    """Radial Attention: r = floor(log2(max(d, 1))) for frame distance d; keep when the place
    distance is below width / 2^r (width: a frame's places unless given)."""
    pos = np.arange(lay.seq_len)
    c = lay.coordinates(pos)
    width = params.get("width", lay.height * lay.width)
    d = np.abs(c.frame[:, None] - c.frame[None, :])
    r = np.floor(np.log2(np.maximum(d, 1))).astype(np.int64)
    place = c.row * lay.width + c.col
    near = np.abs(place[:, None] - place[None, :]) * (2.0**r) < width
    return near & ~c.is_text[:, None] & ~c.is_text[None, :]


def _check(mask_dict, want, lay):
    _, mask = lower_mask_dict(mask_dict, lay, 128, 128)
    np.testing.assert_array_equal(dense_keep(mask, lay), want, err_msg=str(mask_dict))
    grid = TileGrid(lay.seq_len, 8, 16)
    got = classify_tiles(mask, lay, grid)
    assert got.density_is_exact and got.kept_pairs == int(want.sum())
    np.testing.assert_array_equal(got.kinds, brute_force_kinds(want, 8, 16))


@pytest.mark.parametrize("seed", range(60))
def test_neighborhood_is_natten(seed):
    rng = np.random.default_rng(4400 + seed)
    lay = random_any_layout(rng)
    params = random_neighborhood(rng, lay, sized=0.85, dilated=0.4, least_dilation=2)
    _check({"neighborhood": params}, _natten_keep(lay, params), lay)


def test_neighborhood_keeps_the_whole_window_everywhere():
    """Every query keeps frames x rows x cols keys: the window shifts at the edges."""
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(5, 6, 9)
    params = {"frames": 3, "rows": 3, "cols": 5}
    _, mask = lower_mask_dict({"neighborhood": params}, lay, 128, 128)
    assert np.all(dense_keep(mask, lay).sum(axis=1) == 3 * 3 * 5)


@pytest.mark.parametrize("seed", range(40))
def test_radial_is_radial_attention(seed):
    rng = np.random.default_rng(5500 + seed)
    lay = random_any_layout(rng)
    if lay.frames < 3 and rng.random() < 0.8:
        from svgen.core.layout import TokenLayout

        lay = TokenLayout(int(rng.integers(9, 18)), 2, 3, 4, "first")  # bands up to 8-15
    params = {} if rng.random() < 0.3 else {"width": int(rng.integers(1, 12))}
    _check({"radial": params}, _radial_keep(lay, params), lay)
