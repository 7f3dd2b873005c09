"""Run-time segments and text lengths (a spec's `runtime:` section, svgen.runtime.segments):
the kernels against a float64 dense reference built by brute force from the same run-time
data (NaN-poisoned interpret mode), the call's tables against the compile-time ones, one
compile for every run-time value, vmap / grad / shard_map, and the errors of bad input."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import TOLERANCE, compile_spec_text, run_on_cpu_devices, user_order_keep
from kernel_helpers import POISONED, reference_grads
from segment_helpers import TWO_PATTERNS, check_element_grads, random_segment_ids, spec_text
from svgen.spec.errors import SpecError
from svgen.runtime import backward
from svgen.runtime.reference import masked_attention_reference
from svgen.runtime.segments import user_order_ids
from svgen.spec import parse_spec


ONE_PATTERN = """
svgen: 1
name: runtime_one
geometry: %(geometry)s
attention: {heads: 2, head_dim: 64, dtype: %(dtype)s}
layout: %(layout)s
mask:
  any_of:
    - spatial_window: {frames: 1}
    - first_frame: {}
    - text: {}
tiling: {block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}
runtime: {segments: true, text_lengths: true}
"""


LAYOUTS = [
    "frame_major",
    "temporal_major",
    "{tiled: {frames: 2, rows: 3, cols: 7}}",
    "{curve: hilbert}",
]


def random_text_lengths(rng, batch: int, text_tokens: int) -> np.ndarray:
    choices = [0, text_tokens, int(rng.integers(1, text_tokens))]
    return np.array([choices[b % 3] for b in range(batch)], np.int32)


def call_keep(pattern_keep, layout, segment_ids, text_lengths) -> np.ndarray:
    """The brute-force mask of one batch element (user order): the pattern's, same segment,
    no padding token on either side."""
    seq = layout.seq_len
    ids = np.zeros(seq, np.int64) if segment_ids is None else np.asarray(segment_ids, np.int64)
    padding = ids < 0
    if text_lengths is not None:
        text = np.arange(seq) - layout.text_start
        padding |= (text >= 0) & (text < layout.text_tokens) & (text >= int(text_lengths))
    same = (ids[:, None] == ids[None, :]) & ~padding[:, None] & ~padding[None, :]
    return pattern_keep & same


def inputs(rng, batch, heads, seq, d, dtype):
    q, k, v = (rng.standard_normal((batch, heads, seq, d)).astype(np.float32) for _ in range(3))
    if dtype == "bfloat16":
        q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    return q, k, v


def check_outputs(plan, out, q, k, v, head_pattern, segment_ids, text_lengths, dtype):
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite output rows"
    q64, k64, v64 = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (q, k, v))
    keeps = [user_order_keep(p) for p in plan.patterns]
    for b in range(out.shape[0]):
        ids = None if segment_ids is None else segment_ids[b]
        length = None if text_lengths is None else text_lengths[b]
        for h, pattern in enumerate(np.asarray(head_pattern).tolist()):
            keep = call_keep(keeps[pattern], plan.layout, ids, length)
            ref = masked_attention_reference(q64[b, h], k64[b, h], v64[b, h], keep)
            err = np.max(np.abs(out[b, h] - ref)) / max(np.max(np.abs(ref)), 1e-30)
            assert err <= TOLERANCE[dtype], f"element {b}, head {h}: error {err:.2e}"
            assert np.all(out[b, h][~keep.any(axis=1)] == 0.0), "a row with no key is not 0"


def check_traced_calls(plan, module, rng, qkv, head_pattern, interpret):
    """float32 q, k, v with a head_pattern, segment ids and text lengths traced under jit:
    two draws of the run-time data (from ``rng``) against float64, one compile for both.
    Returns the last segment ids and text lengths."""
    batch, seq = qkv[0].shape[0], plan.layout.seq_len
    run = jax.jit(
        lambda q, k, v, hp, s, t: module.attention(
            q, k, v, head_pattern=hp, segment_ids=s, text_lengths=t, interpret=interpret
        )
    )
    for _ in range(2):
        ids = np.stack([random_segment_ids(rng, seq) for _ in range(batch)])
        lengths = random_text_lengths(rng, batch, plan.layout.text_tokens)
        out = run(*qkv, head_pattern, ids, lengths)
        check_outputs(plan, out, *qkv, np.asarray(head_pattern), ids, lengths, "float32")
    assert run._cache_size() == 1
    return ids, lengths


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["frame_major", "temporal_major", "tiled", "curve"])
def test_one_pattern_against_float64(layout, dtype, tmp_path):
    plan, module = compile_spec_text(spec_text(ONE_PATTERN, layout=layout, dtype=dtype), tmp_path)
    rng = np.random.default_rng(abs(hash((layout, dtype))) % 2**32)
    seq, batch = plan.layout.seq_len, 3
    q, k, v = inputs(rng, batch, 2, seq, 64, dtype)
    ids = np.stack([random_segment_ids(rng, seq) for _ in range(batch)])
    lengths = random_text_lengths(rng, batch, plan.layout.text_tokens)
    run = jax.jit(
        lambda q, k, v, s, t: module.attention(
            q, k, v, segment_ids=s, text_lengths=t, interpret=POISONED
        )
    )
    out = run(q, k, v, ids, lengths)
    check_outputs(plan, out, q, k, v, [0, 0], ids, lengths, dtype)
    # Other run-time data, the same compiled function.
    ids2 = np.stack([random_segment_ids(rng, seq) for _ in range(batch)])
    out2 = run(q, k, v, ids2, lengths[::-1].copy())
    check_outputs(plan, out2, q, k, v, [0, 0], ids2, lengths[::-1], dtype)
    assert run._cache_size() == 1


@pytest.mark.parametrize("text_position", ["first", "last"])
def test_two_patterns_with_traced_head_pattern(text_position, tmp_path):
    plan, module = compile_spec_text(spec_text(TWO_PATTERNS, text_position=text_position), tmp_path)
    rng = np.random.default_rng(3 if text_position == "first" else 4)
    seq, batch = plan.layout.seq_len, 2
    q, k, v = inputs(rng, batch, 3, seq, 64, "float32")
    head_pattern = jnp.asarray([1, 0, 1], jnp.int32)
    check_traced_calls(plan, module, rng, (q, k, v), head_pattern, POISONED)


def test_segments_alone_text_lengths_alone_and_unbatched(tmp_path):
    plan, module = compile_spec_text(spec_text(ONE_PATTERN), tmp_path)
    rng = np.random.default_rng(11)
    seq = plan.layout.seq_len
    q, k, v = inputs(rng, 1, 2, seq, 64, "float32")
    ids = random_segment_ids(rng, seq)
    out = module.attention(q[0], k[0], v[0], segment_ids=ids, interpret=POISONED)
    check_outputs(plan, out[None], q, k, v, [0, 0], ids[None], None, "float32")
    length = np.int32(13)
    out = module.attention(q, k, v, text_lengths=length, interpret=POISONED)
    check_outputs(plan, out, q, k, v, [0, 0], None, length[None], "float32")
    # No run-time input: the static tables, the static kernel.
    static = module.attention(q, k, v, interpret=POISONED)
    check_outputs(plan, static, q, k, v, [0, 0], None, None, "float32")


@pytest.mark.parametrize("fused", [True, False], ids=["fused_dq", "dq_kernel"])
def test_gradients_against_float64(fused, tmp_path, monkeypatch):
    monkeypatch.setattr(backward, "FUSED_DQ", fused)
    plan, module = compile_spec_text(spec_text(TWO_PATTERNS), tmp_path)
    rng = np.random.default_rng(5)
    seq, batch = plan.layout.seq_len, 2
    q, k, v = inputs(rng, batch, 3, seq, 64, "float32")
    do = rng.standard_normal(q.shape).astype(np.float32)
    head_pattern = np.array([0, 1, 1], np.int32)
    ids = np.stack([random_segment_ids(rng, seq) for _ in range(batch)])
    lengths = random_text_lengths(rng, batch, plan.layout.text_tokens)

    def loss(q, k, v, s, t):
        out = module.attention(
            q, k, v, head_pattern=head_pattern, segment_ids=s, text_lengths=t, interpret=POISONED
        )
        return jnp.sum(out * do)

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, ids, lengths)
    keeps = [user_order_keep(p) for p in plan.patterns]
    for b in range(batch):
        per_pattern = [call_keep(kp, plan.layout, ids[b], lengths[b]) for kp in keeps]
        want = reference_grads(plan, q[b], k[b], v[b], head_pattern, do[b], keeps=per_pattern)
        check_element_grads(got, want, b)


def test_vmap_over_a_batch_equals_the_batched_call(tmp_path):
    plan, module = compile_spec_text(spec_text(ONE_PATTERN), tmp_path)
    rng = np.random.default_rng(6)
    seq, batch = plan.layout.seq_len, 3
    q, k, v = inputs(rng, batch, 2, seq, 64, "float32")
    ids = np.stack([random_segment_ids(rng, seq) for _ in range(batch)])
    lengths = random_text_lengths(rng, batch, plan.layout.text_tokens)

    def one(q, k, v, s, t):
        return module.attention(q, k, v, segment_ids=s, text_lengths=t, interpret=POISONED)

    mapped = jax.jit(jax.vmap(one))(q, k, v, ids, lengths)
    check_outputs(plan, mapped, q, k, v, [0, 0], ids, lengths, "float32")
    batched = jax.jit(one)(q, k, v, ids, lengths)
    np.testing.assert_allclose(np.asarray(mapped), np.asarray(batched), atol=1e-6)


def test_one_segment_gives_the_compile_time_tables(tmp_path):
    """The tables a call builds on device, for data that remove nothing, equal the compiler's
    (forward and the dk/dv walk's transposed ones): the compile-time analysis is the oracle."""
    from svgen.runtime import segments
    from svgen.core.tables import transposed_tables

    plan, module = compile_spec_text(spec_text(ONE_PATTERN, layout="temporal_major"), tmp_path)
    pattern = module._PATTERNS[0]
    layouts = [pattern.layout]
    ids = segments.user_order_ids(np.zeros(plan.layout.seq_len, np.int32), None, 1, layouts[0])
    call_ids = segments.CallIds(*(segments.layout_order_ids(x, layouts) for x in ids))
    hp = jnp.zeros(2, jnp.int32)
    static = module.attention.tables
    for transposed in (False, True):
        expected = transposed_tables([pattern.runs], module.SHAPE, 2) if transposed else static
        tables = segments.SegmentTables.build(
            [pattern.runs], (0,), module.SHAPE, expected.slots, transposed
        ).tables(call_ids, hp)
        n = int(expected.num_pieces[0])
        np.testing.assert_array_equal(tables.row_num_pieces, [n, n])
        np.testing.assert_array_equal(tables.entries[:n], expected.entries)
        for got, want in ((tables.lengths, expected.lengths), (tables.blocks, expected.blocks)):
            assert (got is None) == (want is None)
            if want is not None:
                np.testing.assert_array_equal(got[:n], want)
        assert int(tables.steps) == n


def test_traced_text_lengths_outside_the_range_are_clamped(tmp_path):
    plan, module = compile_spec_text(spec_text(ONE_PATTERN), tmp_path)
    rng = np.random.default_rng(8)
    q, k, v = inputs(rng, 2, 2, plan.layout.seq_len, 64, "float32")
    run = jax.jit(lambda t: module.attention(q, k, v, text_lengths=t, interpret=POISONED))
    out = run(jnp.asarray([-7, 10**6], jnp.int32))
    check_outputs(plan, out, q, k, v, [0, 0], None, np.array([0, 40]), "float32")


def test_ids_built_in_the_users_order():
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(frames=1, height=2, width=2, text_tokens=3, text_position="first")
    q_ids, k_ids = user_order_ids(
        jnp.asarray([5, -3, 5, 5, 6, 6, 6], jnp.int32), jnp.asarray([2], jnp.int32), 1, lay
    )
    np.testing.assert_array_equal(q_ids, [[5, -1, -1, 5, 6, 6, 6]])
    np.testing.assert_array_equal(k_ids, [[5, -2, -2, 5, 6, 6, 6]])


def test_bad_run_time_inputs_are_refused(tmp_path):
    plan, module = compile_spec_text(spec_text(ONE_PATTERN), tmp_path)
    seq = plan.layout.seq_len
    q = jnp.zeros((2, 2, seq, 64), jnp.float32)
    good = np.zeros((2, seq), np.int32)
    with pytest.raises(TypeError, match="segment_ids must be int32, got int64"):
        module.attention(q, q, q, segment_ids=good.astype(np.int64))
    with pytest.raises(ValueError, match=rf"segment_ids must have shape \[{seq}\] or \[2, {seq}\]"):
        module.attention(q, q, q, segment_ids=good[:, :-1])
    with pytest.raises(ValueError, match=r"segment_ids must have shape"):
        module.attention(q, q, q, segment_ids=np.zeros((3, seq), np.int32))
    with pytest.raises(TypeError, match="text_lengths must be int32"):
        module.attention(q, q, q, text_lengths=5)
    with pytest.raises(ValueError, match=r"text_lengths must lie in 0 \.\. 40"):
        module.attention(q, q, q, text_lengths=np.array([3, 41], np.int32))
    with pytest.raises(ValueError, match=r"text_lengths must have shape \[\] or \[2\]"):
        module.attention(q, q, q, text_lengths=np.zeros(3, np.int32))

    static_plan, static_module = compile_spec_text(
        spec_text(ONE_PATTERN).replace("runtime: {segments: true, text_lengths: true}", ""),
        tmp_path / "static",
    )
    with pytest.raises(TypeError, match="compiled without `runtime: {segments: true}`"):
        static_module.attention(q, q, q, segment_ids=good)
    with pytest.raises(TypeError, match="compiled without `runtime: {text_lengths: true}`"):
        static_module.attention(q, q, q, text_lengths=np.int32(3))


@pytest.mark.parametrize(
    "section, message",
    [
        ("runtime: {segments: yes please}", "runtime.segments: must be true or false"),
        ("runtime: {segment: true}", "unknown key 'segment'; allowed keys: segments, text_lengths"),
        ("runtime: [segments]", "runtime: must be a mapping"),
    ],
)
def test_bad_runtime_sections_are_refused(section, message):
    text = spec_text(ONE_PATTERN).replace("runtime: {segments: true, text_lengths: true}", section)
    with pytest.raises(SpecError, match=message):
        parse_spec(text)


def test_text_lengths_need_text_tokens():
    text = spec_text(ONE_PATTERN).replace("text_tokens: 40", "text_tokens: 0")
    text = text.replace("    - text: {}\n", "")
    with pytest.raises(SpecError, match=r"runtime.text_lengths: needs text tokens") as err:
        parse_spec(text, source="spec.yaml")
    assert str(err.value).startswith("spec.yaml:12:")  # the value, with its line


def test_the_runtime_section_changes_the_digest_only_when_given():
    with_section = parse_spec(spec_text(ONE_PATTERN))
    without = parse_spec(
        spec_text(ONE_PATTERN).replace("runtime: {segments: true, text_lengths: true}", "")
    )
    declared_false = parse_spec(
        spec_text(ONE_PATTERN).replace(
            "runtime: {segments: true, text_lengths: true}",
            "runtime: {segments: false}",
        )
    )
    assert with_section.digest != without.digest
    assert declared_false.digest == without.digest


SHARDED = """
    from helpers import compile_spec_text
    from segment_helpers import TWO_PATTERNS, packed_ids, random_segment_ids, spec_text

    text = spec_text(TWO_PATTERNS).replace("heads: 3,", "heads: 4,")
    if {per_video!r}:  # each video numbers its frames from its own first
        text = text.replace("text_lengths: true}}", "text_lengths: true, per_video_frames: true}}")
    plan, module = compile_spec_text(text, pathlib.Path(tempfile.mkdtemp()))
    assert bool(plan.video_frames) == {per_video!r}
    rng = np.random.default_rng(0)
    seq = plan.layout.seq_len
    q, k, v = (jnp.asarray(rng.standard_normal((2, 4, seq, 64)), jnp.float32) for _ in range(3))
    hp = jnp.asarray([0, 1, 1, 0], jnp.int32)
    if {per_video!r}:
        ids = jnp.asarray(np.stack([packed_ids(rng, plan.layout) for _ in range(2)]))
    else:
        ids = jnp.asarray(np.stack([random_segment_ids(rng, seq) for _ in range(2)]))
    lengths = jnp.asarray([3, 40], jnp.int32)

    def call(q, k, v, hp, s, t):
        return module.attention(q, k, v, head_pattern=hp, segment_ids=s, text_lengths=t,
                                interpret=True)

    expected = np.asarray(call(q, k, v, hp, ids, lengths))
    mesh = Mesh(np.array(jax.devices()), ("x",))
    heads = P(None, "x", None, None)
    sharded = jax.jit(jax.shard_map(call, mesh=mesh,
        in_specs=(heads, heads, heads, P("x"), P(), P()), out_specs=heads, check_vma=False))
    got = np.asarray(sharded(q, k, v, hp, ids, lengths))
    print("max diff", np.max(np.abs(got - expected)))
    assert np.max(np.abs(got - expected)) <= 1e-6
    grad = jax.grad(lambda q: jnp.sum(sharded(q, k, v, hp, ids, lengths)))(q)
    want = jax.grad(lambda q: jnp.sum(call(q, k, v, hp, ids, lengths)))(q)
    assert np.max(np.abs(np.asarray(grad) - np.asarray(want))) <= 1e-5
    print("OK")
"""


def test_heads_sharded_with_shard_map():
    """With per-video frame numbering, the call with the most run-time inputs (ids, lengths
    and frame shifts; sequence numbering's call is the same call less the shifts, checked
    unsharded above)."""
    run_on_cpu_devices(SHARDED, 4, per_video=True)


def test_the_cost_model_knows_the_run_time_kind():
    from svgen.estimate import cost
    from svgen.runtime import refine
    from svgen.core.kinds import TileKind

    assert cost.SEGMENT_BOUNDARY == refine.SEGMENT_BOUNDARY
    assert refine.SEGMENT_BOUNDARY not in {int(k) for k in TileKind}  # no static table has it


@pytest.mark.parametrize("template", ["one", "two"])
def test_gpu_module_with_run_time_inputs(template, tmp_path):
    """`svgen compile --target h100` of a spec with a `runtime:` section: the GPU forward
    takes the same inputs (interpret mode, NaN past the operands' ends), against float64,
    one compile for every run-time value; and its Triton IR verifies for CUDA."""
    from gpu_helpers import verified_triton_lowering

    text = spec_text(ONE_PATTERN if template == "one" else TWO_PATTERNS, layout="temporal_major")
    plan, module = compile_spec_text(text, tmp_path, target_name="h100")
    assert plan.backend == "gpu"
    rng = np.random.default_rng(21 if template == "one" else 22)
    seq, batch, heads = plan.layout.seq_len, 2, module.HEADS
    q, k, v = inputs(rng, batch, heads, seq, 64, "float32")
    head_pattern = jnp.asarray(np.arange(heads) % len(plan.patterns), jnp.int32)
    ids, lengths = check_traced_calls(plan, module, rng, (q, k, v), head_pattern, True)

    def with_ids(q, k, v, head_pattern):
        return module.attention(
            q, k, v, head_pattern=head_pattern, segment_ids=jnp.asarray(ids), text_lengths=3
        )

    with pytest.raises(TypeError, match="text_lengths must be int32"):
        verified_triton_lowering(with_ids, q, np.asarray(head_pattern))

    def lowered(q, k, v, head_pattern):
        return module.attention(
            q,
            k,
            v,
            head_pattern=head_pattern,
            segment_ids=jnp.asarray(ids),
            text_lengths=jnp.asarray(lengths),
        )

    ir = verified_triton_lowering(lowered, q, np.asarray(head_pattern))
    assert "tt.load" in ir


def test_packed_segment_ids():
    from svgen.core.layout import TokenLayout
    from svgen.runtime.segments import packed_segment_ids

    lay = TokenLayout(frames=3, height=1, width=2, text_tokens=4, text_position="first")
    np.testing.assert_array_equal(
        packed_segment_ids(lay, [(1, 1, 2), (1, 2, 2)]), [0, -1, 1, 1, 0, 0, 1, 1, -1, -1]
    )
    with pytest.raises(ValueError, match="video 1 .* does not fit"):
        packed_segment_ids(lay, [(2, 1, 2), (2, 1, 2)])
