"""The temporal-major permutation kernel (svgen.runtime.permute) against the layout's own
NumPy permutation: exact in f32 and bf16 (every input value nonzero, so a row left unwritten
fails), frame-major rows copied, text first and last, anchor frames, a last block of fewer
places; its VJP; and its compile for v6e at full size. Run in the discharge interpreter
(`interpret=True`): see the module docstring for why not the TPU one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svgen.runtime import permute
from svgen.runtime.layout import Tiled, TokenLayout

from test_aot_tpu import v6e_device

CASES = [
    # frames, height, width, text, position, anchors, dtype
    (5, 4, 6, 0, "last", 1, "float32"),
    (6, 10, 20, 7, "first", 2, "float32"),  # 200 places: blocks of 128 and 72
    (4, 16, 16, 5, "last", 1, "bfloat16"),
    (3, 1, 200, 0, "last", 0, "float32"),  # no anchor frame
    (7, 2, 3, 9, "first", 5, "bfloat16"),  # two main frames left
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


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:3])) + f"+{c[3]}")
def test_both_directions_equal_the_layout(case):
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
            interpret=True,
        )
        assert y.dtype == jnp.dtype(dtype)
        got = np.asarray(y.astype(jnp.float32))
        assert np.array_equal(got, reference(x, temporal, moved, to_kernel)), to_kernel


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


@pytest.mark.parametrize("to_kernel", [True, False])
def test_compiles_for_v6e_at_wan_size(to_kernel):
    """Wan 720p: 21 frames of 45 x 80, the first an anchor, 10 heads, bf16 (28 blocks of 128
    places and one of 16)."""
    frame_major, temporal = layouts(21, 45, 80, 0, "last", 1)
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    x = jax.ShapeDtypeStruct((10, temporal.seq_len, 128), jnp.bfloat16, sharding=sharding)
    hp = jax.ShapeDtypeStruct((10,), jnp.int32, sharding=sharding)

    def move(x, hp):
        return permute.permute(x, [frame_major, temporal], hp, to_kernel=to_kernel)

    text = jax.jit(move).lower(x, hp).compile().as_text()
    assert "tpu_custom_call" in text
