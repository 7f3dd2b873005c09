"""The TPU kernel's own behavior, at scaled-down geometries, against a float64 dense reference
(what every backend must do, the shipped specs scaled down among it, is test_kernel_base.py).

Interpret mode runs the Pallas TPU kernel on the CPU with NaN-initialized buffers
(kernel_helpers.POISONED: Pallas's HLO interpreter): an output row the kernel never writes
stays NaN and fails the comparison.
"""

import zlib

import numpy as np
import pytest

from svgen.runtime.reference import masked_attention_reference
from svgen.core.tables import KernelShape
from svgen.core.vmem import row_sum_on_mxu

from helpers import MASK_SPECS, REPO, TOLERANCE, TWO_LEVEL, dense_keep, scaled_spec_text
from kernel_helpers import POISONED, check_per_head, mixed_inputs
from spec_corpus import ANCHOR, any_of, spec_text


def run_and_compare(plan, module, dtype, seed, batch=None):
    rng = np.random.default_rng(seed)
    lead = (2,) if batch is None else (batch, 2)
    shape = lead + (plan.layout.seq_len, plan.spec.attention.head_dim)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    if dtype == "bfloat16":
        import jax.numpy as jnp

        q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
        q64, k64, v64 = (np.asarray(x.astype(jnp.float32), np.float64) for x in (q, k, v))
    else:
        q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    out = np.asarray(module.attention(q, k, v, interpret=POISONED).astype("float32"))
    keep = dense_keep(plan.mask, plan.layout)
    ref = masked_attention_reference(q64, k64, v64, keep)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite output rows"
    err = np.max(np.abs(out - ref)) / np.max(np.abs(ref))
    assert err <= TOLERANCE[dtype], f"relative error {err:.2e}"
    no_keys = ~keep.any(axis=1)
    assert np.all(out[..., no_keys, :] == 0.0)
    return keep


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spec_path", MASK_SPECS, ids=lambda p: p.stem)
def test_shipped_spec_two_level_tiles(spec_path, dtype, compile_text):
    """256 x 512 tiles of 128 x 128 compute blocks: BOUNDARY tiles run each compute block by
    its own kind (FULL unmasked, BOUNDARY masked, EMPTY skipped), padding blocks included."""
    plan, module = compile_text(scaled_spec_text(spec_path, tiling=TWO_LEVEL, dtype=dtype))
    words = np.concatenate([p.table.runs[:, 4] for p in plan.patterns])
    kinds_in_words = {(int(w) >> (2 * b)) & 3 for w in words for b in range(8)}
    assert {0, 1} <= kinds_in_words  # mixed tiles with BOUNDARY and EMPTY compute blocks
    q, k, v = mixed_inputs(plan, dtype, seed=zlib.crc32(spec_path.stem.encode()) + 1, heads=2)
    head_pattern = np.arange(2) % len(plan.patterns)
    out = module.attention(q, k, v, head_pattern=head_pattern, interpret=POISONED)
    check_per_head(plan, out, q, k, v, head_pattern, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tiling", [None, TWO_LEVEL], ids=["one_level", "two_level"])
def test_v5e_kernel_sums_rows_across_lanes(tiling, dtype, compile_text):
    """On v5e (128-wide MXUs) head_dim 128 takes the row sum across lanes, not from [V | 1]:
    the module says so, and its outputs match the float64 reference on every pattern."""
    text = scaled_spec_text(REPO / "specs" / "wan21_720p_mixed.yaml", tiling=tiling, dtype=dtype)
    plan, module = compile_text(text, target_name="v5e")
    assert module.MXU_WIDTH == 128 and not module.SHAPE.row_sum_on_mxu
    q, k, v = mixed_inputs(plan, dtype, seed=5, heads=2)
    head_pattern = np.arange(2) % len(plan.patterns)
    out = module.attention(q, k, v, head_pattern=head_pattern, interpret=POISONED)
    check_per_head(plan, out, q, k, v, head_pattern, dtype)


@pytest.mark.parametrize(
    "head_dim,mxu_width,on_mxu",
    [
        (128, 256, True),
        (384, 256, True),
        (64, 256, False),
        (256, 256, False),
        (128, 128, False),
        (64, 128, False),
        (256, 128, False),
    ],
)
def test_row_sum_on_the_mxu_only_where_a_pass_has_room(head_dim, mxu_width, on_mxu):
    assert row_sum_on_mxu(head_dim, mxu_width) is on_mxu
    shape = KernelShape(1024, 1024, 512, 512, head_dim, 1, mxu_width=mxu_width)
    assert shape.row_sum_on_mxu is on_mxu
    assert shape.acc_width == head_dim + (128 if on_mxu else 0)


# Four anchor frames and a window of three: runs of many tiles.
LONG_RUNS = any_of("{first_frame: {frames: 4}}", "{spatial_window: {frames: 3}}")


def test_two_level_tiles_with_multi_tile_pieces(compile_text):
    text = spec_text(
        "long_runs_two_level",
        (12, 4, 32),
        2,
        head_dim=64,
        mask=LONG_RUNS,
        tiling="{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}",
    )
    plan, module = compile_text(text, smem_budget=140)
    assert plan.tables.slots > 1 and plan.tables.blocks is not None
    run_and_compare(plan, module, "float32", seed=12)


def test_pieces_longer_than_one_tile(compile_text):
    """A tight SMEM budget cuts runs into multi-tile pieces with skipped slots: same result."""
    text = spec_text("long_runs", (12, 4, 32), 2, mask=LONG_RUNS)
    plan, module = compile_text(text, smem_budget=200)
    assert plan.tables.slots > 1 and plan.grid_steps > plan.table.visited_steps
    run_and_compare(plan, module, "float32", seed=11)


BLOCK_CAUSAL = spec_text(
    "block_causal_text",
    (7, 4, 20, 30, "TEXT"),
    2,
    head_dim=64,
    patterns={
        "chunks": any_of("{block_causal: {frames: 3}}", "{text: {}}"),
        "anchored": any_of("{block_causal: {frames: 2}}", ANCHOR, "{text: {}}"),
    },
    layouts={"anchored": "temporal_major"},
    assign="[chunks, anchored]",
)


@pytest.mark.parametrize("text", ["first", "last"])
def test_block_causal_with_text_tokens(text, compile_text):
    """Chunks of 3 frames (the last one short) frame-major, chunks of 2 with an anchor frame
    temporal-major, text attending and attended globally: the kernel against the oracle."""
    plan, module = compile_text(BLOCK_CAUSAL.replace("TEXT", text))
    assert all(p.tile_counts()["boundary"] > 0 for p in plan.patterns)
    assert plan.patterns[0].tile_counts()["empty"] > 0  # later chunks' keys skipped
    q, k, v = mixed_inputs(plan, "float32", seed=21, heads=2)
    out = module.attention(q, k, v, interpret=POISONED)
    check_per_head(plan, out, q, k, v, module.HEAD_PATTERN, "float32")


def test_the_interpreter_poisons_what_a_kernel_leaves_unwritten():
    """What every kernel test relies on (kernel_helpers.POISONED): in the interpreter, an
    output block the kernel never writes, its scratch before the first write, and the part of
    an input block past the array's end are NaN, never zeros or stale values."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from kernel_helpers import POISONED

    def kernel(x_ref, o_ref, seen_ref, scratch_ref):
        i = pl.program_id(0)

        @pl.when(i == 0)
        def _():  # block 0 of o: the sum of the input block with the untouched scratch
            o_ref[...] = x_ref[...] + scratch_ref[...]

        @pl.when(i == 1)  # block 1 of o: never written; seen: the last input block as read
        def _():
            seen_ref[...] = x_ref[...]

    x = jnp.ones((12, 128), jnp.float32)  # two blocks of 8 rows: the second reaches past 12
    out, seen = pl.pallas_call(
        kernel,
        grid=(2,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=[
            pl.BlockSpec((8, 128), lambda i: (i, 0)),
            pl.BlockSpec((8, 128), lambda i: (0, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((16, 128), jnp.float32),
            jax.ShapeDtypeStruct((8, 128), jnp.float32),
        ],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32)],
        interpret=POISONED,
    )(x)
    out, seen = np.asarray(out), np.asarray(seen)
    assert np.all(np.isnan(out))  # block 0 read the NaN scratch; block 1 never written
    assert np.all(seen[:4] == 1.0) and np.all(np.isnan(seen[4:]))  # rows 12-15: past x
