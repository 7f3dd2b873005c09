"""The GPU (Pallas Triton) forward kernel of svgen.runtime.gpu, on the CPU.

Kernels run in Pallas's interpreter (`interpret=True`: no CUDA needed), which pads every
operand with NaN past its end and starts outputs as NaN, so an unmasked read past the
sequence or an unwritten output row fails the float64 comparison. Separately, every kernel
is lowered for CUDA down to Triton IR (jaxlib's Triton dialect, no GPU and no CUDA plugin)
and the IR is verified: what the interpreter accepts but Triton would not (a primitive
without a Triton rule, a mistyped op) fails here.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from backend_helpers import record_kernel_variants
from gpu_helpers import verified_triton_lowering
from svgen.runtime import gpu
from svgen.core.kinds import TileKind
from svgen.runtime.reference import masked_attention_reference
from svgen.core.tables import compute_block_kinds

from helpers import (
    REPO,
    MASK_SPECS,
    MIXED_SPECS,
    TWO_LEVEL,
    brute_force_kinds,
    dense_keep,
    import_file,
    mask_spec_text,
    random_layout,
    random_mask,
    scaled_spec_text,
    user_order_keep,
)
from kernel_helpers import check_per_head, mixed_inputs


def spec(name: str):
    return REPO / "specs" / f"{name}.yaml"


def run_traced(attention, q, k, v, head_pattern):
    """The GPU attention under jit with a traced head_pattern, in interpret mode."""
    run = jax.jit(lambda q, k, v, hp: attention(q, k, v, head_pattern=hp, interpret=True))
    return run(q, k, v, jnp.asarray(head_pattern, jnp.int32))


def compute_blocks(module):
    """The kinds of the compute blocks of a module's first pattern, read back from its runs."""
    shape = module.SHAPE
    return compute_block_kinds(
        module._PATTERNS[0].runs,
        -(-shape.seq_len // shape.block_q),
        -(-shape.seq_len // shape.block_kv),
        shape.q_blocks_per_tile,
        shape.kv_blocks_per_tile,
    )


def check_batched(plan, out, q, k, v, head_pattern, dtype):
    for b in range(q.shape[0]):
        check_per_head(plan, out[b], q[b], k[b], v[b], head_pattern, dtype)


# -- numerics in interpret mode ---------------------------------------------------------------


@pytest.mark.parametrize("name", MIXED_SPECS)
def test_mixed_heads_bfloat16_with_batch(name, compile_text):
    """Frame-major and temporal-major heads in one call, text none / first / last, bf16,
    [batch, heads, seq, d]."""
    plan, module = compile_text(scaled_spec_text(spec(name), heads=4, dtype="bfloat16"))
    assert [p.layout.order for p in plan.patterns] == ["frame_major", "temporal_major"]
    attention = gpu.gpu_attention_of(module, block_q=128, block_kv=64)
    q, k, v = mixed_inputs(plan, "bfloat16", seed=len(name), heads=4)
    q, k, v = (jnp.stack([x, x[::-1]]) for x in (q, k, v))  # batch 2, heads permuted
    head_pattern = [1, 0, 0, 1]
    out = run_traced(attention, q, k, v, head_pattern)
    assert out.shape == q.shape and out.dtype == jnp.bfloat16
    check_batched(plan, out, q, k, v, head_pattern, "bfloat16")


def test_float16_and_static_head_pattern(compile_text):
    """float16 operands (the spec says float32: dtype=None accepts any), a NumPy
    head_pattern, sm_scale given."""
    plan, module = compile_text(scaled_spec_text(spec("wan21_720p_mixed"), heads=2))
    attention = gpu.make_gpu_attention(module._PATTERNS, module.SHAPE, dtype=None)
    q, k, v = (jnp.asarray(x, jnp.float16) for x in mixed_inputs(plan, "float32", 4, heads=2))
    head_pattern = np.asarray([1, 0])
    out = attention(q, k, v, head_pattern=head_pattern, interpret=True, sm_scale=0.05)
    assert out.dtype == jnp.float16
    out64 = np.asarray(out, np.float64)
    assert np.all(np.isfinite(out64))
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    for head, pattern in enumerate(head_pattern.tolist()):
        keep = user_order_keep(plan.patterns[pattern])
        ref = masked_attention_reference(q64[head], k64[head], v64[head], keep, sm_scale=0.05)
        err = np.max(np.abs(out64[head] - ref)) / np.max(np.abs(ref))
        assert err <= 5e-3, f"head {head}: {err:.2e}"


@pytest.mark.parametrize(
    "name, tiling, block_q, block_kv",
    [
        ("cogvideox_mixed", TWO_LEVEL, 32, 128),  # text first; compute 128 x 128
        ("hunyuan_720p_mixed", TWO_LEVEL, 128, 32),  # text last
        (
            "hunyuan_720p_text",
            {"block_q": 512, "block_kv": 512, "compute_q": 256, "compute_kv": 256},
            128,
            128,
        ),
        ("wan21_720p_frame_decay", None, 16, 16),  # the smallest tile tl.dot takes
    ],
)
def test_gpu_tiles_dividing_compute_blocks(name, tiling, block_q, block_kv, compile_text):
    plan, module = compile_text(scaled_spec_text(spec(name), tiling=tiling))
    attention = gpu.gpu_attention_of(module, block_q=block_q, block_kv=block_kv)
    q, k, v = mixed_inputs(plan, "float32", seed=block_q + block_kv, heads=2)
    head_pattern = np.arange(2) % len(plan.patterns)
    check_per_head(
        plan, run_traced(attention, q, k, v, head_pattern), q, k, v, head_pattern, "float32"
    )


def test_full_tile_past_the_end_masks_padding_keys():
    """Hand-made tables with a FULL compute block holding padding keys (the compiler makes
    such blocks BOUNDARY; the kernel must not rely on it): its padding keys are still never
    attended, and its mask is never evaluated (this one would keep nothing)."""
    from svgen.core.tables import Pattern
    from svgen.core.layout import TokenLayout
    from svgen.core.tables import KernelShape

    lay = TokenLayout(frames=1, height=1, width=200)
    shape = KernelShape(
        seq_len=200, padded_seq_len=256, block_q=128, block_kv=128, head_dim=32, heads=1
    )
    runs = ((0, 0, 2, TileKind.FULL, 0), (1, 0, 2, TileKind.FULL, 0))
    never = Pattern("all", runs, lay, lambda q, k: k.pos < 0)
    attention = gpu.make_gpu_attention([never], shape, default_head_pattern=[0])
    assert np.all(attention.tables.kinds(0) == TileKind.FULL)
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 200, 32)).astype(np.float32) for _ in range(3))
    out = np.asarray(attention(q, k, v, interpret=True))
    ref = masked_attention_reference(q, k, v, np.ones((200, 200), bool))
    assert np.max(np.abs(out - ref)) / np.max(np.abs(ref)) <= 1e-5


@pytest.mark.parametrize("seed", range(4))
def test_random_masks(seed, compile_text):
    """Random masks on random layouts (text first or last, temporal-major anchors, tiny
    sequences shorter than one tile) against the dense oracle; their kernels lower too."""
    rng = np.random.default_rng(1000 + seed)
    lay = random_layout(rng)
    plan, module = compile_text(mask_spec_text(random_mask(rng, lay), lay, name="random_gpu"))
    attention = gpu.gpu_attention_of(module)
    q, k, v = mixed_inputs(plan, "float32", seed=seed, heads=1)
    check_per_head(plan, attention(q, k, v, interpret=True), q, k, v, [0], "float32")
    verified_triton_lowering(attention, q, [0])


# -- generated GPU modules (svgen compile --target h100) ---------------------------------------


def with_gpu(text: str, **gpu_section) -> str:
    spec = yaml.safe_load(text)
    spec["gpu"] = gpu_section
    return yaml.safe_dump(spec, sort_keys=False)


@pytest.mark.parametrize("spec_path", MASK_SPECS, ids=lambda p: p.stem)
def test_generated_module_of_every_shipped_spec(spec_path, compile_text):
    """What `svgen compile --target h100` writes, scaled down: classified at the GPU tiles
    (64 x 64 by default: every GPU tile its own exact kind), traced head_pattern, NaN-poisoned
    inputs past the end (interpret mode), against float64."""
    plan, module = compile_text(scaled_spec_text(spec_path), target_name="h100")
    assert plan.backend == "gpu" and module.TARGET == "h100"
    assert (module.BLOCK_Q, module.GPU_BLOCK_Q) == (64, 64)
    keeps = [user_order_keep(p) for p in plan.patterns]
    for index, p in enumerate(plan.patterns):  # exact per GPU tile, as brute force finds them
        kernel_keep = dense_keep(p.mask, p.layout)
        assert np.array_equal(
            module.attention.tables.kinds(index), brute_force_kinds(kernel_keep, 64, 64)
        )
        assert (p.kinds == TileKind.BOUNDARY).any() or not keeps[index].any()
    q, k, v = mixed_inputs(plan, "float32", seed=zlib.crc32(spec_path.stem.encode()), heads=2)
    head_pattern = np.arange(2) % len(plan.patterns)
    out = run_traced(module.attention, q, k, v, head_pattern)
    check_per_head(plan, out, q, k, v, head_pattern, "float32")


@pytest.mark.parametrize("seed", range(6))
def test_generated_modules_of_random_specs(seed, compile_text):
    """Random masks, layouts (frame- and temporal-major, text first or last, sizes that do
    not divide the tiles) and GPU tiles; bf16 on odd seeds."""
    rng = np.random.default_rng(3000 + seed)
    lay = random_layout(rng)
    dtype = "bfloat16" if seed % 2 else "float32"
    block_q, block_kv = (int(rng.choice([16, 32, 64, 128])) for _ in range(2))
    text = mask_spec_text(random_mask(rng, lay), lay, name="random_gpu_module")
    text = text.replace("dtype: float32", f"dtype: {dtype}")
    text = with_gpu(text, block_q=block_q, block_kv=block_kv, num_warps=4, num_stages=2)
    plan, module = compile_text(text, target_name="h200")
    keep = dense_keep(plan.mask, plan.layout)
    assert np.array_equal(
        module.attention.tables.kinds(0), brute_force_kinds(keep, block_q, block_kv)
    )
    q, k, v = mixed_inputs(plan, dtype, seed=seed, heads=1)
    out = module.attention(q, k, v, interpret=True)
    if keep.any():
        check_per_head(plan, out, q, k, v, [0], dtype)
    else:  # a mask that keeps nothing: every row is 0 (never NaN)
        assert np.all(np.asarray(out, np.float32) == 0.0)


def test_generated_module_classifies_coarser_past_the_tile_pair_limit(compile_text, monkeypatch):
    """Where the GPU tiles' grid would exceed MAX_TILE_PAIRS, the plan classifies at a
    power-of-two multiple of them and each GPU tile inherits its block's kind: still exact."""
    from svgen import analysis

    monkeypatch.setattr(analysis, "MAX_TILE_PAIRS", 40)  # 9 x 9 tiles of 64 would be 81
    plan, module = compile_text(scaled_spec_text(spec("wan21_720p_band")), target_name="h100")
    assert (module.BLOCK_Q, module.BLOCK_KV, module.GPU_BLOCK_Q) == (128, 128, 64)
    assert "Classified at 128 x 128 tiles" in module.__doc__
    q, k, v = mixed_inputs(plan, "float32", seed=5, heads=2)
    check_per_head(plan, run_traced(module.attention, q, k, v, [0, 0]), q, k, v, [0, 0], "float32")


def test_gpu_modules_are_deterministic_and_leave_tpu_modules_alone(tmp_path):
    """Rendering twice gives the same bytes; a GPU module is <name>_gpu.py, and the TPU
    module of the same spec is what it was."""
    from svgen import codegen
    from svgen.analysis import analyze
    from svgen.spec import load_spec

    spec_file = spec("hunyuan_720p_mixed")
    plans = [analyze(load_spec(spec_file), target_name="h100") for _ in range(2)]
    first, second = (codegen.render(p, "specs/hunyuan_720p_mixed.yaml") for p in plans)
    assert first == second
    assert sorted(first) == [
        "hunyuan_720p_mixed_gpu.py",
        "hunyuan_720p_mixed_gpu_spatial_tables.npy",
        "hunyuan_720p_mixed_gpu_temporal_tables.npy",
    ]
    tpu = codegen.render(analyze(load_spec(spec_file)), "specs/hunyuan_720p_mixed.yaml")
    assert tpu == {
        "hunyuan_720p_mixed.py": (REPO / "generated" / "hunyuan_720p_mixed.py").read_bytes()
    }


# -- tables -----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_gpu_tile_kinds_are_sound(seed, compile_text):
    """A GPU tile said EMPTY keeps no pair, one said FULL keeps every real pair (from the
    brute-force oracle); and every tile has its compute block's kind."""
    rng = np.random.default_rng(2000 + seed)
    lay = random_layout(rng)
    tiling = {"block_q": 256, "block_kv": 256, "compute_q": 128, "compute_kv": 128}
    plan, module = compile_text(
        mask_spec_text(random_mask(rng, lay), lay, name="random_kinds", tiling=tiling)
    )
    shape = module.SHAPE
    keep = dense_keep(plan.mask, plan.layout)  # kernel order
    for bq, bkv in ((32, 64), (64, 64), (128, 16)):
        kinds = gpu.GpuTables.from_runs([module._PATTERNS[0].runs], shape, bq, bkv).kinds(0)
        truth = brute_force_kinds(keep, bq, bkv)
        assert kinds.shape == truth.shape
        assert np.all(truth[kinds == TileKind.EMPTY] == TileKind.EMPTY)
        assert np.all(truth[kinds == TileKind.FULL] == TileKind.FULL)
        blocks = compute_blocks(module)
        rows = np.arange(kinds.shape[0]) * bq // 128
        cols = np.arange(kinds.shape[1]) * bkv // 128
        assert np.array_equal(kinds, blocks[np.ix_(rows, cols)])


def test_tables_of_a_shipped_module_are_csr():
    """The full-size Wan mixed module: rows in q-tile order, kv tiles increasing in a row,
    one copy per pattern, the visited fraction that of its compute blocks."""
    module = import_file(REPO / "generated" / "wan21_720p_mixed.py")

    tables = gpu.GpuTables.from_runs([p.runs for p in module._PATTERNS], module.SHAPE, 128, 64)
    assert tables.num_q_tiles == -(-module.SEQ_LEN // 128)
    assert tables.row_offsets.shape == (2 * tables.num_q_tiles + 1,)
    assert tables.row_offsets[0] == 0 and np.all(np.diff(tables.row_offsets) >= 0)
    for r in range(len(tables.row_offsets) - 1):
        row = tables.entries[tables.row_offsets[r] : tables.row_offsets[r + 1]] >> 2
        assert np.all(np.diff(row) > 0)
    kinds = tables.entries[: tables.row_offsets[-1]] & 3
    assert set(np.unique(kinds).tolist()) == {TileKind.BOUNDARY, TileKind.FULL}
    # The TPU module's own compute blocks (read back from its runs), at a finer grain.
    blocks = compute_blocks(module)
    assert tables.visited(0) / (tables.num_q_tiles * tables.num_kv_tiles) == pytest.approx(
        np.mean(blocks != TileKind.EMPTY), abs=2e-3
    )


# -- Triton IR --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("spec_path", MASK_SPECS, ids=lambda p: p.stem)
def test_lowers_to_valid_triton_ir(spec_path, dtype, compile_text):
    plan, module = compile_text(scaled_spec_text(spec_path, dtype=dtype))
    attention = gpu.gpu_attention_of(module, block_q=128, block_kv=64)
    q = jax.ShapeDtypeStruct((2, 2, plan.layout.seq_len, module.HEAD_DIM), jnp.dtype(dtype))
    ir = verified_triton_lowering(attention, q, np.arange(2) % len(plan.patterns))
    assert "scf.for" in ir  # the loop over a q tile's entries
    dots = [line for line in ir.splitlines() if "tt.dot" in line]
    assert len(dots) == 2
    if dtype == "float32":  # Precision.HIGHEST: IEEE dots, not TF32
        assert not any("tf32" in line for line in dots)


def test_lowers_at_full_size():
    """The shipped Wan mixed module as it is (75,600 tokens, 10 heads, bf16)."""
    module = import_file(REPO / "generated" / "wan21_720p_mixed.py")

    attention = gpu.gpu_attention_of(module, block_q=128, block_kv=64)
    q = jax.ShapeDtypeStruct((1, module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.bfloat16)
    verified_triton_lowering(attention, q, np.arange(module.HEADS) % 2)


# -- errors -----------------------------------------------------------------------------------


def test_refusals(compile_text):
    plan, module = compile_text(scaled_spec_text(spec("wan21_720p_mixed"), heads=2))
    with pytest.raises(ValueError, match="power of two"):
        gpu.gpu_attention_of(module, block_q=48)
    with pytest.raises(ValueError, match="divide the compute blocks"):
        gpu.gpu_attention_of(module, block_q=256)
    attention = gpu.gpu_attention_of(module)
    q, k, v = mixed_inputs(plan, "float32", seed=0, heads=2)
    with pytest.raises(ValueError, match="assigned at run time"):
        attention(q, k, v, interpret=True)
    with pytest.raises(TypeError, match="compiled for float32"):
        attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), head_pattern=[0, 1])
    with pytest.raises(ValueError, match="pattern indices"):
        attention(q, k, v, head_pattern=[0, 2], interpret=True)


# -- the kernel declared once (svgen.runtime.gpu_variant) --------------------------------------


def _gpu_variant(module, **fields):
    from svgen.runtime.gpu_variant import GpuVariant

    base = dict(
        patterns=tuple(gpu.gpu_attention_of(module).codes),
        heads=2,
        rows=4,
        seq_len=module.SEQ_LEN,
        q_len=module.SEQ_LEN,
        head_dim=module.HEAD_DIM,
        block_q=64,
        block_kv=64,
        num_q_tiles=-(-module.SEQ_LEN // 64),
        q_scale=0.125,
    )
    return GpuVariant(**{**base, **fields})


def test_gpu_variant_names_operands_and_branches(compile_text):
    _, module = compile_text(scaled_spec_text(spec("wan21_720p_mixed"), heads=2))
    plain = _gpu_variant(module)
    names = [o.name for o in plain.operands()]
    assert names == ["head_pattern", "offsets", "entries", "q", "k", "v", "o"]
    padded = module.SEQ_LEN % 64 != 0
    assert plain.branches() == ("full",) + ("full_padding",) * padded + (
        "boundary[0]",
        "boundary[1]",
    )
    assert plain.first_boundary == 1 + padded
    refs = plain.unpack([f"ref {n}" for n in names])
    assert (refs.q, refs.o, refs.q_ids, refs.chunk) == ("ref q", "ref o", None, None)
    with pytest.raises(ValueError, match="got 6 refs, its variant declares 7"):
        plain.unpack(names[:-1])

    shifted = _gpu_variant(module, tables="segments", frame_shifts=True)
    assert [o.name for o in shifted.operands()][6:] == ["q_ids", "k_ids", "frame_shifts", "o"]
    branches = shifted.branches()
    half = len(branches) // 2
    assert branches[half:] == tuple("segment:" + b for b in branches[:half])
    chunk = _gpu_variant(module, tables="chunk", q_len=128, ring_sink=64)
    assert [o.name for o in chunk.operands()][6:] == ["chunk", "o"]
    assert chunk.chunk_rows == 4 and chunk.per_row == 0
    assert _gpu_variant(module, tables="selection").per_row == 4
    with pytest.raises(ValueError, match="run-time segments only"):
        _gpu_variant(module, frame_shifts=True)
    with pytest.raises(ValueError, match="chunk's call only"):
        _gpu_variant(module, ring_sink=64)


def test_gpu_call_passes_the_kernel_exactly_its_variants_operands(compile_text, monkeypatch):
    plan, module = compile_text(scaled_spec_text(spec("wan21_720p_mixed"), heads=2))
    seen = record_kernel_variants(monkeypatch, gpu, "_attention_kernel")
    attention = gpu.gpu_attention_of(module, block_q=64, block_kv=64)
    q, k, v = mixed_inputs(plan, "float32", seed=3, heads=2)
    out = attention(q, k, v, head_pattern=[1, 0], interpret=True)
    (variant, count), *_ = seen
    assert count == len(variant.operands()) and variant.tables == "static"
    check_per_head(plan, out, q, k, v, [1, 0], "float32")
