"""What every kernel backend must do, checked the same way for each (tests/backend_helpers.py):
every shipped spec at a scaled-down geometry, rows without keys, an empty mask, against the
float64 dense reference with unwritten output poisoned. Each backend's own behavior is in
its own module (test_kernels.py, test_gpu_kernel.py)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from backend_helpers import BACKEND_DTYPES, BACKENDS
from helpers import MASK_SPECS, dense_keep, scaled_spec_text
from kernel_helpers import check_per_head, mixed_inputs


@pytest.mark.parametrize("backend, dtype", BACKEND_DTYPES, ids=str)
@pytest.mark.parametrize("spec_path", MASK_SPECS, ids=lambda p: p.stem)
def test_shipped_spec_scaled_down(spec_path, backend, dtype, compile_text):
    """520 video tokens (+ text): not a multiple of the tiles, every pattern on some head."""
    plan, module = compile_text(scaled_spec_text(spec_path, dtype=dtype))
    for pattern in plan.patterns:
        assert pattern.tile_counts()["boundary"] > 0  # the masked path is exercised
    q, k, v = mixed_inputs(plan, dtype, seed=zlib.crc32(spec_path.stem.encode()), heads=2)
    head_pattern = np.arange(2) % len(plan.patterns)
    out = backend.run(backend.attention_of(module), q, k, v, head_pattern)
    assert out.shape == q.shape and out.dtype == q.dtype
    check_per_head(plan, out, q, k, v, head_pattern, dtype)


LONELY_TEXT = """
svgen: 1
name: lonely_text
geometry: {frames: 3, height: 4, width: 30, text_tokens: 70, text_position: first}
attention: {heads: 2, head_dim: 128, dtype: float32}
mask: {spatial_window: {frames: 0, rows: 1}}
tiling: {block_q: 128, block_kv: 128}
"""


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_rows_without_keys_are_zero_and_batch_dims_work(backend, compile_text):
    """Text queries see nothing under a pure spatial window: their rows are exactly 0, never
    NaN; q, k, v [batch, heads, seq, d]."""
    plan, module = compile_text(LONELY_TEXT)
    assert (~dense_keep(plan.mask, plan.layout).any(axis=1)).sum() == 70
    q, k, v = mixed_inputs(plan, "float32", seed=3, heads=2)
    batched = [np.stack([x, x[::-1]]) for x in (q, k, v)]  # batch 2, heads swapped
    out = np.asarray(backend.run(backend.attention_of(module), *batched))
    assert out.shape == batched[0].shape
    for b in range(2):
        check_per_head(plan, out[b], *(x[b] for x in batched), [0, 0], "float32")


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_empty_mask_gives_zeros(backend, compile_text):
    text = """
svgen: 1
name: nothing
geometry: {frames: 2, height: 3, width: 40}
attention: {heads: 1, head_dim: 128, dtype: float32}
mask: {all_of: [{first_frame: {frames: 1}}, {not: {first_frame: {frames: 1}}}]}
tiling: {block_q: 128, block_kv: 128}
"""
    plan, module = compile_text(text)
    assert plan.tile_counts()["empty"] == plan.kinds.size
    q = np.random.default_rng(0).standard_normal((1, 240, 128)).astype(np.float32)
    out = np.asarray(backend.run(backend.attention_of(module), q, q, q))
    assert np.all(out == 0.0)
