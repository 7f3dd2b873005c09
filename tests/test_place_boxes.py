"""Place boxes: temporal-major tiles of whole places x every frame read and written as boxes of
the user's [frames, places, d] array (svgen.runtime.cube), so that a call in the user's order
moves no token. Every kernel against float64 on fresh random inputs, outputs NaN-poisoned."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svgen.runtime.cube import PlaceBoxes, tile_positions
from svgen.core.kinds import TileKind

from kernel_helpers import POISONED, check_grads, check_per_head, mixed_inputs
from spec_corpus import TILES, spec_text
from tpu_helpers import (
    compile_for_v6e,
    data_movement,
    mosaic_kernels,
    tpu_device,
    v5e_gradient_hlo,
)

SPEC = """\
svgen: 1
name: place_boxes
geometry: {frames: FRAMES, height: HEIGHT, width: WIDTH}
attention: {heads: 2, head_dim: 128, dtype: DTYPE}
layout: {order: [h, w, f]}
mask: MASK
tiling: TILING
"""

# A temporal head with a window of rows and columns, and a band in the kernel's own order:
# frames, rows, columns and positions all decoded from each row's position.
WINDOWED = "{any_of: [{temporal_stride: {rows: 1, cols: 1}}, {band: {width: 40}}]}"
# Dense enough near the diagonal to have FULL tiles (which run with no mask at all).
WIDE_BAND = "{any_of: [{temporal_stride: {rows: 0, cols: 1}}, {band: {width: 500}}]}"


def spec(frames=3, height=16, width=36, mask=WINDOWED, tiling=None, dtype="float32") -> str:
    tiling = tiling or "{block_q: 384, block_kv: 384}"
    return (
        SPEC.replace("FRAMES", str(frames))
        .replace("HEIGHT", str(height))
        .replace("WIDTH", str(width))
        .replace("MASK", mask)
        .replace("TILING", tiling)
        .replace("DTYPE", dtype)
    )


CASES = {
    # 576 places in boxes of 128: the last box reaches past them (padding rows in the box).
    "partial last box": dict(mask=WIDE_BAND),
    "boxes fill the places": dict(height=16, width=32),
    "four frames, 32 places a tile": dict(
        frames=4, height=8, width=20, tiling="{block_q: 128, block_kv: 128}"
    ),
    # q boxes of 32 places, kv boxes of 64: only the kv side's last box holds padding.
    "q and kv boxes differ": dict(
        frames=4, height=8, width=20, tiling="{block_q: 128, block_kv: 256}"
    ),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", list(CASES))
def test_forward_reads_boxes_and_matches_float64(case, dtype, compile_text):
    plan, module = compile_text(spec(dtype=dtype, **CASES[case]))
    boxes = module.attention.cube_dma
    lay, shape = plan.layout, module.attention.shape
    assert boxes == PlaceBoxes(
        lay.frames,
        lay.tokens_per_frame,
        shape.block_q // lay.frames,
        shape.block_kv // lay.frames,
    )
    q, k, v = mixed_inputs(plan, dtype, seed=21, heads=2)
    out = module.attention(q, k, v, interpret=POISONED)
    check_per_head(plan, out, q, k, v, [0, 0], dtype)


def test_the_wide_band_has_tiles_of_every_kind(compile_text):
    """The partial-box case runs FULL tiles (no mask), BOUNDARY ones and skips EMPTY ones."""
    plan, _ = compile_text(spec(mask=WIDE_BAND))
    kinds = set(np.unique(plan.patterns[0].kinds).tolist())
    assert kinds == {TileKind.EMPTY, TileKind.BOUNDARY, TileKind.FULL}


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_from_box_reads(case, compile_text):
    """The backward kernels read boxes too (D in the q boxes' order, dq accumulated in a
    boxed HBM buffer): gradients equal float64."""
    plan, module = compile_text(spec(**CASES[case]))
    assert isinstance(module.attention.cube_dma, PlaceBoxes)
    q, k, v = mixed_inputs(plan, "float32", seed=22, heads=2)
    check_grads(plan, module, q, k, v, np.array([0, 0]), "float32")


def test_user_order_call_equals_the_kernel_order_call(compile_text):
    """The box call in the user's order and the plain-block call in the kernel's give the
    same output once moved to the same order."""
    plan, module = compile_text(spec(mask=WIDE_BAND))
    attention = module.attention
    q, k, v = mixed_inputs(plan, "float32", seed=23, heads=2)
    user = attention(q, k, v, interpret=POISONED)
    moved = [attention.to_kernel_order(x, interpret=True) for x in (q, k, v)]
    kernel = attention(*moved, interpret=POISONED, token_order="kernel")
    np.testing.assert_allclose(
        np.asarray(attention.from_kernel_order(kernel, interpret=True)),
        np.asarray(user),
        rtol=2e-6,
        atol=2e-6,
    )


def test_tile_positions_walk_a_box_frame_by_frame():
    """Row r of a box of n places x F frames is place r % n, frame r // n of the tile: the
    positions of a tile are a permutation of its kernel positions."""
    frames, places, tile = 3, 128, 2
    block = frames * places
    got = np.asarray(tile_positions(tile, block, places, (1, block), 1))[0]
    start = tile * block
    assert sorted(got.tolist()) == list(range(start, start + block))
    place, frame = np.divmod(got - start, frames)
    np.testing.assert_array_equal(place, np.arange(block) % places)
    np.testing.assert_array_equal(frame, np.arange(block) // places)
    # a compute block's rows from an offset, in a column; and in order without boxes
    column = np.asarray(tile_positions(tile, block, places, (block - 128, 1), 0, 128))[:, 0]
    np.testing.assert_array_equal(column, got[128:])
    plain = np.asarray(tile_positions(tile, block, 0, (1, 128), 1, 256))[0]
    np.testing.assert_array_equal(plain, start + 256 + np.arange(128))


@pytest.mark.parametrize(
    "change",
    [
        {"mask": "{any_of: [{first_frame: {frames: 1}}, {temporal_stride: {rows: 0, cols: 1}}]}"},
        {"tiling": "{block_q: 384, block_kv: 384, compute_q: 128, compute_kv: 128}"},
        {"tiling": "{block_q: 384, block_kv: 256}"},
        {"frames": 16, "height": 4, "width": 8, "tiling": "{block_q: 128, block_kv: 128}"},
    ],
    ids=["anchor frame", "compute blocks", "kv tile not whole places", "8 places a tile"],
)
def test_boxes_only_where_a_tile_is_a_box(change, compile_text):
    """An anchor frame (kept first, frame-major), compute blocks smaller than the tile, a
    tile of no whole number of places, or boxes under the bf16 row tile (16 places): the
    wrapper moves the tokens instead, and the output still equals float64."""
    plan, module = compile_text(spec(**change))
    assert module.attention.cube_dma is None
    q, k, v = mixed_inputs(plan, "float32", seed=24, heads=2)
    out = module.attention(q, k, v, interpret=POISONED)
    check_per_head(plan, out, q, k, v, [0, 0], "float32")


@pytest.mark.parametrize("layout", ["{order: [w, h, f]}", "{order: [f, h, w]}"])
def test_other_orders_have_no_place_boxes(layout, compile_text):
    _, module = compile_text(spec(mask=WIDE_BAND).replace("{order: [h, w, f]}", layout))
    assert module.attention.cube_dma is None


def test_v5e_compiles_box_reads_with_no_data_movement(compile_text):
    """AOT for a TPU v5e on this host: the forward call is the kernel alone (no transpose,
    gather or copy of q, k, v or o around it), and the gradient's program moves no tensor of
    tokens x head_dim either (only D, a value per token, into the q boxes' order)."""
    plan, module = compile_text(spec(mask=WIDE_BAND, dtype="bfloat16"))
    hlo = compile_for_v6e(module, topology_name="v5e:2x2").as_text()
    assert mosaic_kernels(hlo) == ["svgen_attention"]
    assert data_movement(hlo) == set()
    grad_hlo = v5e_gradient_hlo(module)
    assert sorted(set(mosaic_kernels(grad_hlo))) == ["svgen_attention", "svgen_attention_dkv"]
    per_token = 2 * module.attention.shape.padded_seq_len  # heads x padded tokens
    moved = [math.prod(dims) for dims in _moved_shapes(grad_hlo)]
    assert moved and max(moved) <= per_token


def _moved_shapes(hlo: str) -> list[tuple[int, ...]]:
    """The shapes of the floating arrays XLA transposes, gathers, concatenates or copies (by
    the JAX op behind each instruction, as tpu_helpers.data_movement reads them)."""
    pattern = r'= (?:f32|bf16)\[([\d,]*)\][^\n]*op_name="[^"]*/(?:transpose|gather|concatenate|copy)[^"/]*"'
    return [tuple(int(n) for n in dims.split(",") if n) for dims in re.findall(pattern, hlo)]


# -- heads of several layouts: a kernel call per run of heads of one layout --------------------

PLACES = "{order: [h, w, f]}"  # place boxes


def three_layouts(name, geometry, dtype, temporal, third, assign, tiling=TILES) -> str:
    """Four heads of three patterns, each in a layout of its own: a frame-major window of rows
    and columns, ``temporal`` read in place boxes, and ``third`` (its name, term and axis
    order)."""
    third_name, third_term, third_order = third
    return spec_text(
        name,
        geometry,
        4,
        dtype=dtype,
        patterns={
            "spatial": "{spatial_window: {frames: 0, rows: 2, cols: 3}}",
            "temporal": temporal,
            third_name: third_term,
        },
        layouts={"temporal": PLACES, third_name: third_order},
        assign=assign,
        tiling=tiling,
    )


def mixed_spec(assign: str, dtype: str = "float32") -> str:
    columns = ("columns", "{temporal_stride: {rows: 1, cols: 0}}", "{order: [w, h, f]}")
    tiling = "{block_q: 384, block_kv: 384}"
    return three_layouts(
        "place_boxes_mixed", (3, 16, 36), dtype, WIDE_BAND, columns, assign, tiling
    )


RUNS = {
    "[spatial, spatial, temporal, temporal]": ((0, 2, 0), (2, 4, 1)),
    "[temporal, spatial, temporal, spatial]": ((0, 1, 1), (1, 2, 0), (2, 3, 1), (3, 4, 0)),
}


# Each assignment in one dtype, the two dtypes between them (a dtype changes the operands'
# types, not which runs a call makes: 4 interpreted calls of 50-100 s each were 2 too many).
@pytest.mark.parametrize(
    "assign, dtype", [(list(RUNS)[0], "bfloat16"), (list(RUNS)[1], "float32")], ids=list(RUNS)
)
def test_heads_of_two_layouts_run_a_call_per_run(assign, dtype, compile_text):
    """Frame-major heads and [h, w, f] heads with place boxes, in runs: one kernel call per
    run of heads of one layout, each writing its heads' rows of the one output. Each head
    equals float64 of its own pattern, in the user's order, batched too."""
    plan, module = compile_text(mixed_spec(assign, dtype))
    attention = module.attention
    head_pattern = np.asarray(module.HEAD_PATTERN)
    assert attention.cube_dma is None and attention._head_runs(head_pattern) == RUNS[assign]
    q, k, v = mixed_inputs(plan, dtype, seed=25, heads=4)
    out = attention(q, k, v, interpret=POISONED)
    check_per_head(plan, out, q, k, v, head_pattern, dtype)
    batched = attention(*(jnp.stack([x[::-1], x]) for x in (q, k, v)), interpret=POISONED)
    np.testing.assert_array_equal(np.asarray(batched[1]), np.asarray(out))
    for head in range(4):  # the first batch element holds the heads reversed
        ref = attention(q[::-1], k[::-1], v[::-1], interpret=POISONED)
        np.testing.assert_array_equal(np.asarray(batched[0][head]), np.asarray(ref[head]))


def test_gradients_of_head_runs(compile_text):
    """Under a gradient the tokens are moved and one call runs in kernel order (what the
    backward kernels read): gradients equal float64."""
    assign = "[temporal, spatial, temporal, spatial]"
    plan, module = compile_text(mixed_spec(assign))
    q, k, v = mixed_inputs(plan, "float32", seed=26, heads=4)
    check_grads(plan, module, q, k, v, np.asarray(module.HEAD_PATTERN), "float32")


@pytest.mark.parametrize(
    "assign", ["[spatial, columns, temporal, spatial]", "runtime"], ids=["moved layout", "traced"]
)
def test_head_runs_only_where_every_head_reads_the_users_order(assign, compile_text):
    """A head of a layout with no place boxes ([w, h, f]), or an assignment traced at run
    time (no static runs): one call for every head, the tokens moved around it, the output
    still float64's."""
    plan, module = compile_text(mixed_spec(assign))
    attention = module.attention
    if assign == "runtime":
        head_pattern = np.array([1, 0, 1, 0])
        assert attention._head_runs(None) is None
    else:
        head_pattern = np.asarray(module.HEAD_PATTERN)
        assert attention._head_runs(head_pattern) is None
    q, k, v = mixed_inputs(plan, "float32", seed=27, heads=4)

    def run(hp, q, k, v):
        return attention(q, k, v, head_pattern=hp, interpret=POISONED)

    out = jax.jit(run)(jnp.asarray(head_pattern), q, k, v)
    check_per_head(plan, out, q, k, v, head_pattern, "float32")


def test_v5e_compiles_head_runs_with_no_data_movement(compile_text):
    """AOT for a TPU v5e: one kernel per run, each reading q, k, v where they lie (the box
    view a bitcast of the user's array) and writing into one o: no transpose, gather, copy
    or concatenation of tokens around them."""
    _, module = compile_text(mixed_spec("[temporal, spatial, temporal, spatial]", "bfloat16"))
    hlo = _v5e_static_call_hlo(module)
    assert mosaic_kernels(hlo) == ["svgen_attention"] * 4
    assert data_movement(hlo) == set()


def _v5e_static_call_hlo(module) -> str:
    """The compiled HLO of a forward call with the spec's static assignment (head runs need
    a concrete one; tpu_helpers.compile_for_v6e traces head_pattern), AOT for a v5e."""
    sharding = jax.sharding.SingleDeviceSharding(tpu_device("v5e:2x2"))
    shape = (module.HEADS, module.SEQ_LEN, module.HEAD_DIM)
    arg = jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sharding)
    call = jax.jit(lambda q, k, v: module.attention(q, k, v))
    return call.lower(arg, arg, arg).compile().as_text()


def three_orders(dtype: str) -> str:
    rows = ("rows", "{spatial_window: {frames: 1, rows: 0, cols: 4}}", "{order: [h, f, w]}")
    temporal, assign = "{temporal_stride: {rows: 0, cols: 1}}", "[rows, temporal, spatial, rows]"
    return three_layouts("three_orders", (4, 8, 32), dtype, temporal, rows, assign)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_head_runs_of_three_orders_with_cubes(dtype, compile_text):
    """[h, f, w] heads are cubes of every frame x 1 row x every column: at tiles of one cube
    their run reads cube boxes, beside a place box run and a frame-major one; each head
    equals float64, and the v5e program moves no token."""
    plan, module = compile_text(three_orders(dtype))
    attention = module.attention
    kinds = [type(b).__name__ for b in attention.layout_boxes]
    assert kinds == ["NoneType", "PlaceBoxes", "CubeDma"]
    head_pattern = np.asarray(module.HEAD_PATTERN)
    assert attention._head_runs(head_pattern) == ((0, 1, 2), (1, 2, 1), (2, 3, 0), (3, 4, 2))
    q, k, v = mixed_inputs(plan, dtype, seed=28, heads=4)
    check_per_head(plan, attention(q, k, v, interpret=POISONED), q, k, v, head_pattern, dtype)
    if dtype == "bfloat16":
        hlo = _v5e_static_call_hlo(module)
        assert mosaic_kernels(hlo) == ["svgen_attention"] * 4
        assert data_movement(hlo) == set()


def test_the_module_says_where_a_call_reads_its_tokens(compile_text):
    """The generated module's docstring (and `svgen inspect`) says when a call in the user's
    order moves no token, as the runtime decides it (svgen.core.boxes), and nothing where the
    tokens are moved."""
    _, boxed = compile_text(spec(mask=WIDE_BAND))
    assert boxed.attention.cube_dma is not None
    assert "place boxes of 3 frames x 128 places): a call in the user's order moves none" in (
        boxed.__doc__
    )
    _, runs = compile_text(three_orders("float32"))
    assert runs.attention._head_runs(np.asarray(runs.HEAD_PATTERN)) is not None
    line = "cube boxes of 4 frame(s) x 1 row(s) x 32 column(s); place boxes of 4 frames x 32 places"
    assert line in runs.__doc__ and "under a gradient they are moved" in runs.__doc__
    for moved in (
        spec(mask="{any_of: [{first_frame: {frames: 1}}, {temporal_stride: {rows: 0, cols: 1}}]}"),
        mixed_spec("[spatial, columns, temporal, spatial]"),
    ):
        _, module = compile_text(moved)
        assert "Tokens:" not in module.__doc__
    # the same candidates, the [w, h, f] one assigned to no head: head runs, and said so
    _, assigned = compile_text(mixed_spec("[spatial, spatial, temporal, temporal]"))
    assert "one kernel call per run of heads of one layout" in assigned.__doc__
