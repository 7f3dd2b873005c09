"""attention(..., token_order="kernel"): q, k, v already in each head's kernel order and o
returned in it, with nothing permuted around the kernel; attention.to_kernel_order /
from_kernel_order move arrays between the orders. Checked against the user-order call, the
layouts' own permutations and float64 (NaN-poisoned interpret mode), gradients included,
and on XLA's v6e program (no permutation kernel, no float data movement)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_helpers import POISONED, check_per_head, mixed_inputs, reference_grads
from tpu_helpers import CUBE_DMA_SPEC, MIXED_SPEC, data_movement, mosaic_kernels, v6e_device


def kernel_order_by_layout(plan, x, head_pattern) -> np.ndarray:
    """Each head of x [heads, seq, d] in its pattern's kernel order, by the layout (NumPy)."""
    x = np.asarray(jnp.asarray(x, jnp.float32))
    return np.stack([plan.patterns[p].layout.to_kernel(x[h]) for h, p in enumerate(head_pattern)])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernel_order_call_equals_the_user_order_call(dtype, compile_text):
    """Mixed heads (frame-major spatial, temporal-major temporal, text last): the conversion
    is each head's layout permutation, the kernel-order call's output converted back matches
    float64 per head, and from_kernel_order inverts to_kernel_order exactly."""
    plan, module = compile_text(MIXED_SPEC.replace("DTYPE", dtype))
    q, k, v = mixed_inputs(plan, dtype, seed=31, heads=3)
    for head_pattern in ([1, 0, 1], [0, 0, 0]):
        hp = np.asarray(head_pattern)
        moved = [
            module.attention.to_kernel_order(x, head_pattern=hp, interpret=True) for x in (q, k, v)
        ]
        np.testing.assert_array_equal(
            np.asarray(jnp.asarray(moved[0], jnp.float32)), kernel_order_by_layout(plan, q, hp)
        )
        np.testing.assert_array_equal(
            np.asarray(
                module.attention.from_kernel_order(moved[1], head_pattern=hp, interpret=True)
            ),
            np.asarray(k),
        )
        out = module.attention(*moved, head_pattern=hp, interpret=POISONED, token_order="kernel")
        assert out.shape == q.shape and out.dtype == q.dtype
        back = module.attention.from_kernel_order(out, head_pattern=hp, interpret=True)
        check_per_head(plan, back, q, k, v, head_pattern, dtype)


def test_kernel_order_with_a_traced_assignment_and_a_batch(compile_text):
    plan, module = compile_text(MIXED_SPEC.replace("DTYPE", "float32"))
    q, k, v = mixed_inputs(plan, "float32", seed=32, heads=3)
    batch = [jnp.stack([x, x[::-1]]) for x in (q, k, v)]  # [2, heads, seq, d]

    @jax.jit
    def run(q, k, v, hp):
        to = module.attention.to_kernel_order
        moved = [to(x, head_pattern=hp, interpret=True) for x in (q, k, v)]
        out = module.attention(*moved, head_pattern=hp, interpret=True, token_order="kernel")
        return module.attention.from_kernel_order(out, head_pattern=hp, interpret=True)

    hp = jnp.asarray([1, 1, 0], jnp.int32)
    got = run(*batch, hp)
    want = module.attention(*batch, head_pattern=np.asarray([1, 1, 0]), interpret=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    check_per_head(plan, got[0], q, k, v, [1, 1, 0], "float32")


def test_kernel_order_gradients(compile_text):
    """jax.grad through a kernel-order call: the gradients, converted back to the user's
    order, equal float64's."""
    plan, module = compile_text(MIXED_SPEC.replace("DTYPE", "float32"))
    q, k, v = mixed_inputs(plan, "float32", seed=33, heads=3)
    hp = np.asarray([1, 0, 1])
    do = np.random.default_rng(8).standard_normal(q.shape).astype(np.float32)
    to = module.attention.to_kernel_order
    qk, kk, vk, dok = (to(x, head_pattern=hp, interpret=True) for x in (q, k, v, do))

    def loss(q, k, v):
        out = module.attention(q, k, v, head_pattern=hp, interpret=POISONED, token_order="kernel")
        return jnp.sum(out * dok)

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(qk, kk, vk)
    want = reference_grads(plan, q, k, v, hp, do)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        g = np.asarray(module.attention.from_kernel_order(g, head_pattern=hp, interpret=True))
        error = np.linalg.norm(g - w) / np.linalg.norm(w)
        assert error <= 1e-4, f"{name}: relative error {error:.2e}"


def test_cube_layout_in_kernel_order_runs_plain_blocks(compile_text):
    """A tiled layout whose tiles the kernel reads as boxes of the user's array (cube DMA):
    in kernel order the tiles are contiguous runs, read as plain blocks."""
    plan, module = compile_text(CUBE_DMA_SPEC.replace("DTYPE", "float32"))
    assert module.attention.cube_dma is not None
    q, k, v = mixed_inputs(plan, "float32", seed=34, heads=2)
    to = module.attention.to_kernel_order
    moved = [to(x) for x in (q, k, v)]
    np.testing.assert_array_equal(np.asarray(moved[2]), kernel_order_by_layout(plan, v, [0, 0]))
    out = module.attention(*moved, interpret=POISONED, token_order="kernel")
    check_per_head(plan, module.attention.from_kernel_order(out), q, k, v, [0, 0], "float32")


def test_bad_token_order_and_shapes_are_refused(compile_text):
    plan, module = compile_text(MIXED_SPEC.replace("DTYPE", "float32"))
    q, k, v = mixed_inputs(plan, "float32", seed=35, heads=3)
    with pytest.raises(ValueError, match="token_order must be one of"):
        module.attention(q, k, v, token_order="temporal_major")
    expected = rf"expected \[heads, {module.SEQ_LEN}, 128\]"
    with pytest.raises(ValueError, match=expected):
        module.attention.to_kernel_order(q[:, :-1])
    with pytest.raises(ValueError, match=expected):
        module.attention.from_kernel_order(q[0])


def test_kernel_order_call_moves_nothing_on_v6e(compile_text):
    """XLA's v6e program of a kernel-order call with a traced assignment holds the attention
    kernel alone: no permute kernel, no transpose, gather, concatenation or copy of float
    data; the user-order call of the same module permutes."""
    _, module = compile_text(MIXED_SPEC.replace("DTYPE", "bfloat16"))
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    arg = jax.ShapeDtypeStruct(
        (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.bfloat16, sharding=sharding
    )
    hp = jax.ShapeDtypeStruct((module.HEADS,), jnp.int32, sharding=sharding)

    def program(token_order):
        def run(q, k, v, hp):
            return module.attention(q, k, v, head_pattern=hp, token_order=token_order)

        return jax.jit(run).lower(arg, arg, arg, hp).compile().as_text()

    kernel_order = program("kernel")
    assert kernel_order.count("tpu_custom_call") >= 1 and "svgen_attention" in kernel_order
    assert mosaic_kernels(kernel_order) == ["svgen_attention"]
    assert "svgen_permute" not in kernel_order and data_movement(kernel_order) == set()
    user_order = program("user")
    assert "svgen_permute_to_kernel" in user_order
    kernels = {"svgen_permute_to_kernel", "svgen_attention", "svgen_permute_from_kernel"}
    assert set(mosaic_kernels(user_order)) == kernels


def test_a_layer_kept_in_kernel_order(compile_text):
    """The use the option is for: hidden states [seq, heads*d] converted once with the
    pattern's layout, token-wise projections in kernel order, attention with
    token_order="kernel", converted back once: equal to the same layer in the user's order."""
    plan, module = compile_text(MIXED_SPEC.replace("DTYPE", "float32"))
    heads, d, seq = module.HEADS, module.HEAD_DIM, module.SEQ_LEN
    rng = np.random.default_rng(36)
    hidden = rng.standard_normal((seq, heads * d)).astype(np.float32)
    w_q, w_k, w_v, w_o = (
        (rng.standard_normal((heads * d, heads * d)) / np.sqrt(heads * d)).astype(np.float32)
        for _ in range(4)
    )
    temporal = np.ones(heads, np.int32)  # every head temporal-major: one kernel order

    def layer(h, token_order):
        q, k, v = (
            jnp.transpose((h @ w).reshape(seq, heads, d), (1, 0, 2)) for w in (w_q, w_k, w_v)
        )
        o = module.attention(
            q, k, v, head_pattern=temporal, interpret=True, token_order=token_order
        )
        return jnp.transpose(o, (1, 0, 2)).reshape(seq, heads * d) @ w_o

    lay = module.TEMPORAL_LAYOUT
    assert not lay.is_identity
    in_kernel_order = lay.from_kernel(layer(lay.to_kernel(hidden, jnp), "kernel"), jnp)
    want = layer(hidden, "user")
    np.testing.assert_allclose(np.asarray(in_kernel_order), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_gpu_kernel_order_call(compile_text):
    """The GPU attention takes token_order too (interpret mode): the same conversion, and its
    kernel-order call converted back matches float64 per head."""
    from svgen.runtime import gpu

    plan, module = compile_text(MIXED_SPEC.replace("DTYPE", "float32"))
    attention = gpu.gpu_attention_of(module)
    q, k, v = mixed_inputs(plan, "float32", seed=37, heads=3)
    hp = np.asarray([1, 0, 1])
    moved = [attention.to_kernel_order(x, head_pattern=hp) for x in (q, k, v)]
    np.testing.assert_array_equal(np.asarray(moved[0]), kernel_order_by_layout(plan, q, hp))
    out = attention(*moved, head_pattern=hp, interpret=True, token_order="kernel")
    check_per_head(plan, attention.from_kernel_order(out, head_pattern=hp), q, k, v, hp, "float32")
    with pytest.raises(ValueError, match="token_order must be one of"):
        attention(q, k, v, token_order="frame_major")


GATHERED_LAYOUTS = [
    ("temporal_major", 1, 8, "last"),
    (("w", "h", "f"), 1, 8, "first"),
    (("f", "w", "h"), 0, 0, "last"),
    (("h", "f", "w"), 0, 4, "last"),
]


@pytest.mark.parametrize("order, anchors, text, text_position", GATHERED_LAYOUTS)
def test_token_gather_is_the_layouts_permutation(order, anchors, text, text_position):
    """The wrapper's gather (where the permute kernel does not apply) moves tokens exactly as
    the layout's own permutation does, both ways, on a random float tensor; its gradient is
    the inverse gather (no scatter in the program), equal to the layout's inverse."""
    from svgen.core.layout import AxisOrder, TokenLayout
    from svgen.runtime.calls import token_gather

    base = TokenLayout(frames=5, height=8, width=16, text_tokens=text, text_position=text_position)
    lay = base.with_order(
        order if isinstance(order, str) else AxisOrder(order), anchor_frames=anchors
    )
    assert not lay.is_identity
    x = np.random.default_rng(5).standard_normal((2, 3, lay.seq_len, 4)).astype(np.float32)
    moved = token_gather(lay, True)(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(moved), lay.to_kernel(x))
    np.testing.assert_array_equal(np.asarray(token_gather(lay, False)(moved)), x)

    weights = np.random.default_rng(6).standard_normal(x.shape).astype(np.float32)

    def loss(y):
        return jnp.sum(token_gather(lay, True)(y) * weights)

    grad = jax.grad(loss)(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(grad), lay.from_kernel(weights))
    assert "scatter" not in jax.jit(jax.grad(loss)).lower(jnp.asarray(x)).as_text()


@pytest.mark.parametrize(
    "cube, gathers", [((1, 4, 8), False), ((5, 1, 16), False), ((2, 3, 8), True)]
)
def test_layout_move_gathers_only_where_cubes_do_not_divide(cube, gathers):
    """Tiled orders whose cubes divide the video move by reshapes and transposes (a copy's
    rate on the chip); partial cubes and temporal-major orders by the token gather. Both
    are the layout's permutation."""
    from svgen.core.layout import Tiled, TokenLayout
    from svgen.runtime.calls import layout_move

    video = TokenLayout(frames=5, height=8, width=16)
    x = jnp.asarray(np.random.default_rng(7).standard_normal((3, video.seq_len, 4)), jnp.float32)
    for lay in (
        video.with_order(Tiled(*cube)),
        video.with_order("temporal_major", anchor_frames=1),
    ):
        expect_gather = gathers or lay.is_temporal_major
        for to_kernel in (True, False):
            move = layout_move(lay, to_kernel)
            text = jax.jit(move).lower(x).as_text()
            assert ("gather" in text) == expect_gather, (lay, to_kernel)
            permuted = lay.to_kernel if to_kernel else lay.from_kernel
            np.testing.assert_array_equal(np.asarray(move(x)), permuted(np.asarray(x)))
