"""KV-cache chunks (`runtime: {kv_cache: {chunk_frames: C}}`, svgen.runtime.chunks): each
chunk position's compile-time tables against brute force, every chunk position's call
against a float64 dense reference built from the same mask (NaN-poisoned interpret mode),
the chunks against the full-sequence call, one compile for every offset, and the errors of
bad input and bad specs."""

from __future__ import annotations

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (
    REPO,
    TOLERANCE,
    brute_force_kinds,
    compile_spec_text,
    dense_keep,
    lower_mask_dict,
    random_mask,
    run_on_cpu_devices,
    run_svgen,
)
from kernel_helpers import POISONED
from kv_cache_helpers import ONE_LEVEL, TWO_LEVEL, TWO_PATTERNS, chunk_spec
from svgen import ir
from svgen.analysis.chunks import chunk_runs, runs_of_position
from svgen.spec.errors import SpecError
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.runtime.reference import masked_attention_reference
from svgen.core.tables import compute_block_kinds
from svgen.spec import Tiling, parse_spec

SPEC = chunk_spec("kv_chunks", 6, 1, "{chunk_frames: 2}")
# 160 tokens a frame: a chunk of 2 frames is 320 rows, so chunks start at 0, 320, 640, none
# of them a multiple of the 128-row q tiles.


def chunk_keep(plan, pattern: int, position: int) -> np.ndarray:
    """keep[chunk row, key] of one chunk position, from the IR oracle (the compiled mask,
    block-causality over the chunks included)."""
    p = plan.patterns[pattern]
    rows = plan.spec.runtime.chunk_frames * p.layout.tokens_per_frame
    return dense_keep(p.mask, p.layout)[position * rows : (position + 1) * rows]


def check_chunk_tables(mask, layout: TokenLayout, tiling: Tiling, chunk_frames: int) -> None:
    """Every chunk position's compute-block kinds, read back from its runs, equal brute force
    on the chunk's rows (the kv compute block holding padding keys runs masked: FULL there
    is BOUNDARY, as for the full sequence)."""
    runs = chunk_runs(mask, layout, tiling, chunk_frames)
    keep = dense_keep(mask, layout)
    rows, seq = chunk_frames * layout.tokens_per_frame, layout.seq_len
    rq, rk = tiling.block_q // tiling.cq, tiling.block_kv // tiling.ckv
    q_tiles, kv_tiles = -(-rows // tiling.block_q), -(-seq // tiling.block_kv)
    for position in range(layout.frames // chunk_frames):
        want = brute_force_kinds(
            keep[position * rows : (position + 1) * rows], tiling.cq, tiling.ckv
        )
        if seq % tiling.ckv:
            last = want[:, -1]
            last[last == TileKind.FULL] = TileKind.BOUNDARY
        got = compute_block_kinds(runs_of_position(runs, position), q_tiles, kv_tiles, rq, rk)
        np.testing.assert_array_equal(
            got[: want.shape[0], : want.shape[1]], want, err_msg=f"chunk {position}"
        )
        steps = runs_of_position(runs, position)
        assert set(steps[:, 0].tolist()) == set(range(q_tiles))  # every q tile has a step


@pytest.mark.parametrize("seed", range(12))
def test_chunk_tables_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    frames = int(rng.choice([4, 6, 8]))
    chunk = int(rng.choice([c for c in (1, 2, 3, 4) if frames % c == 0]))
    layout = TokenLayout(frames, int(rng.integers(2, 9)), int(rng.integers(3, 21)))
    cq, ckv = int(rng.choice([64, 128])), 128
    tiling = Tiling(cq * int(rng.choice([1, 2])), ckv * int(rng.choice([1, 2])), cq, ckv)
    _, lowered = lower_mask_dict(random_mask(rng, layout), layout, 128, 128)
    mask = ir.simplify(ir.AllOf((lowered, ir.BlockCausal(chunk))))
    check_chunk_tables(mask, layout, tiling, chunk)


def inputs(rng, lead, seq, d, dtype):
    return tuple(
        jnp.asarray(rng.standard_normal(lead + (seq, d)), jnp.dtype(dtype)) for _ in range(3)
    )


@pytest.mark.parametrize("dtype, tiling", [("float32", TWO_LEVEL), ("bfloat16", ONE_LEVEL)])
def test_every_chunk_position_against_float64(dtype, tiling, tmp_path):
    plan, module = compile_spec_text(SPEC % dict(dtype=dtype, tiling=tiling), tmp_path)
    rng = np.random.default_rng(1)
    seq, rows = plan.layout.seq_len, module.attention.kv_cache.rows
    q, k, v = inputs(rng, (2, 2), seq, 64, dtype)  # [batch, heads, seq, d]
    keep = dense_keep(plan.patterns[0].mask, plan.layout)
    full = masked_attention_reference(q, k, v, keep)
    for position in range(3):
        chunk = q[:, :, position * rows : (position + 1) * rows]
        out = module.attention(chunk, k, v, q_frame_offset=2 * position, interpret=POISONED)
        assert out.shape == chunk.shape and out.dtype == chunk.dtype
        want = full[:, :, position * rows : (position + 1) * rows]
        err = np.max(np.abs(np.asarray(out, np.float64) - want))
        assert err <= TOLERANCE[dtype], (position, err)


def test_chunks_equal_the_full_sequence_call(tmp_path):
    """Chunk by chunk, the rows of the full-sequence call (whose mask is block-causal over
    the chunks too); keys after the chunk are never read where the mask would keep them."""
    plan, module = compile_spec_text(SPEC % dict(dtype="float32", tiling=TWO_LEVEL), tmp_path)
    rng = np.random.default_rng(2)
    q, k, v = inputs(rng, (2,), plan.layout.seq_len, 64, "float32")
    full = np.asarray(module.attention(q, k, v, interpret=POISONED))
    rows = module.attention.kv_cache.rows
    for position in range(3):
        # The cache holds only what was generated so far: later frames are garbage.
        end = (position + 1) * rows
        k_cache = k.at[:, end:].set(1e4)
        v_cache = v.at[:, end:].set(1e4)
        out = module.attention(
            q[:, position * rows : end],
            k_cache,
            v_cache,
            q_frame_offset=2 * position,
            interpret=POISONED,
        )
        np.testing.assert_allclose(np.asarray(out), full[:, position * rows : end], atol=2e-6)


def test_two_patterns_with_a_traced_head_pattern(tmp_path):
    plan, module = compile_spec_text(TWO_PATTERNS, tmp_path)
    rng = np.random.default_rng(3)
    seq, rows = plan.layout.seq_len, module.attention.kv_cache.rows
    q, k, v = inputs(rng, (3,), seq, 64, "float32")
    hp = jnp.asarray([1, 0, 1], jnp.int32)
    call = jax.jit(
        lambda q, k, v, hp, f: module.attention(
            q, k, v, head_pattern=hp, q_frame_offset=f, interpret=POISONED
        )
    )
    keeps = [dense_keep(p.mask, p.layout) for p in plan.patterns]
    for position in range(2):
        out = np.asarray(
            call(q[:, position * rows : (position + 1) * rows], k, v, hp, jnp.int32(3 * position))
        )
        for head, pattern in enumerate([1, 0, 1]):
            want = masked_attention_reference(q[head], k[head], v[head], keeps[pattern])
            np.testing.assert_allclose(
                out[head], want[position * rows : (position + 1) * rows], atol=TOLERANCE["float32"]
            )
    # A traced pattern index that is none: that head's rows NaN, the others untouched.
    bad = np.asarray(call(q[:, :rows], k, v, jnp.asarray([1, 5, 1], jnp.int32), jnp.int32(0)))
    assert np.isnan(bad[1]).all() and not np.isnan(bad[[0, 2]]).any()


def test_one_compile_for_every_offset_and_nan_for_no_chunk_start(tmp_path):
    plan, module = compile_spec_text(SPEC % dict(dtype="float32", tiling=ONE_LEVEL), tmp_path)
    rng = np.random.default_rng(4)
    rows = module.attention.kv_cache.rows
    q, k, v = inputs(rng, (2,), plan.layout.seq_len, 64, "float32")
    call = jax.jit(
        lambda q, k, v, f: module.attention(q, k, v, q_frame_offset=f, interpret=POISONED)
    )
    for offset in (0, 2, 4):
        out = call(q[:, offset // 2 * rows : (offset // 2 + 1) * rows], k, v, jnp.int32(offset))
        assert np.isfinite(np.asarray(out)).all()
    for offset in (1, -2, 6, 100):  # not a chunk start: NaN rows, never another chunk's
        assert np.isnan(np.asarray(call(q[:, :rows], k, v, jnp.int32(offset)))).all()
    assert call._cache_size() == 1


def test_vmap_over_a_batch(tmp_path):
    plan, module = compile_spec_text(SPEC % dict(dtype="float32", tiling=ONE_LEVEL), tmp_path)
    rng = np.random.default_rng(5)
    rows = module.attention.kv_cache.rows
    q, k, v = inputs(rng, (3, 2), plan.layout.seq_len, 64, "float32")
    chunk = q[:, :, rows : 2 * rows]

    def one(q, k, v):
        return module.attention(q, k, v, q_frame_offset=2, interpret=POISONED)

    mapped = jax.jit(jax.vmap(one))(chunk, k, v)
    batched = one(chunk, k, v)
    np.testing.assert_allclose(np.asarray(mapped), np.asarray(batched), atol=1e-6)

    # Each element its own chunk position (and one offset that is no chunk start).
    offsets = jnp.asarray([4, 0, 3], jnp.int32)
    chunks = jnp.stack(
        [q[i, :, o // 2 * rows : (o // 2 + 1) * rows] for i, o in enumerate([4, 0, 0])]
    )
    own = jax.jit(
        jax.vmap(lambda q, k, v, f: module.attention(q, k, v, q_frame_offset=f, interpret=POISONED))
    )(chunks, k, v, offsets)
    for i, position in enumerate([2, 0]):
        want = module.attention(
            chunks[i], k[i], v[i], q_frame_offset=2 * position, interpret=POISONED
        )
        np.testing.assert_allclose(np.asarray(own[i]), np.asarray(want), atol=1e-6)
    assert np.isnan(np.asarray(own[2])).all()


def test_bad_chunked_calls_are_refused(tmp_path):
    plan, module = compile_spec_text(SPEC % dict(dtype="float32", tiling=ONE_LEVEL), tmp_path)
    seq, rows = plan.layout.seq_len, module.attention.kv_cache.rows
    chunk, cache = jnp.zeros((2, rows, 64)), jnp.zeros((2, seq, 64))
    with pytest.raises(
        ValueError, match=r"q must be \[heads, 320, 64\] or \[batch, heads, 320, 64\]"
    ):
        module.attention(cache, cache, cache, q_frame_offset=0)
    with pytest.raises(ValueError, match=r"k must be the cache of the whole video, \[2, 960, 64\]"):
        module.attention(chunk, chunk, cache, q_frame_offset=0)
    with pytest.raises(ValueError, match=r"a multiple of 2 .* in 0 \.\. 4, got 3"):
        module.attention(chunk, cache, cache, q_frame_offset=3)
    with pytest.raises(ValueError, match=r"in 0 \.\. 4, got 6"):
        module.attention(chunk, cache, cache, q_frame_offset=6)
    with pytest.raises(TypeError, match="q_frame_offset must be an integer"):
        module.attention(chunk, cache, cache, q_frame_offset=2.0)
    with pytest.raises(TypeError, match="q_frame_offset must be an integer"):
        module.attention(chunk, cache, cache, q_frame_offset=True)
    with pytest.raises(ValueError, match="q_frame_offset must be a scalar"):
        module.attention(chunk, cache, cache, q_frame_offset=np.zeros(2, np.int32))
    with pytest.raises(TypeError, match="dtypes differ"):
        module.attention(chunk, cache.astype(jnp.bfloat16), cache, q_frame_offset=0)
    static_plan, static = compile_spec_text(
        (SPEC % dict(dtype="float32", tiling=ONE_LEVEL)).replace(
            "runtime: {kv_cache: {chunk_frames: 2}}", ""
        ),
        tmp_path / "static",
    )
    with pytest.raises(TypeError, match=r"compiled without `runtime: {kv_cache"):
        static.attention(chunk, cache, cache, q_frame_offset=0)
    assert "q_frame_offset" not in inspect.signature(static.attention).parameters


# Run-time inputs a chunked call has no path for (the spec reader refuses them beside
# kv_cache): each was once dropped silently, the output equal to the call without it.
UNUSED_BY_A_CHUNK = [
    ("segment_ids", lambda seq: np.full(seq, -1, np.int32), "segments"),  # all padding
    ("segment_ids", lambda seq: np.zeros(5, np.float64), "segments"),  # wrong dtype, shape
    ("text_lengths", lambda seq: np.int32(-7), "text_lengths"),
]


@pytest.mark.parametrize("name, make, key", UNUSED_BY_A_CHUNK, ids=["padding", "f64", "text"])
def test_a_chunked_call_refuses_run_time_inputs_as_the_full_call_does(tmp_path, name, make, key):
    """A chunked call given segment ids or text lengths refuses them with the words of the
    module's full-sequence call, concrete offset or traced, on TPU and on GPU."""
    text = SPEC % dict(dtype="float32", tiling=ONE_LEVEL)
    plan, module = compile_spec_text(text, tmp_path)
    _, gpu = compile_spec_text(text, tmp_path / "gpu", target_name="h100")
    seq, rows = plan.layout.seq_len, module.attention.kv_cache.rows
    chunk, cache = jnp.zeros((2, rows, 64)), jnp.zeros((2, seq, 64))
    given = {name: make(seq)}
    with pytest.raises(TypeError) as full:
        module.attention(cache, cache, cache, interpret=True, **given)
    assert f"compiled without `runtime: {{{key}: true}}`" in str(full.value)
    calls = [
        lambda: module.attention(chunk, cache, cache, q_frame_offset=2, interpret=True, **given),
        lambda: jax.jit(
            lambda f: module.attention(
                chunk, cache, cache, q_frame_offset=f, interpret=True, **given
            )
        )(jnp.int32(2)),
        lambda: gpu.attention(chunk, cache, cache, q_frame_offset=2, interpret=True, **given),
    ]
    for call in calls:
        with pytest.raises(TypeError) as chunked:
            call()
        assert str(chunked.value) == str(full.value)


def test_a_chunked_module_with_inputs_it_cannot_use_is_refused(tmp_path):
    """A module built by hand with kv_cache beside run-time segments or a selection (the
    spec reader refuses both pairs) would drop them in every chunked call: refused."""
    from svgen.runtime import kernel, segments
    from svgen.runtime import select as sel

    _, module = compile_spec_text(SPEC % dict(dtype="float32", tiling=ONE_LEVEL), tmp_path)
    parts = dict(
        shape=module.SHAPE,
        patterns=module._PATTERNS,
        slots=module.SLOTS_PER_PIECE,
        default_head_pattern=module.HEAD_PATTERN,
        kv_cache=module.attention.kv_cache,
    )
    policy = sel.SelectPolicy(sel.TOP_K, 1, 0, 1)
    selection = sel.Selection(
        policy, module.SHAPE, module.STEP_RUNS, module.STEP_RUNS, module.SLOTS_PER_PIECE
    )
    for extra in (
        dict(runtime=segments.RuntimeInputs(segments=True)),
        dict(runtime=segments.RuntimeInputs(text_lengths=True)),
        dict(select=selection),
    ):
        with pytest.raises(ValueError, match="a chunked call takes no run-time segments"):
            kernel.make_attention(**extra, **parts)


def test_help_shows_the_chunked_call(tmp_path):
    plan, module = compile_spec_text(SPEC % dict(dtype="float32", tiling=ONE_LEVEL), tmp_path)
    assert "q_frame_offset" in inspect.signature(module.attention).parameters
    doc = module.attention.__doc__
    assert "q_frame_offset: int32 [] (may be traced), a multiple of 2 in 0 .. 4" in doc
    assert "[heads, 320, 64]" in doc and "jax.grad gives dq of the chunk" in doc
    assert "q_frame_offset" in module.__doc__


BASE = """
svgen: 1
name: kv_bad
geometry: %(geometry)s
attention: {heads: 1, head_dim: 64, dtype: float32}
layout: %(layout)s
mask: {spatial_window: {frames: 1}}
tiling: %(tiling)s
runtime: %(runtime)s
"""


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(runtime="{kv_cache: {chunk_frames: 4}}"),
            "runtime.kv_cache.chunk_frames: must divide geometry.frames (6)",
        ),
        (
            dict(runtime="{kv_cache: {chunk_frames: 0}}"),
            "runtime.kv_cache.chunk_frames: must be a positive integer",
        ),
        (dict(runtime="{kv_cache: {chunk_frames: 7}}"), "must be at most 6 (geometry.frames)"),
        (dict(runtime="{kv_cache: {}}"), "runtime.kv_cache: missing required key 'chunk_frames'"),
        (dict(runtime="{kv_cache: {chunk_frames: 2, rolling: 3}}"), "unknown key 'rolling'"),
        (dict(runtime="{kv_cache: 2}"), "runtime.kv_cache: must be a mapping {chunk_frames: C}"),
        (
            dict(runtime="{segments: true, kv_cache: {chunk_frames: 2}}"),
            "runtime.segments: cannot be combined with kv_cache yet",
        ),
        (
            dict(geometry="{frames: 6, height: 4, width: 4, text_tokens: 8}"),
            "runtime.kv_cache: needs a video-only geometry",
        ),
        (dict(layout="temporal_major"), "needs frame_major layouts, but layout is temporal_major"),
        (
            dict(layout="{tiled: {frames: 2, rows: 2, cols: 2}}"),
            "needs frame_major layouts, but layout is tiled 2x2x2",
        ),
        (
            dict(tiling="{block_q: 128, block_kv: 128, align: balanced}"),
            "needs tiling.align: exact (got balanced)",
        ),
        (
            dict(
                geometry="{frames: 60, height: 45, width: 79}",
                tiling="{block_q: 1024, block_kv: 1024}",
                runtime="{kv_cache: {chunk_frames: 3}}",
            ),
            "chunks of 10,665 tokens start 1 row(s) apart from the compute_q of 1024 (their "
            "gcd): classifying every chunk position takes 44,579,700 block pairs, more than "
            "16,777,216 (MAX_TILE_PAIRS)",
        ),
    ],
)
def test_bad_kv_cache_sections_are_refused(changes, message):
    values = dict(
        geometry="{frames: 6, height: 4, width: 4}",
        layout="frame_major",
        tiling="{block_q: 128, block_kv: 128}",
        runtime="{kv_cache: {chunk_frames: 2}}",
    )
    values.update(changes)
    with pytest.raises(SpecError, match=re.escape(message)) as err:
        parse_spec(BASE % values, source="bad.yaml")
    assert str(err.value).startswith("bad.yaml:")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_gpu_module_runs_every_chunk_position(dtype, tmp_path):
    """The GPU module (Pallas Triton, interpret mode) of a kv_cache spec: the full sequence
    and every chunk position against float64, a traced offset (one compile; NaN for no chunk
    start), and vmap with an offset per element."""
    plan, module = compile_spec_text(
        SPEC % dict(dtype=dtype, tiling=ONE_LEVEL), tmp_path, target_name="h100"
    )
    assert plan.chunk_runs
    rng = np.random.default_rng(8)
    seq, rows = plan.layout.seq_len, module.attention.kv_cache.rows
    q, k, v = inputs(rng, (2,), seq, 64, dtype)
    full = masked_attention_reference(q, k, v, dense_keep(plan.patterns[0].mask, plan.layout))
    out = module.attention(q, k, v, interpret=True)
    assert np.max(np.abs(np.asarray(out, np.float64) - full)) <= TOLERANCE[dtype]
    call = jax.jit(lambda q, k, v, f: module.attention(q, k, v, q_frame_offset=f, interpret=True))
    for position in range(3):
        span = slice(position * rows, (position + 1) * rows)
        out = call(q[:, span], k, v, jnp.int32(2 * position))
        assert np.max(np.abs(np.asarray(out, np.float64) - full[:, span])) <= TOLERANCE[dtype]
    assert np.isnan(np.asarray(call(q[:, :rows], k, v, jnp.int32(1)), np.float32)).all()
    assert call._cache_size() == 1
    mapped = jax.jit(jax.vmap(call))(
        jnp.stack([q[:, rows : 2 * rows]] * 2),
        jnp.stack([k, k]),
        jnp.stack([v, v]),
        jnp.asarray([2, 3], jnp.int32),
    )
    assert (
        np.max(np.abs(np.asarray(mapped[0], np.float64) - full[:, rows : 2 * rows]))
        <= TOLERANCE[dtype]
    )
    assert np.isnan(np.asarray(mapped[1], np.float32)).all()


def test_kv_cache_changes_the_digest_and_the_mask():
    text = BASE % dict(
        geometry="{frames: 6, height: 4, width: 4}",
        layout="frame_major",
        tiling="{block_q: 128, block_kv: 128}",
        runtime="{kv_cache: {chunk_frames: 2}}",
    )
    chunked = parse_spec(text)
    static = parse_spec(text.replace("runtime: {kv_cache: {chunk_frames: 2}}", "runtime: {}"))
    assert chunked.digest != static.digest
    assert parse_spec(text.replace("chunk_frames: 2", "chunk_frames: 3")).digest != chunked.digest
    assert "block-causal over chunks of 2" in ir.lower(chunked).describe()
    assert "block-causal" not in ir.lower(static).describe()


def test_the_gpu_chunked_call_lowers_to_valid_triton_ir(tmp_path):
    """Lowered for CUDA (no device needed), bf16, a traced offset: one Triton kernel, its
    module verified."""
    from gpu_helpers import verified_triton_module

    plan, module = compile_spec_text(
        SPEC % dict(dtype="bfloat16", tiling=ONE_LEVEL), tmp_path, target_name="h100"
    )
    rows = module.attention.kv_cache.rows
    chunk = jax.ShapeDtypeStruct((2, rows, 64), jnp.bfloat16)
    cache = jax.ShapeDtypeStruct((2, plan.layout.seq_len, 64), jnp.bfloat16)
    text = verified_triton_module(
        lambda q, k, v, f: module.attention(q, k, v, q_frame_offset=f),
        chunk,
        cache,
        cache,
        jax.ShapeDtypeStruct((), jnp.int32),
    )
    assert "scf.for" in text


SHARDED = """
    from helpers import compile_spec_text
    from kv_cache_helpers import TWO_PATTERNS

    text = TWO_PATTERNS.replace("heads: 3,", "heads: 4,")
    plan, module = compile_spec_text(text, pathlib.Path(tempfile.mkdtemp()))
    rng = np.random.default_rng(0)
    seq, rows = plan.layout.seq_len, module.attention.kv_cache.rows
    q = jnp.asarray(rng.standard_normal((4, rows, 64)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((4, seq, 64)), jnp.float32) for _ in range(2))
    hp = jnp.asarray([0, 1, 1, 0], jnp.int32)
    offset = jnp.int32(3)

    def call(q, k, v, hp, f):
        return module.attention(q, k, v, head_pattern=hp, q_frame_offset=f, interpret=True)

    expected = np.asarray(call(q, k, v, hp, offset))
    mesh = Mesh(np.array(jax.devices()), ("x",))
    heads = P("x", None, None)
    sharded = jax.jit(jax.shard_map(call, mesh=mesh,
        in_specs=(heads, heads, heads, P("x"), P()), out_specs=heads, check_vma=False))
    got = np.asarray(sharded(q, k, v, hp, offset))
    assert np.max(np.abs(got - expected)) <= 1e-6, np.max(np.abs(got - expected))
    grad = jax.jit(jax.grad(lambda k: jnp.sum(sharded(q, k, v, hp, offset))))(k)
    want = jax.jit(jax.grad(lambda k: jnp.sum(call(q, k, v, hp, offset))))(k)
    assert np.max(np.abs(np.asarray(grad) - np.asarray(want))) <= 1e-5
    print("OK")
"""


def test_heads_sharded_with_shard_map():
    """Chunked calls inside shard_map over heads (2 virtual CPU devices), forward and dk."""
    run_on_cpu_devices(SHARDED, 2)


def test_chunk_classification_over_the_work_limit_is_a_located_error(monkeypatch):
    """The chunk positions' classification runs under the analysis's work budgets; going
    over them ends in an error at runtime.kv_cache, not in minutes of work."""
    from svgen import analysis
    from svgen.spec.limits import PRODUCT_WORK, WorkOverLimit

    def over(*args, **kwargs):
        raise WorkOverLimit(PRODUCT_WORK, 1 << 40)

    monkeypatch.setattr(analysis.chunks, "chunk_runs", over)
    text = BASE % dict(
        geometry="{frames: 6, height: 4, width: 4}",
        layout="frame_major",
        tiling="{block_q: 128, block_kv: 128}",
        runtime="{kv_cache: {chunk_frames: 2}}",
    )
    with pytest.raises(
        SpecError, match=r"w\.yaml:9:\d+: runtime\.kv_cache: classifying every chunk"
    ):
        analysis.analyze(parse_spec(text, source="w.yaml"))


def test_compile_summary_names_the_chunk_steps(tmp_path):
    spec = str(REPO / "specs" / "self_forcing_chunks.yaml")
    # (--no-size-check: the program count is test_program_size's; this is the summary's words)
    result = run_svgen("compile", "--out", str(tmp_path / "out"), "--no-size-check", spec)
    assert result.returncode == 0, result.stderr
    assert (
        "KV-cache chunks of 3 frame(s) against a contiguous cache of the whole video: grid "
        "steps per head by chunk position 15, 25, 35, 50, 51, 51, 49"
    ) in result.stderr
