"""Tile classification against brute force, over hundreds of seeded random masks."""

import numpy as np
import pytest

from svgen import ir
from svgen.spec import primitives
from svgen.analysis import analyze
from svgen.analysis import axis_relations, axis_terms
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.spec.expr import parse_predicate
from svgen.core.layout import TokenLayout
from svgen.core.kinds import TileKind

from helpers import (
    PRIMITIVE_GENERATORS,
    brute_force_kinds,
    dense_keep,
    lower_mask_dict,
    random_any_layout,
    random_axis_predicate,
    random_layout,
    random_mask,
)


@pytest.mark.parametrize(
    "key",
    [p.key for p in primitives.registered() if p.form in (primitives.PARAMS, primitives.PREDICATE)],
)
def test_every_primitive_is_generated(key):
    """The random masks below (and the codegen and kernel tests that reuse them) reach every
    primitive of the registry."""
    assert key in PRIMITIVE_GENERATORS, f"add {key!r} to PRIMITIVE_GENERATORS"


def _check(kinds, kept, keep, expected_kinds, exact):
    """exact: built-ins, or a user predicate whose open pairs were all evaluated."""
    assert kept == int(keep.sum())
    if exact:
        np.testing.assert_array_equal(kinds, expected_kinds)
    else:  # sound: EMPTY and FULL only where brute force agrees
        assert np.all((kinds != TileKind.EMPTY) | (expected_kinds == TileKind.EMPTY))
        assert np.all((kinds != TileKind.FULL) | (expected_kinds == TileKind.FULL))


@pytest.mark.parametrize("seed", range(300))
def test_random_masks_small_tiles(seed):
    """Small tiles (8..24, sizes that do not divide them) give many tiles per case."""
    rng = np.random.default_rng(seed)
    lay = random_layout(rng)
    bq, bkv = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16, 24]))
    _, mask = lower_mask_dict(random_mask(rng, lay), lay, 128, 128)
    got = classify_tiles(mask, lay, TileGrid(lay.seq_len, bq, bkv))
    keep = dense_keep(mask, lay)
    assert got.density_is_exact and got.unproven_tiles == 0  # small: within the budget
    _check(got.kinds, got.kept_pairs, keep, brute_force_kinds(keep, bq, bkv), exact=True)


@pytest.mark.parametrize("seed", range(40))
def test_random_specs_through_the_whole_analysis(seed):
    """Spec text -> analyze(): real block sizes, geometries that do not divide them."""
    rng = np.random.default_rng(1000 + seed)
    lay = TokenLayout(
        int(rng.integers(2, 6)),
        int(rng.integers(3, 9)),
        int(rng.integers(10, 30)),
        int(rng.choice([0, 40])),
        "first" if bool(rng.integers(0, 2)) else "last",
    )
    bq, bkv = int(rng.choice([128, 256])), int(rng.choice([128, 256]))
    spec, mask = lower_mask_dict(random_mask(rng, lay), lay, bq, bkv)
    plan = analyze(spec)
    keep = dense_keep(mask, lay)
    _check(
        plan.kinds,
        plan.classification.kept_pairs,
        keep,
        brute_force_kinds(keep, bq, bkv),
        exact=plan.classification.density_is_exact,
    )
    assert plan.density == pytest.approx(keep.mean())


def _window_brute_force(lay: TokenLayout, rows, cols) -> np.ndarray:
    """keep[q, k] of "both video, |dh| <= rows, |dw| <= cols, any frame" read off the
    layout's coordinates, without the IR (None: unbounded)."""
    c = lay.coordinates(np.arange(lay.seq_len))
    q, k = c.reshape(-1, 1), c.reshape(1, -1)
    keep = ~q.is_text & ~k.is_text
    for a, b, bound in ((q.row, k.row, rows), (q.col, k.col, cols)):
        if bound is not None:
            keep = keep & (np.abs(a - b) <= bound)
    return keep


WINDOWS_WITHOUT_FRAMES = [({"rows": 1, "cols": 2}, 1, 2), ({"cols": 0}, None, 0), ({}, None, None)]


@pytest.mark.parametrize("params, rows, cols", WINDOWS_WITHOUT_FRAMES)
@pytest.mark.parametrize("order", ["frame_major", "temporal_major"])
def test_spatial_window_without_frames_spans_every_frame(params, rows, cols, order):
    """`frames` omitted means every frame (docs/spec.md): the lowered mask keeps what a brute
    force over the coordinates keeps, and its tiles are classified exactly."""
    lay = TokenLayout(6, 3, 5, 11, "first", order)
    _, node = lower_mask_dict({"spatial_window": params}, lay, 128, 128)
    keep = _window_brute_force(lay, rows, cols)
    np.testing.assert_array_equal(dense_keep(node, lay), keep)
    for bq, bkv in ((8, 8), (16, 24)):
        got = classify_tiles(node, lay, TileGrid(lay.seq_len, bq, bkv))
        assert got.density_is_exact
        _check(got.kinds, got.kept_pairs, keep, brute_force_kinds(keep, bq, bkv), exact=True)


def _combinations(window: dict) -> list[dict]:
    return [
        {"any_of": [{"spatial_window": {"rows": 0, **window}}, {"first_frame": {}}]},
        {"all_of": [{"spatial_window": {"rows": 1, **window}}, {"causal_frames": {}}]},
        {"any_of": [{"spatial_window": window or None}, {"text": {}}]},
    ]


@pytest.mark.parametrize(
    "mask, widest",
    list(zip(_combinations({}), _combinations({"frames": 6}))),
    ids=["or_first_frame", "and_causal", "or_text"],
)
def test_spatial_window_without_frames_equals_the_widest_window_in_combinations(mask, widest):
    """In combinations too, omitting `frames` keeps exactly what frames: F - 1 keeps, and
    the whole analysis classifies it exactly (text first, 7 frames)."""
    lay = TokenLayout(7, 6, 10, 40, "first")
    spec, node = lower_mask_dict(mask, lay, 128, 128)
    keep = dense_keep(node, lay)
    np.testing.assert_array_equal(keep, dense_keep(lower_mask_dict(widest, lay, 128, 128)[1], lay))
    plan = analyze(spec)
    assert plan.classification.density_is_exact
    expected = brute_force_kinds(keep, 128, 128)
    _check(plan.kinds, plan.classification.kept_pairs, keep, expected, exact=True)


BLOCK_CAUSAL_MASKS = [
    {"block_causal": {"frames": 2}},
    {"any_of": [{"block_causal": {"frames": 3}}, {"text": {}}]},
    {"any_of": [{"block_causal": {"frames": 2}}, {"first_frame": {"frames": 1}}]},
    {"all_of": [{"block_causal": {"frames": 2}}, {"spatial_window": {"frames": 2, "rows": 1}}]},
]


@pytest.mark.parametrize("mask", BLOCK_CAUSAL_MASKS, ids=range(len(BLOCK_CAUSAL_MASKS)))
@pytest.mark.parametrize("text_position", ["first", "last"])
@pytest.mark.parametrize("order", ["frame_major", "temporal_major"])
def test_block_causal_against_brute_force(mask, text_position, order):
    """Chunks of 2 or 3 frames over 7 frames (the last chunk short), text before or after
    the video, both orders (temporal_major with the anchor frames first_frame asks for)."""
    lay = TokenLayout(7, 3, 5, 11, text_position, order)
    _, node = lower_mask_dict(mask, lay, 128, 128)
    if order == "temporal_major":
        lay = TokenLayout(7, 3, 5, 11, text_position, order, node.anchor_frames())
    keep = dense_keep(node, lay)
    for bq, bkv in ((8, 8), (16, 24), (32, 16)):
        got = classify_tiles(node, lay, TileGrid(lay.seq_len, bq, bkv))
        assert got.density_is_exact
        _check(got.kinds, got.kept_pairs, keep, brute_force_kinds(keep, bq, bkv), exact=True)


def test_block_causal_keeps_whole_chunks_and_no_text():
    """keep(q, k) from the documented rule, on the user's coordinates."""
    lay = TokenLayout(5, 1, 2, 3, "last")
    keep = dense_keep(ir.BlockCausal(2), lay)
    frame = np.repeat(np.arange(5), 2)  # video tokens in frame-major order, then text
    expected = (frame[None, :] // 2) <= (frame[:, None] // 2)
    np.testing.assert_array_equal(keep[:10, :10], expected)
    assert not keep[10:].any() and not keep[:, 10:].any()
    np.testing.assert_array_equal(
        dense_keep(ir.BlockCausal(1), lay), dense_keep(ir.CausalFrames(), lay)
    )


@pytest.mark.parametrize("bq,bkv", [(8, 8), (16, 8), (8, 24)])
def test_predicates_that_interval_arithmetic_can_decide_are_exact(bq, bkv):
    """A monotone user predicate classifies exactly like its built-in twin."""
    lay = TokenLayout(5, 3, 7, 0, "last")
    grid = TileGrid(lay.seq_len, bq, bkv)
    builtin = ir.SpatialWindow(1, None, None)
    user = ir.Predicate("abs(f_q - f_k) <= 1", parse_predicate("abs(f_q - f_k) <= 1"))
    a, b = classify_tiles(builtin, lay, grid), classify_tiles(user, lay, grid)
    np.testing.assert_array_equal(a.kinds, b.kinds)
    assert b.unproven_tiles == 0 and b.kept_pairs == a.kept_pairs and b.density_is_exact


def test_unprovable_tiles_are_counted():
    lay = TokenLayout(4, 4, 8, 0, "last")
    grid = TileGrid(lay.seq_len, 16, 16)
    # (h_q + h_k) % 2 == 0 holds on exactly half of each tile: boundary everywhere, honestly.
    p = ir.Predicate("x", parse_predicate("(w_q + w_k) % 2 == 0"))
    got = classify_tiles(p, lay, grid)
    assert np.all(got.kinds == TileKind.BOUNDARY)
    keep = dense_keep(p, lay)
    assert got.kept_pairs == keep.sum() and got.density_is_exact


def test_blog_configuration_counts():
    """Wan 720p band(0.35) + prefix 3600: kept fraction 0.3887 as published."""
    lay = TokenLayout(21, 45, 80, 0, "last")
    mask = ir.AnyOf((ir.Band(ir.band_width_from_density(0.35, lay.video_tokens)), ir.Prefix(3600)))
    assert ir.band_width_from_density(0.35, lay.video_tokens) == 14720
    got = classify_tiles(mask, lay, TileGrid(lay.seq_len, 512, 512))
    assert round(got.kept_pairs / lay.seq_len**2, 4) == 0.3887


def test_over_budget_predicates_stay_sound(monkeypatch):
    """Past the evaluation budget, tiles stay BOUNDARY, counts become bounds, and it says so
    (a predicate whose first part reads i_q and i_k: no per-axis product form)."""
    from svgen.analysis import classify

    monkeypatch.setattr(classify, "MAX_UNDECIDED_PAIRS", 0)
    lay = TokenLayout(4, 4, 8, 0, "last")
    p = ir.Predicate("x", parse_predicate("abs(i_q - i_k) + abs(h_q - h_k) <= 9 and f_q == f_k"))
    got = classify_tiles(p, lay, TileGrid(lay.seq_len, 16, 16))
    keep = dense_keep(p, lay)
    expected = brute_force_kinds(keep, 16, 16)
    _check(got.kinds, int(keep.sum()), keep, expected, exact=False)
    assert not got.density_is_exact
    assert got.kept_pairs <= keep.sum() <= got.kept_pairs_upper
    assert got.unproven_tiles > 0


@pytest.mark.parametrize(
    "name,frames,mask",
    [
        ("spatial_400k", 111, ir.AnyOf((ir.FirstFrame(1), ir.SpatialWindow(1, None, None)))),
        ("band_400k", 111, ir.AnyOf((ir.Band(78080), ir.Prefix(3600)))),
        ("temporal_75k", 21, ir.AnyOf((ir.FirstFrame(1), ir.TemporalStride(0, 0, 1, None)))),
        ("window3d_75k", 21, ir.SpatialWindow(2, 6, 9)),
        ("block_causal_75k", 21, ir.AnyOf((ir.FirstFrame(1), ir.BlockCausal(4)))),
    ],
)
def test_large_geometry_agrees_with_brute_force_on_sampled_tiles(name, frames, mask):
    """Full-size classification, checked exactly on sampled tiles (no N x N mask anywhere)."""
    lay = TokenLayout(frames, 45, 80, 0, "last")
    block = 512
    kinds = classify_tiles(mask, lay, TileGrid(lay.seq_len, block, block)).kinds
    rng = np.random.default_rng(len(name))
    visited = np.argwhere(kinds != TileKind.EMPTY)
    samples = np.concatenate(
        [
            np.stack([rng.integers(0, kinds.shape[0], 60), rng.integers(0, kinds.shape[1], 60)], 1),
            visited[rng.integers(0, len(visited), 60)],
        ]
    )
    for i, j in samples:
        q = lay.coordinates(np.arange(i * block, min((i + 1) * block, lay.seq_len)))
        k = lay.coordinates(np.arange(j * block, min((j + 1) * block, lay.seq_len)))
        tile = mask.evaluate(q.reshape(-1, 1), k.reshape(1, -1))
        expected = (
            TileKind.FULL if tile.all() else TileKind.BOUNDARY if tile.any() else TileKind.EMPTY
        )
        assert kinds[i, j] == expected, (i, j)


def _random_frame_invariant(rng, lay, depth=0):
    r = rng.random()
    if depth >= 2 or r < 0.4:
        return rng.choice(
            [
                lambda: ir.FirstFrame(int(rng.integers(1, lay.frames + 1))),
                lambda: ir.Prefix(int(rng.integers(1, lay.seq_len))),
                lambda: ir.TemporalStride(
                    int(rng.integers(0, 3)), int(rng.integers(0, 4)), 1, None
                ),
            ]
        )()
    if r < 0.7:
        return ir.AnyOf(tuple(_random_frame_invariant(rng, lay, depth + 1) for _ in range(2)))
    if r < 0.9:
        return ir.AllOf(tuple(_random_frame_invariant(rng, lay, depth + 1) for _ in range(2)))
    return ir.Not(_random_frame_invariant(rng, lay, depth + 1))


@pytest.mark.parametrize("seed", range(60))
def test_frame_invariant_fast_path_matches_brute_force(seed):

    rng = np.random.default_rng(9000 + seed)
    lay = TokenLayout(
        int(rng.integers(2, 7)), int(rng.integers(1, 5)), int(rng.integers(2, 9)), 0, "last"
    )
    bq, bkv = int(rng.choice([8, 16, 40, 64])), int(rng.choice([8, 16, 24]))
    mask = ir.simplify(_random_frame_invariant(rng, lay))
    assert mask.frame_invariant()
    got = classify_tiles(mask, lay, TileGrid(lay.seq_len, bq, bkv))
    keep = dense_keep(mask, lay)
    _check(got.kinds, got.kept_pairs, keep, brute_force_kinds(keep, bq, bkv), exact=True)


@pytest.mark.parametrize("seed", range(160))
def test_per_axis_predicates_are_exact_without_evaluating_pairs(seed, monkeypatch):
    """A user predicate whose parts each read one axis, or rows and columns together (outside
    tiled layouts), or the token classes, is classified by the per-axis product sums: exact kinds, kept pairs, BOUNDARY block counts and rows
    with keys, in all three token orders, with no pair evaluated (the budget is 0)."""
    from svgen.analysis import classify

    monkeypatch.setattr(classify, "MAX_UNDECIDED_PAIRS", 0)
    rng = np.random.default_rng(7000 + seed)
    lay = random_any_layout(rng)
    # Rows and columns read together need each box's places in one range: not in cubes.
    source = random_axis_predicate(rng, places=not lay.is_tiled)
    mask = ir.Predicate(source, parse_predicate(source))
    assert axis_terms.applies(mask, lay), source
    bq, bkv = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16, 24]))
    got = classify_tiles(mask, lay, TileGrid(lay.seq_len, bq, bkv), count_pairs=True)
    keep = dense_keep(mask, lay)
    assert got.density_is_exact and got.unproven_tiles == 0, source
    _check(got.kinds, got.kept_pairs, keep, brute_force_kinds(keep, bq, bkv), exact=True)
    nk = -(-lay.seq_len // bkv)
    for flat, pairs in zip(got.pairs.boundary_index, got.pairs.boundary_pairs):
        i, j = divmod(int(flat), nk)
        assert keep[i * bq : (i + 1) * bq, j * bkv : (j + 1) * bkv].sum() == pairs
    has = keep.any(axis=1)
    none_last = ~keep[:, (nk - 1) * bkv :].any(axis=1)
    nq = -(-lay.seq_len // bq)
    rows = np.arange(lay.seq_len)
    np.testing.assert_array_equal(
        got.pairs.rows_with_keys, np.bincount(rows[has] // bq, minlength=nq)
    )
    np.testing.assert_array_equal(
        got.pairs.rows_without_last, np.bincount(rows[has & none_last] // bq, minlength=nq)
    )


def test_disjoint_bands_of_a_per_axis_union_stay_few_terms():
    """A union of conjunctions on disjoint frame-distance bands (a radial-style mask) keeps
    one term per band, not 2^n - 1: the pruned products keep no pair."""
    bands = [(0, 0, 40), (1, 1, 20), (2, 3, 10), (4, 7, 5), (8, 15, 2), (16, 31, 1), (32, 63, 0)]
    source = " or ".join(
        f"({lo} <= abs(f_q - f_k) <= {hi} and abs(h_q - h_k) <= {r} and abs(w_q - w_k) <= {r})"
        for lo, hi, r in bands
    )
    mask = ir.Predicate(source, parse_predicate(source))
    lay = TokenLayout(64, 6, 9)
    poly = axis_terms.polynomial(mask, (lay.frames, lay.height, lay.width))
    assert poly is not None and len(poly) == len(bands)
    assert axis_terms.polynomial(mask) is None  # without the sizes: 127 terms, over MAX_TERMS
    small = TokenLayout(9, 3, 4, 5, "first")
    got = classify_tiles(mask, small, TileGrid(small.seq_len, 16, 16))
    keep = dense_keep(mask, small)
    _check(got.kinds, got.kept_pairs, keep, brute_force_kinds(keep, 16, 16), exact=True)


def test_place_relations_of_the_difference_need_no_table():
    """A place relation of width * (h_q - h_k) + w_q - w_k only is counted from its
    differences (no [places, places] table): the same counts as the table on every
    rectangle; one of rows and columns apart is not such a relation."""
    width, height = 7, 5
    n = width * height
    cases = [
        "abs(7 * (h_q - h_k) + w_q - w_k) <= 9",
        "(7 * h_q + w_q - 7 * h_k - w_k) % 4 == 1 or 7 * (h_q - h_k) + w_q - w_k > 20",
    ]
    rng = np.random.default_rng(3)
    for source in cases:
        expr = parse_predicate(source)
        constraints = frozenset({("expr", expr)})
        differences = axis_relations.place_differences(
            frozenset(), frozenset(), constraints, height, width
        )
        assert differences is not None, source
        table = axis_relations.place_prefix(frozenset(), frozenset(), constraints, height, width)
        for _ in range(200):
            a, b = np.sort(rng.integers(0, n, 2))
            c, d = np.sort(rng.integers(0, n, 2))
            assert differences.count(a, b, c, d) == axis_relations.rect_pairs(
                table, n, a, b, c, d
            ), source
        assert differences.total == int(table[-1])
    apart = frozenset({("expr", parse_predicate("abs(h_q - h_k) + abs(w_q - w_k) <= 2"))})
    assert axis_relations.place_differences(frozenset(), frozenset(), apart, height, width) is None
