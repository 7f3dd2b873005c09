"""Rolling KV caches (`kv_cache: {chunk_frames, sink_frames, window_frames}`): the ring's
slot map on the host and on the device, every chunk position's compile-time tables against
brute force over the cache's physical keys, the evicted-frame refusal against brute force,
every chunk position's call against a float64 dense reference (NaN-poisoned interpret
mode, slots not written yet full of garbage), one compile for every offset, jax.vmap with a
position per element, and the errors of bad calls and bad specs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (
    GRAD_TOLERANCE,
    TOLERANCE,
    brute_force_kinds,
    compile_spec_text,
    dense_keep,
    lower_mask_dict,
    random_mask,
)
from kernel_helpers import POISONED, reference_grads
from kv_cache_helpers import ONE_LEVEL, TWO_LEVEL, chunk_spec
from svgen import ir
from svgen.analysis import analyze
from svgen.analysis.chunks import (
    EvictedFrames,
    chunk_runs,
    ring_runs,
    runs_of_position,
)
from svgen.spec.errors import SpecError
from svgen.runtime.chunks import KvCache, ring_frames
from svgen.core.ring import RingCache
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.runtime.reference import masked_attention_reference
from svgen.core.tables import compute_block_kinds
from svgen.spec import Tiling, canonical_json, parse_spec

SPEC = chunk_spec(
    "ring_chunks", 8, 2, "{chunk_frames: 2, sink_frames: 1, window_frames: %(window)s}"
)
# 160 tokens a frame, a cache of 5 frames (800 keys): the ring wraps inside kv blocks of 128
# and 256, and chunks start at 0, 320, 640, 960, none of them a multiple of the q tiles.


def physical_keep(keep, cache: KvCache, position: int) -> np.ndarray:
    """keep[chunk row, cache slot token] at a chunk position: the video's keep matrix with
    its key columns read through the ring's slot map (the convention, frame by frame)."""
    t, rows = cache.frame_tokens, cache.rows
    video_keys = (ring_frames(cache, position)[:, None] * t + np.arange(t)).ravel()
    return keep[position * rows : (position + 1) * rows][:, video_keys]


def random_ring(rng):
    frames = int(rng.choice([6, 8, 9, 12]))
    chunk = int(rng.choice([c for c in (1, 2, 3) if frames % c == 0]))
    sink = int(rng.integers(0, 3))
    window = int(rng.integers(chunk, frames - sink + 1))
    layout = TokenLayout(frames, int(rng.integers(2, 7)), int(rng.integers(3, 13)))
    cq, ckv = int(rng.choice([32, 64])), int(rng.choice([64, 128]))
    tiling = Tiling(cq * int(rng.choice([1, 2])), ckv * int(rng.choice([1, 2])), cq, ckv)
    _, lowered = lower_mask_dict(random_mask(rng, layout), layout, 128, 128)
    mask = ir.simplify(ir.AllOf((lowered, ir.BlockCausal(chunk))))
    return layout, tiling, mask, RingCache(chunk, sink, window)


def ring_runs_or_eviction(mask, layout, tiling, ring):
    """(runs, None), or (None, (position, frame, need)) where the ring misses a kept frame."""
    try:
        return ring_runs(mask, layout, tiling, ring), None
    except EvictedFrames as evicted:
        return None, (evicted.position, evicted.frame, evicted.need)


@pytest.mark.parametrize("seed", range(60))
def test_ring_tables_and_evictions_against_brute_force(seed):
    """Per chunk position: the frames a mask keeps that the ring no longer holds (the
    compile-time refusal) and, where there are none, every compute block's kind over the
    cache's physical keys, read back from the runs (the block holding padding keys runs
    masked: FULL there is BOUNDARY)."""
    layout, tiling, mask, ring = random_ring(np.random.default_rng(seed))
    keep = dense_keep(mask, layout)
    t, chunk = layout.tokens_per_frame, ring.chunk_frames
    cache = KvCache(chunk, t, layout.frames, (), ring.sink_frames, ring.window_frames)
    missing = []
    for position in range(cache.positions):
        rows = keep[position * cache.rows : (position + 1) * cache.rows]
        kept = set((np.flatnonzero(rows.any(axis=0)) // t).tolist())
        missing += [(position, f) for f in sorted(kept - set(ring_frames(cache, position)))]
    runs, evicted = ring_runs_or_eviction(mask, layout, tiling, ring)
    if missing:
        assert evicted is not None and evicted[:2] == missing[0]
        # The window it asks for holds every frame each chunk keeps.
        need = max(((p + 1) * chunk - f for p, f in missing))
        assert evicted[2] == need
        return
    assert evicted is None
    rq, rk = tiling.block_q // tiling.cq, tiling.block_kv // tiling.ckv
    q_tiles = -(-cache.rows // tiling.block_q)
    kv_tiles = -(-cache.cache_tokens // tiling.block_kv)
    for position in range(cache.positions):
        want = brute_force_kinds(physical_keep(keep, cache, position), tiling.cq, tiling.ckv)
        if cache.cache_tokens % tiling.ckv:
            last = want[:, -1]
            last[last == TileKind.FULL] = TileKind.BOUNDARY
        steps = runs_of_position(runs, position)
        got = compute_block_kinds(steps, q_tiles, kv_tiles, rq, rk)
        np.testing.assert_array_equal(got[: want.shape[0], : want.shape[1]], want)
        assert set(steps[:, 0].tolist()) == set(range(q_tiles))  # every q tile has a step


def test_the_random_rings_reach_both_outcomes():
    """The brute-force test above sees rings that hold every kept frame and rings that
    are refused, and rings that wrap inside a kv block."""
    outcomes = set()
    for seed in range(60):
        layout, tiling, mask, ring = random_ring(np.random.default_rng(seed))
        outcomes.add(ring_runs_or_eviction(mask, layout, tiling, ring)[1] is None)
    assert outcomes == {True, False}


@pytest.mark.parametrize("seed", range(6))
def test_a_ring_that_never_wraps_has_the_contiguous_cache_tables(seed):
    """sink + window = frames: the ring holds the whole video in place, so the rolling
    classification (rows against key runs) and the contiguous one (a finer row grain of the
    full sequence's) must agree run for run."""
    rng = np.random.default_rng(100 + seed)
    layout, tiling, mask, ring = random_ring(rng)
    sink = min(ring.sink_frames, layout.frames - ring.chunk_frames)
    ring = RingCache(ring.chunk_frames, sink, layout.frames - sink)
    np.testing.assert_array_equal(
        ring_runs(mask, layout, tiling, ring),
        chunk_runs(mask, layout, tiling, ring.chunk_frames),
    )


def test_ring_shifts_on_the_device_equal_the_host():
    """The kernel's per-row scalars come from a traced position (lax.div / lax.rem): the
    same numbers as the host's NumPy for every position of several rings."""
    for sink, window, chunk, frames in [(1, 4, 2, 8), (0, 3, 3, 12), (2, 5, 1, 9), (3, 9, 3, 21)]:
        cache = KvCache(chunk, 7, frames, (), sink, window)
        traced = jax.jit(lambda p, cache=cache: jnp.stack(cache.ring_shifts(p, jnp)))
        for position in range(cache.positions):
            host = [int(x) for x in cache.ring_shifts(position)]
            assert np.asarray(traced(jnp.int32(position))).tolist() == host
            frames_held = ring_frames(cache, position)
            newest = (position + 1) * chunk - 1
            # Each slot holds its own frame modulo the ring, never a later one than the
            # chunk's unless nothing was written there yet.
            ring_slots = frames_held[sink:]
            assert all((a - sink) % window == j for j, a in enumerate(ring_slots))
            written = ring_slots[ring_slots <= newest]
            assert sorted(written) == list(range(max(sink, newest - window + 1), newest + 1))


def garbage_cache(x, cache: KvCache, position: int) -> np.ndarray:
    """The cache a generation loop holds at a chunk position: x's frames in their slots,
    slots not written yet full of large garbage."""
    t = cache.frame_tokens
    held = ring_frames(cache, position)
    out = np.asarray(x)[..., (held[:, None] * t + np.arange(t)).ravel(), :].copy()
    unwritten = np.repeat(held > (position + 1) * cache.chunk_frames - 1, t)
    out[..., unwritten, :] = 1e4
    return out


def video_inputs(rng, plan, dtype, lead=(2,)):
    """q, k, v over the whole video, [*lead, seq, 64] drawn from ``rng``, and float64
    attention of them under the spec's mask."""
    shape = (*lead, plan.layout.seq_len, 64)
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.dtype(dtype)) for _ in range(3))
    keep = dense_keep(plan.patterns[0].mask, plan.layout)
    return q, k, v, masked_attention_reference(q, k, v, keep)


def chunk_call(module):
    """The module's chunk call in the interpreter, jitted with the frame offset traced."""
    return jax.jit(lambda q, k, v, f: module.attention(q, k, v, q_frame_offset=f, interpret=True))


@pytest.mark.parametrize("dtype, tiling", [("float32", TWO_LEVEL), ("bfloat16", ONE_LEVEL)])
def test_every_ring_position_against_float64(dtype, tiling, tmp_path):
    plan, module = compile_spec_text(SPEC % dict(dtype=dtype, tiling=tiling, window=4), tmp_path)
    cache = module.attention.kv_cache
    assert cache.rolling and cache.cache_tokens == 5 * 160
    q, k, v, want = video_inputs(np.random.default_rng(3), plan, dtype, lead=(2, 2))
    for position in range(cache.positions):
        rows = slice(position * cache.rows, (position + 1) * cache.rows)
        k_ring, v_ring = (jnp.asarray(garbage_cache(x, cache, position), x.dtype) for x in (k, v))
        out = module.attention(
            q[:, :, rows], k_ring, v_ring, q_frame_offset=2 * position, interpret=POISONED
        )
        assert out.shape == q[:, :, rows].shape and out.dtype == q.dtype
        err = np.max(np.abs(np.asarray(out, np.float64) - want[:, :, rows]))
        assert err <= TOLERANCE[dtype], (position, err)


@pytest.mark.parametrize("dtype, tiling", [("float32", TWO_LEVEL), ("bfloat16", ONE_LEVEL)])
def test_ring_gradients_against_float64(dtype, tiling, tmp_path):
    """jax.grad through every chunk position's call against the rolling cache: dq of the
    chunk and dk, dv of the ring (zero at slots the chunk does not attend, garbage slots
    included), against float64 attention over the ring's keys the mask keeps (the fused
    dk/dv walk over the positions' transposed tables, slots mapped to video keys)."""
    plan, module = compile_spec_text(SPEC % dict(dtype=dtype, tiling=tiling, window=4), tmp_path)
    cache = module.attention.kv_cache
    rng = np.random.default_rng(5)
    q, k, v = (
        jnp.asarray(rng.standard_normal((2, plan.layout.seq_len, 64)), jnp.dtype(dtype))
        for _ in range(3)
    )
    keep = dense_keep(plan.patterns[0].mask, plan.layout)
    do = rng.standard_normal((2, cache.rows, 64)).astype(np.float32)

    def loss(q, k, v, f):
        out = module.attention(q, k, v, q_frame_offset=f, interpret=POISONED)
        return jnp.sum(out.astype(jnp.float32) * do)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    for position in range(cache.positions):
        chunk = q[:, position * cache.rows : (position + 1) * cache.rows]
        ring = [jnp.asarray(garbage_cache(x, cache, position), x.dtype) for x in (k, v)]
        got = grad(chunk, *ring, jnp.int32(2 * position))
        keeps = [physical_keep(keep, cache, position)]
        want = reference_grads(plan, chunk, *ring, np.zeros(2, np.int32), do, keeps=keeps)
        for name, a, b in zip(("dq", "dk", "dv"), got, want):
            a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
            assert np.isfinite(a).all(), (position, name)
            scale = max(1.0, np.max(np.abs(b)))
            err = np.max(np.abs(a - b)) / scale
            assert err <= GRAD_TOLERANCE[dtype], (position, name, err)
    assert grad._cache_size() == 1


def test_one_compile_for_every_ring_position_and_vmap(tmp_path):
    """A traced offset: one compile serves every position (the jit cache), an offset that
    is no chunk start gives NaN; jax.vmap gives each batch element its own position."""
    plan, module = compile_spec_text(
        SPEC % dict(dtype="float32", tiling=TWO_LEVEL, window=4), tmp_path
    )
    cache = module.attention.kv_cache
    q, k, v, want = video_inputs(np.random.default_rng(4), plan, "float32")
    call = chunk_call(module)
    chunks, rings = [], []
    for position in range(cache.positions):
        rows = slice(position * cache.rows, (position + 1) * cache.rows)
        ring = [jnp.asarray(garbage_cache(x, cache, position)) for x in (k, v)]
        out = call(q[:, rows], *ring, jnp.int32(2 * position))
        np.testing.assert_allclose(np.asarray(out), want[:, rows], atol=1e-5)
        chunks.append(q[:, rows])
        rings.append(ring)
    assert call._cache_size() == 1
    assert np.isnan(np.asarray(call(chunks[1], *rings[1], jnp.int32(3)))).all()
    batched = jax.vmap(
        lambda q, k, v, f: module.attention(q, k, v, q_frame_offset=f, interpret=True)
    )
    order = [3, 0, 2]
    out = batched(
        jnp.stack([chunks[p] for p in order]),
        jnp.stack([rings[p][0] for p in order]),
        jnp.stack([rings[p][1] for p in order]),
        jnp.asarray([2 * p for p in order], jnp.int32),
    )
    for i, p in enumerate(order):
        rows = slice(p * cache.rows, (p + 1) * cache.rows)
        np.testing.assert_allclose(np.asarray(out[i]), want[:, rows], atol=1e-5)


def test_bad_ring_calls_are_refused(tmp_path):
    plan, module = compile_spec_text(
        SPEC % dict(dtype="float32", tiling=TWO_LEVEL, window=4), tmp_path
    )
    chunk = jnp.zeros((2, 320, 64), jnp.float32)
    whole = jnp.zeros((2, plan.layout.seq_len, 64), jnp.float32)
    with pytest.raises(ValueError, match=r"k must be the rolling cache, \[2, 800, 64\].*1 sink"):
        module.attention(chunk, whole, whole, q_frame_offset=2, interpret=True)
    ring = jnp.zeros((2, 800, 64), jnp.float32)
    with pytest.raises(ValueError, match="multiple of 2"):
        module.attention(chunk, ring, ring, q_frame_offset=3, interpret=True)
    assert "rolling KV cache of 1 sink" in module.__doc__
    assert "ring of 4" in module.attention.__doc__


@pytest.mark.parametrize(
    "name, value, key",
    [
        ("segment_ids", np.full(8 * 160, -1, np.int32), "segments"),
        ("segment_ids", np.zeros(5, np.float64), "segments"),
        ("text_lengths", np.int32(-7), "text_lengths"),
    ],
    ids=["padding", "f64", "text"],
)
def test_a_ring_call_refuses_run_time_inputs_as_the_full_call_does(tmp_path, name, value, key):
    """Segment ids or text lengths given to a rolling-cache call were once dropped silently:
    refused with the words of the module's full-sequence call, concrete offset or traced."""
    plan, module = compile_spec_text(
        SPEC % dict(dtype="float32", tiling=TWO_LEVEL, window=4), tmp_path
    )
    chunk, ring = jnp.zeros((2, 320, 64), jnp.float32), jnp.zeros((2, 800, 64), jnp.float32)
    whole = jnp.zeros((2, plan.layout.seq_len, 64), jnp.float32)
    with pytest.raises(TypeError) as full:
        module.attention(whole, whole, whole, interpret=True, **{name: value})
    assert f"compiled without `runtime: {{{key}: true}}`" in str(full.value)

    def call(offset):
        given = {name: value}
        return module.attention(chunk, ring, ring, q_frame_offset=offset, interpret=True, **given)

    for run in (lambda: call(2), lambda: jax.jit(call)(jnp.int32(2))):
        with pytest.raises(TypeError) as chunked:
            run()
        assert str(chunked.value) == str(full.value)


@pytest.mark.parametrize(
    "cache, message",
    [
        ("{chunk_frames: 2, sink_frames: 1}", "runtime.kv_cache.sink_frames: needs window_frames"),
        ("{chunk_frames: 2, window_frames: 1}", "at least chunk_frames \\(2\\)"),
        (
            "{chunk_frames: 2, sink_frames: 2, window_frames: 7}",
            "window_frames: must be at most 6 \\(geometry.frames - sink_frames\\)",
        ),
        ("{chunk_frames: 2, sink_frames: 7, window_frames: 2}", "must be at most 6"),
        (
            "{chunk_frames: 2, sink_frames: 1, window_frames: 3}",
            "the chunk at frame 4 keeps frame 2, which a ring of 3 frames \\(after 1 sink "
            "frames\\) has evicted: window_frames must be at least 4",
        ),
    ],
)
def test_bad_rolling_caches_are_refused(cache, message):
    text = SPEC.replace(
        "{chunk_frames: 2, sink_frames: 1, window_frames: %(window)s}", cache
    ) % dict(dtype="float32", tiling=TWO_LEVEL)
    with pytest.raises(SpecError, match=message) as err:
        analyze(parse_spec(text, source="ring.yaml"))
    assert "ring.yaml:" in str(err.value)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_gpu_module_runs_every_ring_position(dtype, tmp_path):
    """The GPU module (Pallas Triton, interpret mode) of a rolling-cache spec: every chunk
    position against float64 (garbage in the unwritten slots), a traced offset (one compile),
    and vmap with a position per element."""
    plan, module = compile_spec_text(
        SPEC % dict(dtype=dtype, tiling=ONE_LEVEL, window=4), tmp_path, target_name="h100"
    )
    cache = module.attention.kv_cache
    assert cache.rolling and "WINDOW_FRAMES = 4" in (tmp_path / "ring_chunks_gpu.py").read_text()
    q, k, v, want = video_inputs(np.random.default_rng(9), plan, dtype)
    call = chunk_call(module)
    chunks, rings = [], []
    for position in range(cache.positions):
        rows = slice(position * cache.rows, (position + 1) * cache.rows)
        ring = [jnp.asarray(garbage_cache(x, cache, position), x.dtype) for x in (k, v)]
        out = call(q[:, rows], *ring, jnp.int32(2 * position))
        err = np.max(np.abs(np.asarray(out, np.float64) - want[:, rows]))
        assert err <= TOLERANCE[dtype], (position, err)
        chunks.append(q[:, rows])
        rings.append(ring)
    assert call._cache_size() == 1
    mapped = jax.jit(jax.vmap(call))(
        jnp.stack([chunks[3], chunks[1]]),
        jnp.stack([rings[3][0], rings[1][0]]),
        jnp.stack([rings[3][1], rings[1][1]]),
        jnp.asarray([6, 2], jnp.int32),
    )
    for i, p in enumerate((3, 1)):
        rows = slice(p * cache.rows, (p + 1) * cache.rows)
        assert np.max(np.abs(np.asarray(mapped[i], np.float64) - want[:, rows])) <= TOLERANCE[dtype]


def test_the_gpu_ring_call_lowers_to_valid_triton_ir(tmp_path):
    """Lowered for CUDA (no device needed), bf16, a traced offset: one Triton kernel, its
    module verified (the slot map's scalar loads included)."""
    from gpu_helpers import verified_triton_module

    plan, module = compile_spec_text(
        SPEC % dict(dtype="bfloat16", tiling=ONE_LEVEL, window=4), tmp_path, target_name="h100"
    )
    cache = module.attention.kv_cache
    chunk = jax.ShapeDtypeStruct((2, cache.rows, 64), jnp.bfloat16)
    ring = jax.ShapeDtypeStruct((2, cache.cache_tokens, 64), jnp.bfloat16)
    verified_triton_module(
        lambda q, k, v, f: module.attention(q, k, v, q_frame_offset=f),
        chunk,
        ring,
        ring,
        jax.ShapeDtypeStruct((), jnp.int32),
    )


def test_the_ring_changes_the_digest_and_a_contiguous_digest_stays():
    base = SPEC % dict(dtype="float32", tiling=TWO_LEVEL, window=4)
    contiguous = base.replace(", sink_frames: 1, window_frames: 4", "")
    digests = {
        parse_spec(t).digest
        for t in (base, base.replace("window_frames: 4", "window_frames: 5"), contiguous)
    }
    assert len(digests) == 3
    assert "window_frames" not in canonical_json(parse_spec(contiguous))
