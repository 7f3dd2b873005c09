"""The backward pass: dq, dk, dv of a generated `attention` against float64 gradients.

jax.grad through `attention` runs the forward kernel (saving each row's log-sum-exp) and the
two backward kernels (dq over the forward tables, dk/dv over the transposed ones) in Pallas
interpret mode with NaN-poisoned buffers; the reference differentiates dense masked softmax
attention in closed form in float64 NumPy.
"""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import (
    POISONED,
    REPO,
    SPECS,
    TWO_LEVEL,
    mixed_inputs,
    reference_grads,
    scaled_spec_text,
)
from svgen.runtime import backward
from svgen.runtime.kinds import TileKind

TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


def check_grads(plan, module, q, k, v, head_pattern, dtype, jit_pattern=False):
    do = np.random.default_rng(7).standard_normal(q.shape).astype(np.float32)

    def loss(q, k, v, hp):
        out = module.attention(q, k, v, head_pattern=hp, interpret=POISONED)
        return jnp.sum(out.astype(jnp.float32) * do)

    grad = jax.grad(loss, argnums=(0, 1, 2))
    hp = jnp.asarray(head_pattern, jnp.int32) if jit_pattern else np.asarray(head_pattern)
    got = (
        jax.jit(grad)(q, k, v, hp)
        if jit_pattern
        else jax.jit(lambda q, k, v: grad(q, k, v, hp))(q, k, v)
    )
    want = reference_grads(plan, q, k, v, np.asarray(head_pattern), do)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
        assert np.all(np.isfinite(a)), f"{name}: non-finite values"
        error = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)
        assert error <= TOLERANCE[dtype], f"{name}: relative error {error:.2e}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.stem)
def test_gradients_of_every_shipped_spec(spec_path, dtype, compile_text):
    """Two-level tiles (FULL, BOUNDARY and EMPTY compute blocks), sizes that do not divide
    the tiles, both layouts and text where the spec has them."""
    plan, module = compile_text(scaled_spec_text(spec_path, tiling=TWO_LEVEL, dtype=dtype))
    q, k, v = mixed_inputs(plan, dtype, seed=zlib.crc32(spec_path.stem.encode()) + 2, heads=2)
    check_grads(plan, module, q, k, v, np.arange(2) % len(plan.patterns), dtype)


def test_gradients_with_a_traced_head_pattern_and_one_compute_block_per_tile(compile_text):
    plan, module = compile_text(scaled_spec_text(REPO / "specs" / "wan21_720p_mixed.yaml", heads=4))
    q, k, v = mixed_inputs(plan, "float32", seed=11)
    check_grads(plan, module, q, k, v, [1, 0, 0, 1], "float32", jit_pattern=True)


def test_rows_without_keys_get_zero_gradient_and_batches_work(compile_text):
    """Queries of frame 0 may attend nothing (causal from frame 1 on): zero dq rows, no NaN."""
    text = scaled_spec_text(REPO / "specs" / "wan21_720p_spatial.yaml").replace(
        "any_of:\n  - first_frame:\n      frames: 1\n  - spatial_window:\n      frames: 1",
        "expr: f_k >= 1 and f_k <= f_q",
    )
    assert "expr" in text
    plan, module = compile_text(text)
    rng = np.random.default_rng(3)
    shape = (2, 2, plan.layout.seq_len, plan.spec.attention.head_dim)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    check_grads(plan, module, q, k, v, [0, 0], "float32")
    dq = jax.jit(jax.grad(lambda q: jnp.sum(module.attention(q, k, v, interpret=POISONED))))(q)
    frame = plan.layout.tokens_per_frame
    np.testing.assert_array_equal(np.asarray(dq)[..., :frame, :], 0.0)


@pytest.mark.parametrize("name", ["hunyuan_720p_text", "wan21_720p_band"])
def test_transposed_tables_visit_the_same_compute_blocks(name, compile_text):
    """Per kv tile, the q tiles that visit it: the same FULL / BOUNDARY blocks, transposed."""
    plan, module = compile_text(scaled_spec_text(REPO / "specs" / f"{name}.yaml", tiling=TWO_LEVEL))
    shape = module.SHAPE
    runs = plan.only.table.runs
    nq, nk = plan.grid.num_q_blocks, plan.grid.num_kv_blocks
    rq, rk = shape.q_blocks_per_tile, shape.kv_blocks_per_tile
    blocks = backward.compute_block_kinds(runs, nq, nk, rq, rk)
    transposed = backward.transposed_runs(runs, shape)
    back = backward.compute_block_kinds(transposed, nk, nq, rk, rq)
    np.testing.assert_array_equal(back, blocks.T)
    assert TileKind.BOUNDARY in set(np.unique(blocks).tolist())
    assert len(set(np.unique(blocks).tolist())) >= 2
    # Every kv tile has a step (a zero-fill one when no q tile visits it).
    assert sorted(set(transposed[:, 0].tolist())) == list(range(nk))


@pytest.mark.parametrize("name", ["wan21_720p_mixed", "hunyuan_720p_text"])
def test_separate_dq_kernel_gives_the_same_gradients(name, compile_text, monkeypatch):
    """The unfused backward (dq in its own walk of the forward tables, dk/dv in the
    transposed one) against the float64 reference too: both stay correct, so that
    `svgen cost --backward` can compare them."""
    monkeypatch.setattr(backward, "FUSED_DQ", False)
    plan, module = compile_text(scaled_spec_text(REPO / "specs" / f"{name}.yaml", tiling=TWO_LEVEL))
    q, k, v = mixed_inputs(plan, "float32", seed=zlib.crc32(name.encode()) + 5, heads=2)
    check_grads(plan, module, q, k, v, np.arange(2) % len(plan.patterns), "float32")
