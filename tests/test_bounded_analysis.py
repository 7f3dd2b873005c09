"""Bounded analysis: per-axis masks classified from product boxes (svgen.analysis.product),
block-causal `expr`s lowered to built-ins, the backward tables' check, and exactness at
1.74M tokens on sampled tiles. How fast and how small the analysis is at that size is
measured by bench/compile_speed.py, never asserted here."""

import numpy as np
import pytest

from svgen import ir
from svgen.analysis import _check_backward_tables, analyze, axis_terms, product
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.analysis.tables import build_runs, kernel_tiles, transposed_tiles
from svgen.spec.errors import SpecError
from svgen.spec.expr import parse_predicate
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.core.tables import KernelShape, transposed_runs, transposed_tables
from svgen.spec import parse_spec

from helpers import brute_force_kinds, dense_keep, lower_mask_dict, random_layout, random_mask
from spec_corpus import ANCHOR, any_of, spec_text


def _random_per_axis(rng, lay, depth=0):
    """A random mask of per-axis primitives only (the ones svgen.analysis.product takes)."""
    r = rng.random()
    if depth >= 3 or r < 0.4:
        return rng.choice(
            [
                lambda: ir.FirstFrame(int(rng.integers(1, lay.frames + 2))),
                lambda: ir.SpatialWindow(
                    int(rng.integers(0, lay.frames)),
                    _maybe(rng, lay.height),
                    _maybe(rng, lay.width),
                ),
                lambda: ir.TemporalStride(
                    int(rng.integers(0, lay.height)),
                    int(rng.integers(0, lay.width)),
                    int(rng.integers(1, 4)),
                    _maybe(rng, lay.frames),
                ),
                lambda: ir.CausalFrames(),
                lambda: ir.BlockCausal(int(rng.integers(1, lay.frames + 2))),
                lambda: ir.Text(),
            ]
        )()
    children = tuple(_random_per_axis(rng, lay, depth + 1) for _ in range(rng.integers(1, 4)))
    if r < 0.65:
        return ir.AnyOf(children)
    if r < 0.9:
        return ir.AllOf(children)
    return ir.Not(children[0])


def _per_axis_mask(rng, lay):
    """A random per-axis mask whose inclusion-exclusion sum is small enough for the product
    analysis (a union of many children has 2^children terms: those keep the row sets)."""
    while True:
        mask = ir.simplify(_random_per_axis(rng, lay))
        if axis_terms.applies(mask, lay):
            return mask


def _maybe(rng, size):
    return None if rng.random() < 0.3 else int(rng.integers(0, size))


@pytest.fixture(params=["default", "levels"])
def engine(request, monkeypatch):
    """The product engine as shipped (small grids: one count per pair of distinct tiles),
    and forced through every coarse-to-fine level in tiny passes."""
    if request.param == "levels":
        monkeypatch.setattr(product, "SIGNATURE_PAIRS", 0)
        monkeypatch.setattr(product, "TOP_LEVEL_PAIRS", 1)
        monkeypatch.setattr(product, "COMBOS_PER_PASS", 64)
    return request.param


@pytest.mark.parametrize("seed", range(120))
def test_per_axis_masks_match_brute_force(seed, engine):
    rng = np.random.default_rng(seed)
    lay = random_layout(rng)
    mask = _per_axis_mask(rng, lay)
    bq, bkv = int(rng.choice([8, 16, 40])), int(rng.choice([8, 16, 24]))
    _check_product(mask, lay, bq, bkv)


@pytest.mark.parametrize("seed", range(20))
def test_per_axis_masks_on_a_medium_geometry(seed, engine):
    """Tiles of many boxes (rows, frames, places, text), anchors, several levels."""
    rng = np.random.default_rng(500 + seed)
    order = str(rng.choice(["frame_major", "temporal_major"]))
    frames = int(rng.integers(6, 12))
    lay = TokenLayout(
        frames,
        int(rng.integers(3, 8)),
        int(rng.integers(5, 12)),
        int(rng.choice([0, 13])),
        str(rng.choice(["first", "last"])),
        order,
        int(rng.integers(0, 3)) if order == "temporal_major" else 0,
    )
    mask = _per_axis_mask(rng, lay)
    bq, bkv = int(rng.choice([16, 48, 64])), int(rng.choice([16, 40]))
    _check_product(mask, lay, bq, bkv)


def _check_product(mask, lay, bq, bkv):
    """The product analysis itself (classify_tiles may take the frame-invariant path) and
    classify_tiles, against brute force."""
    grid = TileGrid(lay.seq_len, bq, bkv)
    keep = dense_keep(mask, lay)
    expected = brute_force_kinds(keep, bq, bkv)
    got = product.classify_product(mask, lay, grid)
    assert got.kept == int(keep.sum())
    np.testing.assert_array_equal(got.kinds, expected)
    tiles = classify_tiles(mask, lay, grid)
    assert tiles.density_is_exact and tiles.kept_pairs == got.kept
    np.testing.assert_array_equal(tiles.kinds, expected)


def _brute_force_pair_counts(keep: np.ndarray, bq: int, bkv: int):
    """(BOUNDARY block index, their kept pairs, rows with keys, ... and none in the last kv
    block) per q block, from the dense mask: what classify_tiles(count_pairs=True) counts."""
    kinds = brute_force_kinds(keep, bq, bkv)
    nk = kinds.shape[1]
    index = np.flatnonzero(kinds.ravel() == TileKind.BOUNDARY)
    pairs = [
        keep[i * bq : (i + 1) * bq, j * bkv : (j + 1) * bkv].sum()
        for i, j in zip(*divmod(index, nk))
    ]
    has = keep.any(axis=1)
    none_last = ~keep[:, (nk - 1) * bkv :].any(axis=1)
    block = np.arange(keep.shape[0]) // bq
    return (
        index,
        np.asarray(pairs, np.int64),
        np.bincount(block[has], minlength=kinds.shape[0]),
        np.bincount(block[has & none_last], minlength=kinds.shape[0]),
    )


@pytest.mark.parametrize("seed", range(60))
def test_pair_counts_match_brute_force(seed, engine):
    """What `tiling.align` needs, from the product analysis."""
    rng = np.random.default_rng(300 + seed)
    lay = random_layout(rng)
    mask = _per_axis_mask(rng, lay)
    bq, bkv = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16, 24]))
    got = classify_tiles(mask, lay, TileGrid(lay.seq_len, bq, bkv), count_pairs=True)
    expected = _brute_force_pair_counts(dense_keep(mask, lay), bq, bkv)
    p = got.pairs
    for name, a, b in zip(
        ("index", "pairs", "rows", "rows without last"),
        (p.boundary_index, p.boundary_pairs, p.rows_with_keys, p.rows_without_last),
        expected,
    ):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_row_sets_count_an_interval_filling_one_kv_block_once(monkeypatch):
    """Rows whose keys are exactly one kv block (here: a frame of 8 tokens, blocks of 8) once
    counted that block's pairs twice in the row-set analysis."""
    monkeypatch.setattr(axis_terms, "applies", lambda mask, layout: False)
    lay = TokenLayout(2, 1, 8, 3, "last")
    mask = ir.SpatialWindow(0, None, None)
    got = classify_tiles(mask, lay, TileGrid(lay.seq_len, 32, 8), count_pairs=True)
    expected = _brute_force_pair_counts(dense_keep(mask, lay), 32, 8)
    np.testing.assert_array_equal(got.pairs.boundary_pairs, expected[1])


def test_other_masks_keep_the_row_sets():
    lay = TokenLayout(3, 4, 5)
    for mask in (ir.Band(7), ir.AnyOf((ir.FirstFrame(1), ir.Prefix(9)))):
        assert not axis_terms.applies(mask, lay)
    assert not axis_terms.applies(ir.CausalFrames(), TokenLayout(axis_terms.MAX_AXIS + 1, 1, 2))


# -- expr predicates lowered to built-ins ------------------------------------------------

BLOCK_CAUSAL = [  # each is block_causal (frames 3) on video pairs
    "f_k // 3 <= f_q // 3",
    "f_q // 3 >= f_k // 3",
    "f_k < 3 * (f_q // 3) + 3",
    "f_k // 3 < f_q // 3 + 1",
    "not (f_k // 3 > f_q // 3)",
]
COMBINATIONS = [  # recognized when the text terms make them exact (see expected below)
    "f_k // 3 <= f_q // 3 or is_text_q or is_text_k",
    "f_k // 3 <= f_q // 3 and not is_text_q and not is_text_k",
    "(f_k // 2 <= f_q // 2 and abs(h_q - h_k) <= 1) or is_text_k or is_text_q",
    "f_k // 2 <= f_q // 2 and abs(h_q - h_k) <= 1 and abs(w_q - w_k) <= 2",
    "f_k <= f_q and abs(f_q - f_k) <= 2",
    "f_k > f_q or h_q == h_k",
    "f_k < 2 or abs(f_q - f_k) <= 1",
    "not (f_k // 3 <= f_q // 3 and w_q == w_k)",
    "is_text_q or is_text_k",
    "not is_text_q and not is_text_k",
]
NOT_BUILTIN = [
    "abs(f_q // 3 - f_k // 3) <= 1 and abs(h_q // 2 - h_k // 2) <= 1",  # tiled window
    "f_k // 3 <= f_q // 3 + 1",  # one chunk ahead
    "f_k // 3 <= f_q // 3 or i_k < 4",
    "f_k <= f_q or is_text_q",
]


def _layouts():
    for text in (0, 5):
        for frames in (1, 4, 9):
            for position in ("first", "last"):
                yield TokenLayout(frames, 3, 4, text, position)


@pytest.mark.parametrize("source", BLOCK_CAUSAL + COMBINATIONS + NOT_BUILTIN)
def test_recognized_predicates_mean_what_they_say(source):
    """Whatever a predicate lowers to equals it on every pair (the IR oracle against
    svgen.spec.expr's own evaluation), with and without text tokens."""
    expr = parse_predicate(source)
    for lay in _layouts():
        node = ir.recognize_builtins(expr, lay)
        if node is None:
            continue
        assert source not in NOT_BUILTIN or lay.frames < 9, (source, lay)  # coincidences
        c = lay.coordinates(np.arange(lay.seq_len))
        q, k = c.reshape(-1, 1), c.reshape(1, -1)
        want = np.broadcast_to(ir.evaluate_sympy(expr, q, k), (lay.seq_len,) * 2)
        np.testing.assert_array_equal(ir.simplify(node).evaluate(q, k), want, err_msg=str(lay))


@pytest.mark.parametrize("source", BLOCK_CAUSAL)
def test_block_causal_predicates_become_block_causal(source):
    lay = TokenLayout(9, 3, 4)
    assert ir.recognize_builtins(parse_predicate(source), lay) == ir.BlockCausal(3)
    with_text = TokenLayout(9, 3, 4, 5)  # text pairs differ: not without guards
    assert ir.recognize_builtins(parse_predicate(source), with_text) is None


def test_combinations_are_recognized():
    lay, text = TokenLayout(9, 3, 4), TokenLayout(9, 3, 4, 5)
    for source in COMBINATIONS:
        expr = parse_predicate(source)
        guarded = "is_text" in source
        assert ir.recognize_builtins(expr, lay) is not None, source
        assert (ir.recognize_builtins(expr, text) is not None) == guarded, source
    expr = parse_predicate(COMBINATIONS[0])
    assert ir.simplify(ir.recognize_builtins(expr, text)) == ir.AnyOf(
        (ir.BlockCausal(3), ir.Text())
    )


# -- the backward tables' check ----------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_transposed_tiles_give_the_runtime_transposed_runs(seed):
    rng = np.random.default_rng(700 + seed)
    lay = random_layout(rng)
    cq, ckv = int(rng.choice([8, 16])), int(rng.choice([8, 16, 24]))
    bq, bkv = cq * int(rng.integers(1, 4)), ckv * int(rng.integers(1, 4))
    _, mask = lower_mask_dict(random_mask(rng, lay), lay, 128, 128)
    grid, compute = TileGrid(lay.seq_len, bq, bkv), TileGrid(lay.seq_len, cq, ckv)
    kind, word = kernel_tiles(classify_tiles(mask, lay, compute).kinds, grid, compute)
    shape = KernelShape(lay.seq_len, grid.padded_seq_len, bq, bkv, 128, 1, cq, ckv)
    expected = transposed_runs(build_runs(kind, word, grid), shape)
    got = build_runs(*transposed_tiles(kind, word, grid, compute), TileGrid(lay.seq_len, bkv, bq))
    np.testing.assert_array_equal(got, expected)


def test_backward_check_refuses_as_the_runtime_tables_do():
    text = spec_text(
        "causal_small",
        (9, 8, 16),
        3,
        dtype="bfloat16",
        patterns={
            "a": any_of(ANCHOR, "{spatial_window: {frames: 1, cols: 3}}"),
            "b": "{block_causal: {frames: 2}}",
        },
        layouts={"b": "temporal_major"},
        tiling="{block_q: 256, block_kv: 128, compute_q: 128, compute_kv: 128}",
    )
    plan = analyze(parse_spec(text))
    t = plan.spec.tiling
    shape = KernelShape(
        plan.grid.seq_len, plan.grid.padded_seq_len, t.block_q, t.block_kv, 128, 3, t.cq, t.ckv
    )
    runs = [p.table.runs for p in plan.patterns]
    tiles = [kernel_tiles(p.compute_kinds, p.grid, p.compute_grid) for p in plan.patterns]
    need = transposed_tables(runs, shape, 3, 1 << 30).scalar_prefetch_bytes(3)
    for budget in (need, need - 1, need // 3, 200):
        try:
            transposed_tables(runs, shape, 3, budget)
            expected = None
        except ValueError as err:
            expected = str(err)
        try:
            _check_backward_tables(plan.spec, plan.patterns, tiles, plan.target, budget)
            got = None
        except SpecError as err:
            got = err.message
        assert (got is None) == (expected is None), budget
        assert got is None or got.startswith(expected), (got, expected)


# -- 1.74M tokens: sampled tiles against the oracle ------------------------------------------

VIDEO_2K = TokenLayout(121, 90, 160)  # 1,742,400 tokens


def _axis_pairs(n: int, relation) -> int:
    """Pairs (x_q, x_k) of one axis in a relation, by brute force over the axis."""
    x = np.arange(n)
    return int(np.broadcast_to(relation(x[:, None], x[None, :]), (n, n)).sum())


def _near(radius):
    return lambda q, k: np.abs(q - k) <= radius


LARGE = [
    # (name, layout, mask, exact kept pairs as products of per-axis brute-force counts)
    (
        "window_3d",
        VIDEO_2K,
        ir.SpatialWindow(3, 12, 20),
        lambda: (
            _axis_pairs(121, _near(3)) * _axis_pairs(90, _near(12)) * _axis_pairs(160, _near(20))
        ),
    ),
    (
        "window_3d_first_frame",
        VIDEO_2K,
        ir.AnyOf((ir.FirstFrame(1), ir.SpatialWindow(3, 12, 20))),
        lambda: (
            _axis_pairs(121, lambda q, k: k < 1) * 14400**2
            + _axis_pairs(121, _near(3)) * _axis_pairs(90, _near(12)) * _axis_pairs(160, _near(20))
            - _axis_pairs(121, lambda q, k: (k < 1) & (np.abs(q - k) <= 3))
            * _axis_pairs(90, _near(12))
            * _axis_pairs(160, _near(20))
        ),
    ),
    (
        "window_3d_temporal_major",
        VIDEO_2K.with_order("temporal_major", 0),
        ir.SpatialWindow(3, 12, 20),
        lambda: (
            _axis_pairs(121, _near(3)) * _axis_pairs(90, _near(12)) * _axis_pairs(160, _near(20))
        ),
    ),
    (
        "block_causal",
        VIDEO_2K,
        ir.BlockCausal(3),
        lambda: _axis_pairs(121, lambda q, k: k // 3 <= q // 3) * 14400**2,
    ),
    (
        "block_causal_temporal_major",
        VIDEO_2K.with_order("temporal_major", 1),
        ir.AnyOf((ir.FirstFrame(1), ir.BlockCausal(3))),
        lambda: _axis_pairs(121, lambda q, k: (k < 1) | (k // 3 <= q // 3)) * 14400**2,
    ),
]


@pytest.mark.parametrize("name,lay,mask,kept", LARGE, ids=[c[0] for c in LARGE])
def test_large_geometry_is_exact_on_sampled_tiles(name, lay, mask, kept):
    """Compute blocks of 1024 x 512 at 1,742,400 tokens: the kinds of sampled blocks (half
    of them visited) equal brute force over just those blocks, the kept pairs equal an
    independent count, and they lie between the FULL blocks' pairs and the visited ones'."""
    grid = TileGrid(lay.seq_len, 1024, 512)
    got = classify_tiles(mask, lay, grid)
    assert got.density_is_exact and got.kept_pairs == kept()
    full, visited = _pairs_of(got.kinds, grid, TileKind.FULL), _pairs_of(got.kinds, grid, None)
    assert full <= got.kept_pairs <= visited
    rng = np.random.default_rng(len(name))
    nq, nk = got.kinds.shape
    touched = np.argwhere(got.kinds != TileKind.EMPTY)
    samples = np.concatenate(
        [
            np.stack([rng.integers(0, nq, 20), rng.integers(0, nk, 20)], axis=1),
            touched[rng.integers(0, len(touched), 20)],
        ]
    )
    for i, j in samples:
        q = lay.coordinates(np.arange(i * 1024, min((i + 1) * 1024, lay.seq_len)))
        k = lay.coordinates(np.arange(j * 512, min((j + 1) * 512, lay.seq_len)))
        tile = mask.evaluate(q.reshape(-1, 1), k.reshape(1, -1))
        expected = TileKind.FULL if tile.all() else TileKind.BOUNDARY if tile.any() else 0
        assert got.kinds[i, j] == expected, (i, j)


def _pairs_of(kinds, grid, kind) -> int:
    """Real pairs of the blocks of `kind` (None: every visited block)."""
    q, k = np.nonzero(kinds != TileKind.EMPTY if kind is None else kinds == kind)
    rows = np.minimum((q + 1) * grid.block_q, grid.seq_len) - q * grid.block_q
    keys = np.minimum((k + 1) * grid.block_kv, grid.seq_len) - k * grid.block_kv
    return int((rows * keys).sum())


def test_block_causal_expr_with_text_is_exact_at_large_size():
    """A block-causal `expr` (text global) lowers to built-ins, so `analyze` reports an exact
    density: block-causal video pairs plus every pair with a text token."""
    spec = parse_spec(
        """
svgen: 1
name: causal_expr_2k
geometry: {frames: 121, height: 90, width: 160, text_tokens: 512}
attention: {heads: 4, head_dim: 128, dtype: bfloat16}
mask: {expr: "f_k // 3 <= f_q // 3 or is_text_q or is_text_k"}
tiling: {block_q: 2048, block_kv: 2048, compute_q: 1024, compute_kv: 512}
"""
    )
    plan = analyze(spec)
    p = plan.only
    assert ir.simplify(p.mask) == ir.AnyOf((ir.BlockCausal(3), ir.Text()))
    assert p.classification.density_is_exact
    video, text = 121 * 14400, 512
    causal = _axis_pairs(121, lambda q, k: k // 3 <= q // 3) * 14400**2
    assert p.classification.kept_pairs == causal + (video + text) ** 2 - video**2
