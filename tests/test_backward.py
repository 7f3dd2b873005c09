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

from helpers import (
    REPO,
    MASK_SPECS,
    TWO_LEVEL,
    mask_spec_text,
    random_layout,
    random_mask,
    scaled_spec_text,
)
from kernel_helpers import POISONED, check_grads, mixed_inputs
from svgen.runtime import backward
from svgen.core.kinds import TileKind


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spec_path", MASK_SPECS, ids=lambda p: p.stem)
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


@pytest.mark.parametrize("seed", range(6))
def test_gradients_of_random_masks(seed, compile_text):
    """Random masks and layouts (text first or last, temporal-major with anchors, sizes that
    do not divide the 128 x 128 tiles): dq, dk, dv against float64."""
    rng = np.random.default_rng(13_000 + seed)
    lay = random_layout(rng)
    plan, module = compile_text(mask_spec_text(random_mask(rng, lay), lay, name="random_grad"))
    q, k, v = mixed_inputs(plan, "float32", seed=seed, heads=1)
    check_grads(plan, module, q, k, v, [0], "float32")
