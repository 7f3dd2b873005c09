"""Curve layouts (`layout: {curve: hilbert}`, svgen.core.curves and svgen.core.layout): each
frame's places along a space-filling curve, frames in order.

The curves are checked by their defining properties (a bijection; on a power-of-two square,
consecutive Hilbert places are neighbours and the walk starts and ends on the first row; a
Morton code is the interleaving of the bits, written here from strings), the layout by its
permutations, the spec by its errors, and the kernels forward and backward against float64
attention in NaN-poisoned interpret mode, with masks written here from the rule (positions
along the curve, frames, text), not from svgen's oracle.
"""

import jax
import numpy as np
import pytest

from svgen.core import curves
from svgen.core.layout import Curve, TokenLayout
from svgen.spec import SpecError, parse_spec

from kernel_helpers import POISONED, check_grads, mixed_inputs
from tpu_helpers import check_heads_on_keep, v5e_gradient_hlo

# -- the curves ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", curves.CURVES)
@pytest.mark.parametrize("height, width", [(1, 1), (1, 7), (6, 1), (5, 8), (45, 80), (16, 16)])
def test_a_curve_visits_every_place_once(kind, height, width):
    places = curves.curve_places(kind, height, width)
    assert sorted(places.tolist()) == list(range(height * width))


@pytest.mark.parametrize("side", [2, 4, 8, 32, 128])
def test_hilbert_steps_to_a_neighbour_on_a_power_of_two_square(side):
    rows, cols = np.divmod(curves.curve_places(curves.HILBERT, side, side), side)
    steps = np.abs(np.diff(rows)) + np.abs(np.diff(cols))
    assert np.all(steps == 1)
    # The walk enters at a corner of the first row and leaves at the other one.
    assert (rows[0], cols[0]) == (0, 0)
    assert (rows[-1], cols[-1]) == (0, side - 1)


def test_hilbert_on_a_ragged_frame_jumps_rarely():
    rows, cols = np.divmod(curves.curve_places(curves.HILBERT, 45, 80), 80)
    steps = np.abs(np.diff(rows)) + np.abs(np.diff(cols))
    assert np.mean(steps == 1) > 0.99


def test_hilbert_blocks_are_patches_not_strips():
    """What the curve is for: a run of 128 places of a 45 x 80 frame spans far fewer rows plus
    columns than a frame-major run (3 rows of 80: 83), but where the curve leaves the frame
    and comes back (on the enclosing 128 x 128 square)."""
    rows, cols = np.divmod(curves.curve_places(curves.HILBERT, 45, 80), 80)
    extents = np.array(
        [
            (np.ptp(rows[i : i + 128]) + 1) + (np.ptp(cols[i : i + 128]) + 1)
            for i in range(0, 3600 - 127, 128)
        ]
    )
    assert np.median(extents) <= 24
    assert np.mean(extents < 3 + 80) > 0.95


def test_morton_interleaves_bits():
    height, width = 6, 11
    places = curves.curve_places(curves.MORTON, height, width)

    def code(place):  # the bits of row and column interleaved, row bits above column bits
        row, col = divmod(int(place), width)
        r, c = f"{row:04b}", f"{col:04b}"
        return int("".join(a + b for a, b in zip(r, c)), 2)

    codes = [code(p) for p in places]
    assert codes == sorted(codes)


def test_an_unknown_curve_is_refused():
    with pytest.raises(ValueError, match="unknown curve"):
        curves.curve_places("peano", 4, 4)
    with pytest.raises(ValueError, match="unknown curve"):
        Curve("peano")


# -- the layout ---------------------------------------------------------------------------


def _layout(kind=curves.HILBERT, text=7, position="first") -> TokenLayout:
    geometry = TokenLayout(frames=3, height=5, width=6, text_tokens=text, text_position=position)
    return geometry.with_order(Curve(kind))


@pytest.mark.parametrize("position", ["first", "last"])
@pytest.mark.parametrize("kind", curves.CURVES)
def test_the_layout_moves_tokens_along_the_curve(kind, position):
    lay = _layout(kind, position=position)
    assert not lay.is_identity and lay.order == "frame_major" and lay.curve == kind
    x = np.arange(lay.seq_len)[:, None] * np.ones((1, 3))
    moved = lay.to_kernel(x)
    assert np.array_equal(lay.from_kernel(moved), x)
    user = moved[:, 0].astype(int)  # the user's token at each kernel position
    video = user - lay.video_start
    is_video = (video >= 0) & (video < lay.video_tokens)
    # Text keeps its place; each frame's places come in curve order.
    assert np.array_equal(user[~is_video], np.flatnonzero(~is_video))
    frames, places = np.divmod(video[is_video], 30)
    assert np.all(np.diff(frames) >= 0)
    curve = curves.curve_places(kind, 5, 6)
    assert np.array_equal(places, np.tile(curve, 3))
    coords = lay.coordinates(np.arange(lay.seq_len))
    assert np.array_equal(coords.frame[is_video], frames)
    assert np.array_equal(coords.row[is_video] * 6 + coords.col[is_video], places)
    assert np.array_equal(coords.index, np.arange(lay.seq_len))  # the nominal order


def test_a_curve_over_one_place_is_the_identity():
    lay = TokenLayout(frames=4, height=1, width=1).with_order(Curve(curves.HILBERT))
    assert lay.is_identity


def test_a_curve_layout_is_frame_major_only():
    with pytest.raises(ValueError, match="frame_major"):
        TokenLayout(frames=2, height=2, width=2, order="temporal_major", curve="hilbert")


# -- the spec -------------------------------------------------------------------------------

SPEC = """\
svgen: 1
name: curve_{name}
geometry: {{frames: 4, height: 8, width: 12, text_tokens: {text}}}
attention: {{heads: 2, head_dim: 128, dtype: {dtype}}}
layout: {layout}
mask: {mask}
tiling: {{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}}
"""


def _spec(
    name="band", mask="{any_of: [{band: {width: 40}}, {first_frame: {frames: 1}}]}", **kw
) -> str:
    values = dict(name=name, text=0, dtype="float32", layout="{curve: hilbert}", mask=mask)
    values.update(kw)
    return SPEC.format(**values)


def test_a_bad_curve_names_its_key(tmp_path):
    with pytest.raises(SpecError, match=r"layout\.curve.*hilbert, morton") as err:
        parse_spec(_spec(layout="{curve: peano}"), source="curve.yaml")
    assert err.value.line == 5
    with pytest.raises(SpecError, match="give one of"):
        parse_spec(_spec(layout="{curve: hilbert, order: [f, h, w]}"), source="curve.yaml")


def test_the_curve_is_part_of_the_spec_digest():
    digests = {
        parse_spec(_spec(layout=layout)).digest
        for layout in ("frame_major", "{curve: hilbert}", "{curve: morton}")
    }
    assert len(digests) == 3


@pytest.mark.parametrize(
    "mask, reads",
    [
        ("{spatial_window: {frames: 1, rows: 2}}", "h_k, h_q"),
        ("{temporal_stride: {}}", "h_k, h_q, w_k, w_q"),
        ("{expr: 'w_q == w_k'}", "w_k, w_q"),
    ],
)
def test_masks_reading_rows_or_columns_are_refused(mask, reads, compile_text):
    with pytest.raises(SpecError, match=f"reads {reads}") as err:
        compile_text(_spec(mask=mask))
    assert err.value.key == "layout"


def test_a_head_candidate_with_a_curve_is_refused_at_its_key(compile_text):
    text = _spec(mask="{band: {width: 40}}").replace(
        "mask: {band: {width: 40}}\n",
        "patterns:\n  near: {band: {width: 40}}\n  rows: {spatial_window: {rows: 1}}\n"
        "heads:\n  candidates:\n    - {pattern: near}\n"
        "    - {pattern: rows, layout: {curve: morton}}\n  assign: [near, rows]\n",
    )
    with pytest.raises(SpecError, match="reads h_k, h_q") as err:
        compile_text(text)
    assert err.value.key == "heads.candidates[1].layout"


def test_gpu_and_kv_cache_are_refused(compile_text, tmp_path):
    from svgen.analysis import analyze

    with pytest.raises(SpecError, match="GPU"):
        analyze(parse_spec(_spec()), target_name="h200")
    cached = _spec().replace("tiling:", "runtime: {kv_cache: {chunk_frames: 2}}\ntiling:")
    with pytest.raises(SpecError, match="needs frame_major layouts.*curve hilbert"):
        parse_spec(cached)


# -- the analysis ---------------------------------------------------------------------------

# Masks a curve layout takes: frames, positions, text, data. Each keeps, at every pair of kernel
# positions, what it keeps in frame_major order: why the analysis may classify them as it does
# frame_major ones.
CURVE_MASKS = [
    {"band": {"width": 37}},
    {"first_frame": {"frames": 1}},
    {"spatial_window": {"frames": 1}},
    {"prefix": {"tokens": 50}},
    {"text": {}},
    {"expr": "abs(f_q - f_k) <= 1 and (i_q + i_k) % 3 != 1"},
    {"any_of": [{"band": {"width": 20}}, {"not": {"spatial_window": {"frames": 2}}}]},
    {"all_of": [{"expr": "is_text_k or i_k % 5 == 0"}, {"first_frame": {"frames": 2}}]},
]


@pytest.mark.parametrize(
    "index, text",
    [(i, text) for i, m in enumerate(CURVE_MASKS) for text in (0, 13) if text or "text" not in m],
)
def test_curve_masks_keep_what_frame_major_keeps_and_classify_exactly(index, text):
    from svgen.analysis.classify import TileGrid, classify_tiles

    from helpers import brute_force_kinds, dense_keep, lower_mask_dict

    geometry = TokenLayout(frames=4, height=6, width=10, text_tokens=text)
    mask_dict = CURVE_MASKS[index]
    _, mask = lower_mask_dict(mask_dict, geometry, 128, 128)
    frame_major = dense_keep(mask, geometry)
    for kind in curves.CURVES:
        lay = geometry.with_order(Curve(kind))
        keep = dense_keep(mask, lay)
        np.testing.assert_array_equal(keep, frame_major)
        for bq, bkv in ((16, 32), (40, 8)):
            got = classify_tiles(mask, lay, TileGrid(lay.seq_len, bq, bkv))
            assert got.kept_pairs == int(keep.sum()) or not got.density_is_exact
            np.testing.assert_array_equal(got.kinds, brute_force_kinds(keep, bq, bkv))


# -- the kernels ----------------------------------------------------------------------------


def _rule_keep(lay: TokenLayout, width: int, anchor_frames: int) -> np.ndarray:
    """keep[q, k] in the user's order, from the rule: |position along the curve| within
    `width`, or a key in the first `anchor_frames` frames (text: by its own position)."""
    pos = lay.kernel_position.astype(np.int64)  # user token -> kernel position
    user = np.arange(lay.seq_len)
    video = user - lay.video_start
    is_video = (video >= 0) & (video < lay.video_tokens)
    frame = np.where(is_video, video // lay.tokens_per_frame, -1)
    band = np.abs(pos[:, None] - pos[None, :]) <= width
    anchor = is_video & (frame < anchor_frames)
    return band | anchor[None, :]


def _check_forward(plan, module, keep, dtype):
    q, k, v = mixed_inputs(plan, dtype, seed=3, heads=2)
    out = jax.jit(lambda q, k, v: module.attention(q, k, v, interpret=POISONED))(q, k, v)
    check_heads_on_keep(out, q, k, v, keep, dtype)
    return q, k, v


@pytest.mark.parametrize("kind", curves.CURVES)
@pytest.mark.parametrize("text", [0, 20])
def test_forward_and_gradients_against_the_rule(kind, text, compile_text):
    plan, module = compile_text(_spec(layout=f"{{curve: {kind}}}", text=text))
    lay = plan.patterns[0].layout
    assert lay.curve == kind
    keep = _rule_keep(lay, 40, 1)
    q, k, v = _check_forward(plan, module, keep, "float32")
    check_grads(plan, module, q, k, v, (0, 0), "float32", keeps=[keep])


def test_bfloat16_forward(compile_text):
    plan, module = compile_text(_spec(dtype="bfloat16"))
    _check_forward(plan, module, _rule_keep(plan.patterns[0].layout, 40, 1), "bfloat16")


def test_the_module_pins_its_curve(compile_text, monkeypatch):
    from svgen.core import tables

    plan, module = compile_text(_spec())
    assert "along a hilbert curve (sha256" in module.__doc__
    lay = plan.patterns[0].layout
    right = lay.curve_digest
    tables.check_curve(lay, sha256=right)
    with pytest.raises(RuntimeError, match="regenerate"):
        tables.check_curve(lay, sha256="0" * 64)


def test_a_block_mask_given_as_data_reads_curve_positions(tmp_path, compile_text):
    """PARO-style data blocks over curve-ordered places: keep = bits[p_q // 32, p_k // 32] at
    kernel positions p, the curve's."""
    geometry = TokenLayout(frames=4, height=8, width=12)
    n = -(-geometry.seq_len // 32)
    bits = np.random.default_rng(11).random((n, n)) < 0.3
    np.fill_diagonal(bits, True)
    np.save(tmp_path / "bits.npy", bits.astype(np.uint8))
    mask = f"{{blocks: {{file: {tmp_path / 'bits.npy'}, block: 32}}}}"
    plan, module = compile_text(_spec(name="data", mask=mask, layout="{curve: morton}"))
    lay = plan.patterns[0].layout
    pos = lay.kernel_position.astype(np.int64)
    keep = bits[pos[:, None] // 32, pos[None, :] // 32]
    q, k, v = _check_forward(plan, module, keep, "float32")
    check_grads(plan, module, q, k, v, (0, 0), "float32", keeps=[keep])


def test_forward_and_backward_compile_for_v5e(compile_text):
    """Mosaic and libtpu accept a curve layout's kernels, both directions (AOT for a v5e on
    this host: only that they compile)."""
    _, module = compile_text(_spec(dtype="bfloat16", text=20))
    hlo = v5e_gradient_hlo(module)
    assert hlo.count("tpu_custom_call") >= 2  # the forward and the dk/dv walk


# -- over the whole video ---------------------------------------------------------------------


@pytest.mark.parametrize("side", [2, 4, 8, 16])
def test_the_video_hilbert_curve_steps_to_a_neighbour_in_a_power_of_two_cube(side):
    order = curves.video_curve_order(curves.HILBERT, side, side, side)
    assert sorted(order.tolist()) == list(range(side**3))
    frames, places = np.divmod(order, side * side)
    rows, cols = np.divmod(places, side)
    steps = np.abs(np.diff(frames)) + np.abs(np.diff(rows)) + np.abs(np.diff(cols))
    assert np.all(steps == 1)


@pytest.mark.parametrize("kind", curves.CURVES)
@pytest.mark.parametrize("sizes", [(1, 1, 1), (3, 5, 6), (21, 45, 80), (2, 1, 9)])
def test_a_video_curve_visits_every_token_once(kind, sizes):
    order = curves.video_curve_order(kind, *sizes)
    assert sorted(order.tolist()) == list(range(int(np.prod(sizes))))


def test_the_video_morton_code_interleaves_three_axes():
    frames, height, width = 3, 5, 6
    order = curves.video_curve_order(curves.MORTON, frames, height, width)

    def code(index):  # frame bits above row bits above column bits, level by level
        f, place = divmod(int(index), height * width)
        h, w = divmod(place, width)
        return int("".join(a + b + c for a, b, c in zip(f"{f:03b}", f"{h:03b}", f"{w:03b}")), 2)

    codes = [code(i) for i in order]
    assert codes == sorted(codes)


def _video_layout(kind=curves.HILBERT, text=7) -> TokenLayout:
    geometry = TokenLayout(frames=3, height=5, width=6, text_tokens=text)
    return geometry.with_order(Curve(kind, curves.VIDEO))


@pytest.mark.parametrize("kind", curves.CURVES)
def test_the_video_layout_moves_tokens_along_the_curve(kind):
    lay = _video_layout(kind)
    assert lay.curve_over_video and not lay.is_identity
    x = np.arange(lay.seq_len)[:, None] * np.ones((1, 2))
    moved = lay.to_kernel(x)
    assert np.array_equal(lay.from_kernel(moved), x)
    user = moved[:, 0].astype(int)
    assert np.array_equal(user[: lay.video_tokens], curves.video_curve_order(kind, 3, 5, 6))
    assert np.array_equal(user[lay.video_tokens :], np.arange(lay.video_tokens, lay.seq_len))
    coords = lay.coordinates(np.arange(lay.video_tokens))
    frames, places = np.divmod(user[: lay.video_tokens], 30)
    assert np.array_equal(coords.frame, frames)
    assert np.array_equal(coords.row * 6 + coords.col, places)


def test_over_is_read_and_checked():
    spec = parse_spec(_spec(layout="{curve: morton, over: video}", mask="{band: {width: 40}}"))
    assert spec.layout == Curve("morton", "video")
    with pytest.raises(SpecError, match=r"layout\.over.*frame, video"):
        parse_spec(_spec(layout="{curve: morton, over: space}"))
    with pytest.raises(SpecError, match=r"layout\.over: goes with curve"):
        parse_spec(_spec(layout="{order: [f, h, w], over: video}"))
    digests = {
        parse_spec(_spec(layout=layout)).digest
        for layout in ("{curve: hilbert}", "{curve: hilbert, over: frame}")
    }
    assert len(digests) == 1  # `over: frame` is the default, written or not


def test_frames_are_refused_over_the_whole_video(compile_text):
    with pytest.raises(SpecError, match="walks the whole video.*reads f_k") as err:
        compile_text(_spec(layout="{curve: hilbert, over: video}"))
    assert err.value.key == "layout"


VIDEO_MASKS = [
    {"band": {"width": 37}},
    {"prefix": {"tokens": 50}},
    {"text": {}},
    {"spatial_window": {}},
    {"expr": "(i_q + i_k) % 3 != 1 or is_text_k"},
    {"any_of": [{"band": {"width": 20}}, {"not": {"prefix": {"tokens": 30}}}]},
]


@pytest.mark.parametrize("index", range(len(VIDEO_MASKS)))
def test_video_curve_masks_keep_what_frame_major_keeps_and_classify_exactly(index):
    from svgen.analysis.classify import TileGrid, classify_tiles

    from helpers import brute_force_kinds, dense_keep, lower_mask_dict

    geometry = TokenLayout(frames=4, height=6, width=10, text_tokens=13)
    _, mask = lower_mask_dict(VIDEO_MASKS[index], geometry, 128, 128)
    frame_major = dense_keep(mask, geometry)
    for kind in curves.CURVES:
        lay = geometry.with_order(Curve(kind, curves.VIDEO))
        keep = dense_keep(mask, lay)
        np.testing.assert_array_equal(keep, frame_major)
        for bq, bkv in ((16, 32), (40, 8)):
            got = classify_tiles(mask, lay, TileGrid(lay.seq_len, bq, bkv))
            np.testing.assert_array_equal(got.kinds, brute_force_kinds(keep, bq, bkv))


@pytest.mark.parametrize("kind", curves.CURVES)
def test_video_curve_forward_and_gradients_against_the_rule(kind, compile_text):
    mask = "{any_of: [{band: {width: 40}}, {text: {}}]}"
    text = _spec(layout=f"{{curve: {kind}, over: video}}", text=20, mask=mask, name="video")
    plan, module = compile_text(text)
    lay = plan.patterns[0].layout
    assert lay.curve_over_video and "the whole video along a" in module.__doc__
    pos = lay.kernel_position.astype(np.int64)
    user = np.arange(lay.seq_len)
    is_text = (user < lay.video_start) | (user >= lay.video_start + lay.video_tokens)
    keep = (np.abs(pos[:, None] - pos[None, :]) <= 40) | is_text[:, None] | is_text[None, :]
    q, k, v = _check_forward(plan, module, keep, "float32")
    check_grads(plan, module, q, k, v, (0, 0), "float32", keeps=[keep])
