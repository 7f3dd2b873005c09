"""The temporal-major permutation kernel (svgen.runtime.permute) against the layout's own
NumPy permutation: exact in f32 and bf16 (every input value nonzero, so a row left unwritten
fails), frame-major rows copied, text first and last, anchor frames, a last block of fewer
places, rows of several blocks (the two-slot pipeline); in the discharge interpreter and in
the TPU one (NaN-poisoned scratch, DMA race detection); its VJP; its compile for v6e at full
size; and the generated wrappers that use it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax._src.pallas.mosaic.interpret import interpret_pallas_call
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime import permute
from svgen.core.layout import Tiled, TokenLayout

from kernel_helpers import POISONED, check_per_head, mixed_inputs
from tpu_helpers import MIXED_SPEC, compile_for_v6e, data_movement, mosaic_kernels, v6e_device

CASES = [
    # frames, height, width, text, position, anchors, dtype
    (5, 4, 6, 0, "last", 1, "float32"),
    (6, 10, 20, 7, "first", 2, "float32"),  # 200 places: blocks of 128 and 72
    (4, 16, 16, 5, "last", 1, "bfloat16"),
    (3, 1, 200, 0, "last", 0, "float32"),  # no anchor frame
    (7, 2, 3, 9, "first", 5, "bfloat16"),  # two main frames left
    (3, 20, 20, 0, "last", 1, "float32"),  # 400 places: blocks 128, 128, 128, 16
    (2, 32, 16, 3, "first", 0, "bfloat16"),  # 512 places: four whole blocks
]


def layouts(frames, height, width, text, position, anchors):
    frame_major = TokenLayout(frames, height, width, text, position)
    return frame_major, frame_major.with_order("temporal_major", anchors)


def reference(x: np.ndarray, lay: TokenLayout, moved: np.ndarray, to_kernel: bool) -> np.ndarray:
    out = x.copy()
    heads = moved.size
    for r in range(x.shape[0]):
        if moved[r % heads]:
            out[r] = lay.to_kernel(x[r]) if to_kernel else lay.from_kernel(x[r])
    return out


@pytest.mark.parametrize("interpreter", ["discharge", "tpu"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:3])) + f"+{c[3]}")
def test_both_directions_equal_the_layout(case, interpreter):
    """The TPU interpreter runs the DMAs as DMAs (semaphores, scratch poisoned with NaN) and
    reports any read or write of a buffer while a DMA into it is in flight."""
    *geometry, dtype = case
    frame_major, temporal = layouts(*geometry)
    heads, head_layout = 3, jnp.asarray([1, 0, 1], jnp.int32)
    rng = np.random.default_rng(sum(geometry[:3]))
    x = rng.standard_normal((2 * heads, temporal.seq_len, 128)).astype(np.float32)
    x = np.asarray(jnp.asarray(x, dtype).astype(jnp.float32))  # values the dtype holds
    moved = np.array([True, False, True])
    for to_kernel in (True, False):
        y = permute.permute(
            jnp.asarray(x, dtype),
            [frame_major, temporal],
            head_layout,
            to_kernel=to_kernel,
            interpret=True if interpreter == "discharge" else RACES,
        )
        if interpreter == "tpu":
            assert not interpret_pallas_call.races.races_found
        assert y.dtype == jnp.dtype(dtype)
        got = np.asarray(y.astype(jnp.float32))
        assert np.array_equal(got, reference(x, temporal, moved, to_kernel)), to_kernel


RACES = pltpu.InterpretParams(uninitialized_memory="nan", detect_races=True)


def test_applies_only_to_one_temporal_major_layout():
    frame_major, temporal = layouts(5, 4, 6, 0, "last", 1)
    _, other = layouts(5, 4, 6, 0, "last", 2)
    tiled = frame_major.with_order(Tiled(1, 2, 3))
    assert permute.applies([temporal]) and permute.applies([frame_major, temporal])
    assert not permute.applies([frame_major])  # nothing to move
    assert not permute.applies([temporal, other])  # two layouts to move
    assert not permute.applies([tiled])
    # A temporal-major order of one frame is the identity: nothing to move.
    assert not permute.applies([layouts(1, 4, 6, 0, "last", 0)[1]])
    # Text or frames that are not whole (8, 128) tiles of rows: Mosaic refuses the DMAs.
    assert permute.applies([layouts(5, 4, 6, 16, "first", 1)[1]])
    assert not permute.applies([layouts(5, 4, 6, 12, "first", 1)[1]])
    assert not permute.applies([layouts(5, 3, 5, 0, "last", 1)[1]])


def test_vjp_is_the_inverse_permutation():
    frame_major, temporal = layouts(6, 10, 20, 7, "first", 2)
    head_layout = jnp.asarray([1, 0], jnp.int32)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((2, temporal.seq_len, 128)), jnp.float32)
    w = jnp.asarray(rng.standard_normal(x.shape), jnp.float32)

    def loss(x, move):
        return jnp.sum(move(x) * w)

    def kernel_move(x):
        return permute.permute(
            x, [frame_major, temporal], head_layout, to_kernel=True, interpret=True
        )

    def xla_move(x):
        return jnp.stack([temporal.to_kernel(x[0], jnp), x[1]])

    got = jax.jit(jax.grad(lambda x: loss(x, kernel_move)))(x)
    want = jax.grad(lambda x: loss(x, xla_move))(x)
    assert np.array_equal(np.asarray(got), np.asarray(want))


V6E_GEOMETRIES = [
    # frames, height, width, text, position, anchors; heads
    ((21, 45, 80, 0, "last", 1), 10),  # Wan 720p: 28 blocks of 128 places and one of 16
    ((33, 45, 80, 256, "last", 1), 4),  # HunyuanVideo 720p with its text
    ((5, 6, 36, 24, "first", 2), 3),  # 216 places: a last block of 88
]


@pytest.mark.parametrize("geometry, heads", V6E_GEOMETRIES, ids=["wan", "hunyuan", "text_first"])
@pytest.mark.parametrize("to_kernel", [True, False])
def test_compiles_for_v6e_where_it_applies(geometry, heads, to_kernel):
    """Every layout `applies` accepts compiles for v6e in bf16 (Mosaic refuses DMAs that cut
    a bf16 array's row tiles)."""
    frame_major, temporal = layouts(*geometry)
    assert permute.applies([frame_major, temporal])
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    x = jax.ShapeDtypeStruct((heads, temporal.seq_len, 128), jnp.bfloat16, sharding=sharding)
    hp = jax.ShapeDtypeStruct((heads,), jnp.int32, sharding=sharding)

    def move(x, hp):
        return permute.permute(x, [frame_major, temporal], hp, to_kernel=to_kernel)

    text = jax.jit(move).lower(x, hp).compile().as_text()
    assert "tpu_custom_call" in text


# -- the generated wrappers ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mixed_module_permutes_with_the_kernel(dtype, compile_text):
    """Spatial heads frame-major, temporal heads temporal-major (text last, 192 places: two
    blocks): the wrapper moves q, k, v and o with the permute kernel, the output matches
    float64 per head (NaN-poisoned TPU interpreter, traced and concrete assignments), and XLA's
    v6e program moves no float data outside the kernels."""
    plan, module = compile_text(MIXED_SPEC.replace("DTYPE", dtype))
    assert module.attention.permute_kernel
    q, k, v = mixed_inputs(plan, dtype, seed=21, heads=3)
    for head_pattern in ([1, 0, 1], [1, 1, 1]):
        out = module.attention(q, k, v, head_pattern=np.array(head_pattern), interpret=POISONED)
        check_per_head(plan, out, q, k, v, head_pattern, dtype)
    traced = jax.jit(lambda q, k, v, hp: module.attention(q, k, v, head_pattern=hp, interpret=True))
    out = traced(q, k, v, jnp.asarray([0, 1, 1], jnp.int32))
    check_per_head(plan, out, q, k, v, [0, 1, 1], dtype)
    hlo = compile_for_v6e(module).as_text()
    assert "svgen_permute_to_kernel" in hlo and "svgen_permute_from_kernel" in hlo
    kernels = {"svgen_permute_to_kernel", "svgen_attention", "svgen_permute_from_kernel"}
    assert set(mosaic_kernels(hlo)) == kernels  # each compiled by libtpu
    assert data_movement(hlo) == set()


def test_frame_major_heads_alone_are_not_permuted(compile_text):
    """A concrete assignment of spatial (frame-major) heads only moves nothing: no permute
    call in the jitted program."""
    plan, module = compile_text(MIXED_SPEC.replace("DTYPE", "float32"))
    q, k, v = mixed_inputs(plan, "float32", seed=22, heads=3)
    spatial = np.zeros(3, np.int32)
    hlo = (
        jax.jit(lambda q, k, v: module.attention(q, k, v, head_pattern=spatial, interpret=True))
        .lower(q, k, v)
        .as_text()
    )
    assert "svgen_permute" not in hlo
    out = module.attention(q, k, v, head_pattern=spatial, interpret=True)
    check_per_head(plan, out, q, k, v, spatial, "float32")
