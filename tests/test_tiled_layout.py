"""The tiled (cube-major) layout end to end: the order against its definition, permutations,
kernel-side coordinates, exact classification, the spec syntax, and a compiled kernel."""

import itertools

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

from svgen import ir
from svgen.analysis import analyze, bounds, classify
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.spec.errors import SpecError
from svgen.spec.expr import parse_predicate
from svgen.runtime import coords
from svgen.core.kinds import TileKind
from svgen.core.layout import Tiled, TokenLayout
from svgen.spec.schema import spec_schema
from svgen.spec import canonical_json, parse_spec

from helpers import random_tiled_layout, brute_force_kinds, dense_keep, lower_mask_dict, random_mask
from kernel_helpers import POISONED, check_grads, check_per_head, mixed_inputs
from tpu_helpers import CUBE_DMA_SPEC, compile_for_v6e, data_movement, mosaic_kernels


def tiled(frames, height, width, cube, text=0, position="last") -> TokenLayout:
    return TokenLayout(frames, height, width, text, position).with_order(Tiled(*cube))


def reference_order(lay: TokenLayout) -> np.ndarray:
    """The user's video indices in tiled order, walking the cubes as the definition says
    (cubes in (frame group, row group, col group) order, (f, h, w) inside; edge cubes cut)."""
    (a, b, c), big_f, big_h, big_w = lay.cube, lay.frames, lay.height, lay.width
    order = []
    for gf, gh, gw in itertools.product(
        range(-(-big_f // a)), range(-(-big_h // b)), range(-(-big_w // c))
    ):
        for f, h, w in itertools.product(
            range(gf * a, min(big_f, gf * a + a)),
            range(gh * b, min(big_h, gh * b + b)),
            range(gw * c, min(big_w, gw * c + c)),
        ):
            order.append((f * big_h + h) * big_w + w)
    return np.array(order, np.int64)


def reference_original_index(lay: TokenLayout) -> np.ndarray:
    """original_index of every kernel position: text keeps its place."""
    out = np.arange(lay.seq_len)
    out[lay.video_start : lay.video_start + lay.video_tokens] = lay.video_start + reference_order(
        lay
    )
    return out


LAYOUTS = [
    tiled(4, 4, 6, (2, 2, 3)),  # cubes divide the geometry
    tiled(4, 4, 6, (2, 2, 3), 5, "first"),
    tiled(4, 8, 8, (2, 4, 4), 3, "last"),
    tiled(5, 3, 7, (2, 2, 3), 4, "last"),  # partial cubes on every axis
    tiled(5, 3, 7, (3, 3, 4), 6, "first"),
    tiled(7, 1, 5, (3, 1, 2)),
    tiled(1, 6, 9, (1, 4, 2), 3, "last"),
    tiled(3, 5, 4, (1, 2, 4)),  # frame-major in disguise: whole rows, one frame per cube
    tiled(2, 3, 4, (2, 3, 4), 2, "first"),  # one cube: frame-major too
]


def _ids(lay: TokenLayout) -> str:
    text = f"+{lay.text_tokens}{lay.text_position}" if lay.text_tokens else ""
    return f"{lay.frames}x{lay.height}x{lay.width}{text}/cube{'x'.join(map(str, lay.cube))}"


# -- the order -----------------------------------------------------------------------------


@pytest.mark.parametrize("lay", LAYOUTS, ids=_ids)
def test_order_is_the_documented_one(lay):
    original = lay.original_index(np.arange(lay.seq_len))
    np.testing.assert_array_equal(original, reference_original_index(lay))
    np.testing.assert_array_equal(lay.kernel_position[original], np.arange(lay.seq_len))
    # The closed-form offset of the docstring inverts the decoding.
    video = reference_order(lay)
    s = lay.tokens_per_frame
    offset = lay.tiled_offset(video // s, video % s // lay.width, video % lay.width)
    np.testing.assert_array_equal(offset, np.arange(lay.video_tokens))
    assert lay.is_identity == bool(np.all(original == np.arange(lay.seq_len)))


def test_every_small_cube_against_the_definition():
    """Every cube of three small geometries, text first: the order and is_identity."""
    for big_f, big_h, big_w in ((3, 4, 5), (4, 2, 6), (2, 5, 3)):
        for cube in itertools.product(
            range(1, big_f + 1), range(1, big_h + 1), range(1, big_w + 1)
        ):
            lay = tiled(big_f, big_h, big_w, cube, 2, "first")
            original = lay.original_index(np.arange(lay.seq_len))
            np.testing.assert_array_equal(original, reference_original_index(lay), str(cube))
            assert lay.is_identity == bool(np.all(original == np.arange(lay.seq_len))), cube


@pytest.mark.parametrize("lay", LAYOUTS, ids=_ids)
def test_permutations_round_trip_in_numpy_and_jax(lay):
    """Reshape + transpose when the cubes divide the geometry, a gather otherwise; both
    agree with the reference order, on the host and jitted."""
    x = np.random.default_rng(0).standard_normal((2, 3, lay.seq_len, 4)).astype(np.float32)
    expected = x[..., reference_original_index(lay), :]
    np.testing.assert_array_equal(lay.to_kernel(x), expected)
    np.testing.assert_array_equal(lay.from_kernel(expected), x)
    y = jax.jit(lambda a: lay.to_kernel(a, jnp))(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(y), expected)
    back = jax.jit(lambda a: lay.from_kernel(a, jnp))(y)
    np.testing.assert_array_equal(np.asarray(back), x)


def test_positive_cube_sizes_are_required():
    with pytest.raises(ValueError, match="positive cube sizes"):
        TokenLayout(2, 2, 2, order="tiled")


# -- coordinates -----------------------------------------------------------------------------


@pytest.mark.parametrize("lay", LAYOUTS, ids=_ids)
def test_coordinates_host_and_kernel(lay):
    """Host coordinates are the user token's; the kernel's TokenCoords and QueryCoords
    (jitted, lax.div / lax.rem only) decode the same; the nominal index is the position."""
    pos = np.arange(lay.seq_len)
    c = lay.coordinates(pos)
    original = reference_original_index(lay)
    video = original - lay.video_start
    is_text = (video < 0) | (video >= lay.video_tokens)
    s, width = lay.tokens_per_frame, lay.width
    expected = {
        "frame": np.where(is_text, 0, video // s),
        "row": np.where(is_text, 0, video % s // width),
        "col": np.where(is_text, 0, video % width),
        "place": np.where(is_text, 0, video % s),
        "index": pos,  # the nominal order of a tiled layout is the kernel order
        "is_text": is_text,
    }
    for name in ("frame", "row", "col", "index", "is_text"):
        np.testing.assert_array_equal(getattr(c, name), expected[name], name)

    def decode(p):
        t = coords.TokenCoords(p, lay)
        q = coords.QueryCoords(p[None, :], lay)
        return {n: (getattr(t, n), getattr(q, n)[:, 0]) for n in expected}

    p = jnp.asarray(pos, jnp.int32)
    # jnp's // and % lower through `sign`, which fails for TPU from a CPU host.
    assert "sign" not in str(jax.make_jaxpr(decode)(p))
    for name, (column, rows) in jax.jit(decode)(p).items():
        np.testing.assert_array_equal(np.asarray(column), expected[name], name)
        np.testing.assert_array_equal(np.asarray(rows), expected[name], name)


# -- analysis --------------------------------------------------------------------------------


@pytest.mark.parametrize("lay", LAYOUTS, ids=_ids)
def test_tile_boxes_are_exact(lay):
    """Each box of a kernel range is exactly its tokens (a product of coordinate ranges),
    and its nominal range is exact (a run of the cube order)."""
    rng = np.random.default_rng(lay.seq_len)
    c = lay.coordinates(np.arange(lay.seq_len))
    for _ in range(20):
        start = int(rng.integers(0, lay.seq_len))
        end = int(rng.integers(start + 1, lay.seq_len + 1))
        covered = []
        for f0, f1, h0, h1, w0, w1, i0, i1, t0, _ in bounds._range_boxes(lay, start, end):
            run = np.arange(i0, i1 + 1)
            covered.append(run)
            if t0:
                assert c.is_text[run].all()
                continue
            tokens = set(zip(c.frame[run], c.row[run], c.col[run]))
            box = itertools.product(range(f0, f1 + 1), range(h0, h1 + 1), range(w0, w1 + 1))
            assert tokens == set(box) and len(tokens) == run.size
        np.testing.assert_array_equal(np.sort(np.concatenate(covered)), np.arange(start, end))


@pytest.mark.parametrize("seed", range(150))
def test_random_masks_against_brute_force(seed):
    """Kinds, kept pairs and (with count_pairs) each BOUNDARY block's pairs and the rows
    with keys equal brute force, through both the product path and the row sets."""
    rng = np.random.default_rng(50_000 + seed)
    lay = random_tiled_layout(rng)
    bq, bkv = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16, 24]))
    _, mask = lower_mask_dict(random_mask(rng, lay), lay, 128, 128)
    keep = dense_keep(mask, lay)
    got = classify_tiles(mask, lay, TileGrid(lay.seq_len, bq, bkv), count_pairs=True)
    assert got.density_is_exact and got.kept_pairs == int(keep.sum())
    np.testing.assert_array_equal(got.kinds, brute_force_kinds(keep, bq, bkv))
    nk = -(-lay.seq_len // bkv)
    for flat, pairs in zip(got.pairs.boundary_index, got.pairs.boundary_pairs):
        i, j = divmod(int(flat), nk)
        assert keep[i * bq : (i + 1) * bq, j * bkv : (j + 1) * bkv].sum() == pairs
    rows = np.flatnonzero(keep.any(axis=1))
    np.testing.assert_array_equal(
        got.pairs.rows_with_keys, np.bincount(rows // bq, minlength=-(-lay.seq_len // bq))
    )


def test_over_budget_predicates_stay_sound(monkeypatch):
    monkeypatch.setattr(classify, "MAX_UNDECIDED_PAIRS", 0)
    lay = tiled(5, 4, 7, (2, 3, 3), 5, "first")
    p = ir.Predicate("x", parse_predicate("abs(w_q - w_k) <= 2 and f_q == f_k or i_k < 9"))
    got = classify_tiles(p, lay, TileGrid(lay.seq_len, 16, 16))
    expected = brute_force_kinds(dense_keep(p, lay), 16, 16)
    assert not got.density_is_exact and got.unproven_tiles > 0
    assert np.all((got.kinds != TileKind.EMPTY) | (expected == TileKind.EMPTY))
    assert np.all((got.kinds != TileKind.FULL) | (expected == TileKind.FULL))
    assert got.kept_pairs <= dense_keep(p, lay).sum() <= got.kept_pairs_upper


def test_cube_window_at_cube_sized_tiles_has_no_boundary_tiles():
    """STA's point: with 128-token cubes (2 x 8 x 8) and 128 x 128 tiles, a window of whole
    cubes is whole tiles; frame-major order cuts every cube across tiles."""
    geometry = TokenLayout(4, 16, 24)
    window = ir.CubeWindow(2, 8, 8, 1, 1, 1)
    grid = TileGrid(geometry.seq_len, 128, 128)
    cubes = geometry.with_order(Tiled(2, 8, 8))
    got = classify_tiles(window, cubes, grid)
    keep = dense_keep(window, cubes)
    np.testing.assert_array_equal(got.kinds, brute_force_kinds(keep, 128, 128))
    assert not np.any(got.kinds == TileKind.BOUNDARY)
    assert np.count_nonzero(got.kinds) / got.kinds.size == pytest.approx(keep.mean())
    frame_major = classify_tiles(window, geometry, grid)
    assert frame_major.kept_pairs == got.kept_pairs
    assert np.count_nonzero(frame_major.kinds == TileKind.BOUNDARY) > 0


# -- spec ------------------------------------------------------------------------------------

SPEC = """\
svgen: 1
name: sta
geometry: {frames: 5, height: 6, width: 20, text_tokens: 20}
attention: {heads: 2, head_dim: 128, dtype: float32}
layout: {tiled: {frames: 2, rows: 4, cols: 8}}
patterns:
  cubes: {any_of: [{cube_window: {cube_frames: 2, cube_rows: 4, cube_cols: 8, frames: 0, rows: 1, cols: 1}}, {text: {}}]}
  spatial: {spatial_window: {frames: 1, rows: 2}}
heads:
  candidates: [{pattern: cubes}, {pattern: spatial, layout: frame_major}]
  assign: [cubes, spatial]
tiling: {block_q: 128, block_kv: 128}
"""


def test_spec_layouts_and_identity():
    spec = parse_spec(SPEC)
    cubes, spatial = spec.heads.candidates
    assert spec.layout == cubes.layout == Tiled(2, 4, 8) and spatial.layout == "frame_major"
    assert '"layout":{"tiled":{"cols":8,"frames":2,"rows":4}}' in canonical_json(spec)
    other = parse_spec(SPEC.replace("rows: 4, cols: 8}}", "rows: 2, cols: 8}}"))
    assert other.digest != spec.digest  # the cube is part of the spec's identity
    in_candidate = parse_spec(
        SPEC.replace("layout: {tiled: {frames: 2, rows: 4, cols: 8}}\n", "").replace(
            "{pattern: cubes}", "{pattern: cubes, layout: {tiled: {frames: 2, rows: 4, cols: 8}}}"
        )
    )
    assert in_candidate.heads.candidates[0].layout == Tiled(2, 4, 8)
    jsonschema.Draft202012Validator(spec_schema()).validate(
        {"svgen": 1, "name": "s", "geometry": {"frames": 1, "height": 1, "width": 1},
         "attention": {"heads": 1, "head_dim": 128, "dtype": "float32"},
         "layout": {"tiled": {"frames": 1, "rows": 1, "cols": 1}}, "mask": {"text": {}}}
    )  # fmt: skip


BAD_CUBES = [
    ("{frames: 0, rows: 4, cols: 8}", "5:26: layout.tiled.frames: must be a positive integer, got 0"),
    ("{frames: 6, rows: 4, cols: 8}", "5:26: layout.tiled.frames: must be at most 5 (geometry.frames: a cube fits in the video), got 6"),
    ("{frames: 2, rows: 7, cols: 8}", "5:35: layout.tiled.rows: must be at most 6 (geometry.height: a cube fits in the video), got 7"),
    ("{frames: 2, rows: 4, cols: 21}", "5:44: layout.tiled.cols: must be at most 20 (geometry.width: a cube fits in the video), got 21"),
    ("{frames: 2, rows: 4, cols: two}", "5:44: layout.tiled.cols: must be a positive integer, got a string ('two')"),
    ("{frames: 2, rows: 4, cols: 8, depth: 1}", "5:47: layout.tiled.depth: unknown key 'depth'; allowed keys: frames, rows, cols"),
    ("{frames: 2, rows: 4}", "5:17: layout.tiled: missing required key 'cols'"),
]  # fmt: skip


@pytest.mark.parametrize("cube,message", BAD_CUBES, ids=[m.split(": ")[1] for _, m in BAD_CUBES])
def test_bad_cubes_are_located(cube, message):
    line = "layout: {tiled: {frames: 2, rows: 4, cols: 8}}"
    with pytest.raises(SpecError) as err:
        parse_spec(SPEC.replace(line, f"layout: {{tiled: {cube}}}"), source="sta.yaml")
    assert str(err.value) == f"sta.yaml:{message}"


@pytest.mark.parametrize(
    "layout,message",
    [
        ("tiled", "5:9: layout: tiled needs its cube: write {tiled: {frames: A, rows: B, cols: C}}"),
        ("{tiled: 3}", "5:17: layout.tiled: must be a mapping {frames: A, rows: B, cols: C}, got an integer (3)"),
        ("{tile: {}}", "5:10: layout.tile: unknown key 'tile'; allowed keys: tiled, order, curve, over"),
        ("{}", "5:9: layout: give one of {tiled: {frames: A, rows: B, cols: C}}, {order: [f, h, w]} (the axes in any order) and {curve: hilbert}, got an empty mapping"),
    ],
)  # fmt: skip
def test_bad_layouts_are_located(layout, message):
    text = SPEC.replace("layout: {tiled: {frames: 2, rows: 4, cols: 8}}", f"layout: {layout}")
    with pytest.raises(SpecError) as err:
        parse_spec(text, source="sta.yaml")
    assert str(err.value) == f"sta.yaml:{message}"


def test_candidate_cube_is_checked_against_the_geometry():
    text = SPEC.replace(
        "{pattern: spatial, layout: frame_major}",
        "{pattern: spatial, layout: {tiled: {frames: 1, rows: 9, cols: 1}}}",
    )
    with pytest.raises(SpecError, match=r"heads\.candidates\[1\]\.layout\.tiled\.rows: must be"):
        parse_spec(text)


# -- a compiled kernel -----------------------------------------------------------------------


def test_compiled_kernel_matches_the_reference(compile_text):
    """Partial cubes on every axis (5 x 6 x 20 in 2 x 4 x 8 cubes) and text last: the module
    builds its tiled layout, gathers q, k, v into cube order and the output back, decodes
    coordinates in the kernel, and matches float64 attention (NaN-poisoned interpret mode),
    beside a frame-major head."""
    plan, module = compile_text(SPEC)
    assert [p.layout.cube for p in plan.patterns] == [(2, 4, 8), (0, 0, 0)]
    assert all(plan.patterns[0].tile_counts().values())  # FULL, BOUNDARY and EMPTY tiles
    assert module.CUBES_LAYOUT == plan.patterns[0].layout
    q, k, v = mixed_inputs(plan, "float32", seed=5, heads=2)
    head_pattern = np.array([0, 1])
    out = module.attention(q, k, v, head_pattern=head_pattern, interpret=POISONED)
    check_per_head(plan, out, q, k, v, head_pattern, "float32")
    # The kernel's tiled decoding (constant divisors and selects) lowers through Mosaic.
    assert "tpu_custom_call" in compile_for_v6e(module).as_text()


def test_gradients_through_the_tiled_permutation(compile_text):
    """jax.grad through the gathers into and out of cube order and the backward kernels'
    tiled decoding, against float64."""
    plan, module = compile_text(SPEC)
    q, k, v = mixed_inputs(plan, "float32", seed=6, heads=2)
    check_grads(plan, module, q, k, v, np.array([0, 1]), "float32")


def test_whole_analysis_of_a_tiled_spec_at_cube_sized_tiles():
    """Through the spec reader and analyze(): visited fraction equals density."""
    text = SPEC.replace("height: 6, width: 20, text_tokens: 20", "height: 16, width: 24")
    text = text.replace("frames: 5,", "frames: 4,").replace("rows: 4, cols: 8", "rows: 8, cols: 8")
    text = text.replace("cube_rows: 4", "cube_rows: 8")
    plan = analyze(parse_spec(text))
    cubes = plan.patterns[0]
    assert cubes.tile_counts()["boundary"] == 0
    assert cubes.visited_fraction == pytest.approx(cubes.density)


def test_gpu_module_of_a_tiled_spec_matches_the_reference(compile_text):
    """The same two-head spec compiled for a GPU (svgen compile --target h100): the Triton
    kernel decodes tiled coordinates (partial cubes, text last) in interpret mode, 32 x 32
    GPU tiles each of its own exact kind."""
    plan, module = compile_text(SPEC + "gpu: {block_q: 32, block_kv: 32}\n", target_name="h100")
    assert plan.backend == "gpu" and plan.patterns[0].layout.is_tiled
    q, k, v = mixed_inputs(plan, "float32", seed=7, heads=2)
    head_pattern = np.array([0, 1])
    out = module.attention(q, k, v, head_pattern=head_pattern, interpret=True)
    check_per_head(plan, out, q, k, v, head_pattern, "float32")


# -- cube DMA: tiles read straight from the user's [frames, height, width, d] -----------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cube_dma_forward_needs_no_permutation(dtype, compile_text):
    """Cubes dividing the video, no text, one cube per tile: the kernel reads and writes the
    user's array as boxes. The forward matches float64 (NaN-poisoned interpret mode), and the
    jitted call holds no transpose, gather or concatenation: no HBM pass besides the
    kernel's own."""
    plan, module = compile_text(CUBE_DMA_SPEC.replace("DTYPE", dtype))
    assert module.attention.cube_dma is not None
    assert (plan.patterns[0].kinds == TileKind.BOUNDARY).any()  # the mask runs too
    q, k, v = mixed_inputs(plan, dtype, seed=11, heads=2)
    out = module.attention(q, k, v, interpret=POISONED)
    check_per_head(plan, out, q, k, v, [0, 0], dtype)
    # XLA's program for v6e moves no data around the kernel; the same cubes with a kv tile of
    # two cubes (no cube DMA) permute q, k, v into cube order and the output back.
    hlo = compile_for_v6e(module).as_text()
    assert mosaic_kernels(hlo) == ["svgen_attention"]  # compiled by libtpu
    assert data_movement(hlo) == set()
    _, permuted = compile_text(
        CUBE_DMA_SPEC.replace("DTYPE", dtype).replace("block_kv: 128", "block_kv: 256")
    )
    assert permuted.attention.cube_dma is None
    hlo = compile_for_v6e(permuted).as_text()
    assert mosaic_kernels(hlo) == ["svgen_attention"]
    assert "transpose" in data_movement(hlo)


def test_cube_dma_gradients(compile_text):
    """The backward pass permutes into cube order and back: gradients equal float64."""
    plan, module = compile_text(CUBE_DMA_SPEC.replace("DTYPE", "float32"))
    q, k, v = mixed_inputs(plan, "float32", seed=12, heads=2)
    check_grads(plan, module, q, k, v, np.array([0, 0]), "float32")


@pytest.mark.parametrize(
    "change",
    [
        ("geometry: {frames: 4,", "geometry: {text_tokens: 8, frames: 4,"),  # text tokens
        ("block_kv: 128}", "block_kv: 256}"),  # a kv tile of two cubes
        ("frames: 2, rows: 4, cols: 16}}", "frames: 2, rows: 8, cols: 8}}"),  # still fits
        ("rows: 4, cols: 16}}", "rows: 8, cols: 4}}"),  # 4 columns: under the sublane tile
        ("frames: 2, rows: 4, cols: 16}}", "frames: 1, rows: 8, cols: 16}}"),  # frame-major
    ],
)
def test_cube_dma_only_where_a_tile_is_a_box(change, compile_text):
    text = CUBE_DMA_SPEC.replace("DTYPE", "float32").replace(*change)
    text = text.replace("cube_rows: 4, cube_cols: 16", "cube_rows: 4, cube_cols: 8")
    plan, module = compile_text(text)
    fits = change[1].startswith("frames: 2, rows: 8, cols: 8")
    assert (module.attention.cube_dma is not None) == fits
    q, k, v = mixed_inputs(plan, "float32", seed=13, heads=2)
    check_per_head(plan, module.attention(q, k, v, interpret=POISONED), q, k, v, [0, 0], "float32")
