"""`attention.softmax: bounded`: q tiles whose score bound |q| max|k| is at most BOUND_LIMIT
run without a running max; the others fall back to the online softmax in the same kernel.

Every case runs the kernel in NaN-poisoned interpret mode against float64 attention, and
asserts which mode each q tile took (`attention.softmax_modes`): the fallback where the
bound is unsafe, the bounded path where it is not. The adversarial inputs are the issue's:
norms scaled by 100, one key far above every other, rows whose best score sits far below
their bound, all-equal scores, rows with no key.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svgen.runtime import softmax
from svgen.runtime.reference import masked_attention_reference
from svgen.spec import SpecError, parse_spec

from helpers import TOLERANCE, user_order_keep
from kernel_helpers import POISONED, check_grads, jitted

BASE_SPEC = """\
svgen: 1
name: bounded_small
geometry: {{frames: 4, height: 8, width: 12, text_tokens: {text}}}
attention: {{heads: 2, head_dim: 128, dtype: {dtype}, softmax: bounded}}
layout: {layout}
mask: {mask}
tiling: {{block_q: 128, block_kv: 256, compute_q: 128, compute_kv: 128}}
"""
WINDOW = "{any_of: [{first_frame: {frames: 1}}, {spatial_window: {frames: 1, rows: 2, cols: 3}}]}"
# Rows of frame 0 have no key at all; the others a window: tiles mix empty and kept rows.
NO_KEY_ROWS = '{expr: "f_q >= 1 and abs(f_q - f_k) <= 1 and abs(h_q - h_k) <= 2"}'
SCALE = 1 / np.sqrt(128) * 1.4426950408889634  # sm_scale * log2(e): base-2 score units


def compile_bounded(shared_compile, dtype="float32", layout="frame_major", mask=WINDOW, text=0):
    """The module of one spec, shared by the tests that call it (conftest.shared_compile): its
    kernel is compiled once per dtype and shape, whatever inputs each test gives it."""
    text = BASE_SPEC.format(dtype=dtype, layout=layout, mask=mask, text=text)
    return shared_compile(text)


def check(plan, module, q, k, v, dtype, want_modes, tolerance=None):
    q, k, v = (jnp.asarray(x, dtype) for x in (q, k, v))
    out = np.asarray(jitted(module.attention, interpret=POISONED)(q, k, v).astype(jnp.float32))
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite output rows"
    modes = np.asarray(jitted(module.attention, "softmax_modes", interpret=True)(q, k, v))
    assert np.all(modes == want_modes), modes
    keep = user_order_keep(plan.patterns[0])
    q64, k64, v64 = (np.asarray(x.astype(jnp.float32), np.float64) for x in (q, k, v))
    for head in range(q.shape[0]):
        ref = masked_attention_reference(q64[head], k64[head], v64[head], keep)
        err = np.max(np.abs(out[head] - ref)) / np.max(np.abs(ref))
        assert err <= (tolerance or TOLERANCE[dtype]), f"head {head}: relative error {err:.2e}"
        assert np.all(out[head][~keep.any(axis=1)] == 0.0)  # no key: exactly 0
    return out


def normal(n, seed, heads=2):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((heads, n, 128)).astype(np.float32) for _ in range(3))


def bound_of(q, k):
    """The largest row bound of each head, as the kernel computes it (base-2 units)."""
    qn = np.linalg.norm(q.astype(np.float64), axis=-1) * SCALE
    kn = np.linalg.norm(k.astype(np.float64), axis=-1).max(axis=-1, keepdims=True)
    return (qn * kn).max(axis=-1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["frame_major", "temporal_major"])
def test_random_inputs_take_the_bounded_path(dtype, layout, shared_compile):
    plan, module = compile_bounded(shared_compile, dtype, layout)
    q, k, v = normal(plan.layout.seq_len, seed=1)
    assert np.all(bound_of(q, k) <= softmax.BOUND_LIMIT)  # N(0, 1) at d 128: about 21
    check(plan, module, q, k, v, dtype, want_modes=1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_text_tokens_and_padded_rows(dtype, shared_compile):
    # 400 tokens: the last q tile holds 16 real rows and 112 past the array (garbage in
    # VMEM), which must not push the tile off the bounded path.
    mask = "{any_of: [{first_frame: {frames: 1}}, {spatial_window: {frames: 1}}, {text: {}}]}"
    plan, module = compile_bounded(shared_compile, dtype, mask=mask, text=16)
    assert plan.layout.seq_len % 128 != 0
    q, k, v = normal(plan.layout.seq_len, seed=2)
    check(plan, module, q, k, v, dtype, want_modes=1)


def test_norms_scaled_by_100_fall_back(shared_compile):
    # Scores 10^4 times larger: the f32 QK^T's own rounding (any kernel's) moves outputs by
    # ~1e-4 against float64. The fallback is the online kernel, to the bit.
    plan, module = compile_bounded(shared_compile)
    _, online = shared_compile(
        BASE_SPEC.format(dtype="float32", layout="frame_major", mask=WINDOW, text=0).replace(
            ", softmax: bounded", ""
        )
    )
    q, k, v = normal(plan.layout.seq_len, seed=3)
    q, k = 100 * q, 100 * k
    out = check(plan, module, q, k, v, "float32", want_modes=0, tolerance=1e-3)
    assert np.array_equal(out, np.asarray(jitted(online.attention, interpret=POISONED)(q, k, v)))


def test_bfloat16_past_the_bound_falls_back(shared_compile):
    # bf16 at norms x 100 is past what bf16 q can resolve for any kernel (the online one
    # included): x 2 is past the bound (about 4 x 21) and still resolvable.
    plan, module = compile_bounded(shared_compile, "bfloat16")
    q, k, v = normal(plan.layout.seq_len, seed=4)
    assert np.all(bound_of(2 * q, 2 * k) > softmax.BOUND_LIMIT)
    check(plan, module, 2 * q, 2 * k, v, "bfloat16", want_modes=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_key_far_above_every_other(dtype, shared_compile):
    plan, module = compile_bounded(shared_compile, dtype)
    n = plan.layout.seq_len
    q, k, v = normal(n, seed=5)
    # Key 7 (frame 0: every query keeps it) along the mean query direction: its score is
    # far above every other key's in every row.
    direction = q.mean(axis=1) / np.linalg.norm(q.mean(axis=1), axis=-1, keepdims=True)
    k[:, 7] = 6 * np.sqrt(128) * direction
    out = check(plan, module, q, k, v, dtype, want_modes=0)  # its norm pushes past the bound
    # Within the bound: smaller queries, the same dominant key.
    q_small = 0.25 * q
    assert np.all(bound_of(q_small, k) <= softmax.BOUND_LIMIT)
    check(plan, module, q_small, k, v, dtype, want_modes=1)
    assert out.shape == q.shape


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_best_score_far_below_the_bound(dtype, shared_compile):
    # Every query along u, every key against it: each row's best score is about -R, its
    # bound R just within BOUND_LIMIT: the largest probability is near 2^-(2 R) ~ 2^-78.
    plan, module = compile_bounded(shared_compile, dtype)
    n = plan.layout.seq_len
    rng = np.random.default_rng(6)
    u, a, k = _keys_near_the_limit(rng, n, toward=-1.0)
    q = np.broadcast_to(0.999 * a * u, (2, n, 128)).astype(np.float32)
    _check_near_the_limit(plan, module, q, k, rng, dtype)


def _keys_near_the_limit(rng, n: int, toward: float):
    """(u, a, k): a unit vector u, the norm a with a * a * SCALE = 0.97 * BOUND_LIMIT, and
    keys of norm a along toward * u with 1% noise. Queries of norm 0.999 * a then have a
    bound just within the limit (rounding must not push it past)."""
    u = rng.standard_normal(128)
    u /= np.linalg.norm(u)
    a = np.sqrt(softmax.BOUND_LIMIT * 0.97 / SCALE)
    k = toward * a * u + 1e-2 * rng.standard_normal((2, n, 128))
    return u, a, (k * (a / np.linalg.norm(k, axis=-1, keepdims=True))).astype(np.float32)


def _check_near_the_limit(plan, module, q, k, rng, dtype):
    """Bounded (mode 1) with every head's bound in (0.9, 1] x BOUND_LIMIT, against float64."""
    v = rng.standard_normal(q.shape).astype(np.float32)
    qd, kd = (np.asarray(jnp.asarray(x, dtype).astype(jnp.float32)) for x in (q, k))
    assert np.all(bound_of(qd, kd) <= softmax.BOUND_LIMIT)
    assert np.all(bound_of(qd, kd) > 0.9 * softmax.BOUND_LIMIT)
    check(plan, module, q, k, v, dtype, want_modes=1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_all_equal_scores(dtype, shared_compile):
    plan, module = compile_bounded(shared_compile, dtype)
    n = plan.layout.seq_len
    _, k, v = normal(n, seed=8)
    q = np.zeros_like(k)  # every score 0: each row is the mean of its kept values
    check(plan, module, q, k, v, dtype, want_modes=1)
    k_same = np.broadcast_to(k[:, :1], k.shape).copy()  # every key the same
    q, _, _ = normal(n, seed=9)
    check(plan, module, q, k_same, v, dtype, want_modes=1)


@pytest.mark.parametrize("scale", [1.0, 100.0])
def test_rows_without_keys_are_zero_in_both_modes(scale, shared_compile):
    plan, module = compile_bounded(shared_compile, mask=NO_KEY_ROWS)
    keep = user_order_keep(plan.patterns[0])
    assert not keep[:96].any() and keep[96:].any(axis=1).all()  # frame 0: 96 rows, no key
    q, k, v = normal(plan.layout.seq_len, seed=10)
    check(plan, module, scale * q, scale * k, v, "float32", want_modes=int(scale == 1.0))


def test_a_call_mixes_modes_per_q_tile(shared_compile):
    plan, module = compile_bounded(shared_compile)
    q, k, v = normal(plan.layout.seq_len, seed=11)
    q[:, 128:256] *= 10  # q tile 1 only: past the bound
    check(plan, module, q, k, v, "float32", want_modes=np.array([[1, 0, 1]] * 2))


@pytest.mark.parametrize("scale", [1.0, 20.0])
def test_gradients(scale, shared_compile):
    plan, module = compile_bounded(shared_compile)
    q, k, v = normal(plan.layout.seq_len, seed=12)
    q, k = (x * np.float32(np.sqrt(scale)) for x in (q, k))
    modes = np.asarray(jitted(module.attention, "softmax_modes", interpret=True)(q, k, v))
    assert np.all(modes == int(scale == 1.0))
    check_grads(plan, module, q, k, v, [0, 0], "float32")


def test_jit_and_segments(compile_text):
    text = BASE_SPEC.format(dtype="float32", layout="frame_major", mask=WINDOW, text=0)
    plan, module = compile_text(text + "runtime: {segments: true}\n")
    n = plan.layout.seq_len
    q, k, v = normal(n, seed=13)
    ids = np.repeat(np.arange(3, dtype=np.int32), [100, 150, n - 250])
    call = jax.jit(
        lambda q, k, v, ids: module.attention(q, k, v, segment_ids=ids, interpret=POISONED)
    )
    out = call(q, k, v, ids)
    keep = user_order_keep(plan.patterns[0]) & (ids[:, None] == ids[None, :])
    for head in range(2):
        ref = masked_attention_reference(*(x[head].astype(np.float64) for x in (q, k, v)), keep)
        assert np.max(np.abs(np.asarray(out[head]) - ref)) <= 1e-5 * np.max(np.abs(ref))


def test_softmax_key_in_the_spec():
    text = BASE_SPEC.format(dtype="float32", layout="frame_major", mask=WINDOW, text=0)
    assert parse_spec(text).attention.softmax == "bounded"
    online = parse_spec(text.replace(", softmax: bounded", ""))
    assert online.attention.softmax == "online"
    # Declared only: a spec without the key keeps its digest (generated modules stay valid).
    explicit = parse_spec(text.replace("softmax: bounded", "softmax: online"))
    assert explicit.digest == online.digest != parse_spec(text).digest
    with pytest.raises(SpecError, match=r"test.yaml:4:.*softmax.*online, bounded"):
        parse_spec(text.replace("softmax: bounded", "softmax: fast"), source="test.yaml")


def test_modes_refused_without_the_key(shared_compile):
    text = BASE_SPEC.format(dtype="float32", layout="frame_major", mask=WINDOW, text=0)
    _, module = shared_compile(text.replace(", softmax: bounded", ""))
    with pytest.raises(ValueError, match="compiled without `attention.softmax: bounded`"):
        module.attention.softmax_modes(None, None, None)
    assert not module.SHAPE.bounded_softmax


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_bound_for_rows_of_every_norm(dtype, shared_compile):
    # The bound is the tile's: its largest row's |q| max|k|, subtracted in every row. Row 0
    # of each q tile is long and along the keys (best score ~ +R); the others are short
    # (1e-3 of it) or as long but against the keys (best score ~ -R): exp2(-2 R) ~ 2^-78,
    # the case the limit is set for, beside rows whose scores all sit near 0.
    plan, module = compile_bounded(shared_compile, dtype)
    n = plan.layout.seq_len
    rng = np.random.default_rng(12)
    u, a, k = _keys_near_the_limit(rng, n, toward=1.0)
    sign = np.where(np.arange(n) % 2 == 0, 1e-3, -1.0)
    sign[::128] = 1.0  # one long row along the keys per q tile (block_q 128)
    q = (0.999 * a * sign[None, :, None] * u).astype(np.float32)
    q = np.broadcast_to(q, (2, n, 128)).copy()
    _check_near_the_limit(plan, module, q, k, rng, dtype)


# Heads of two layouts with a static assignment: one kernel call per run of heads of one
# layout (svgen.runtime.kernel._head_runs), frame-major heads beside [h, f, w] heads read as
# cube boxes. Place boxes are off with the bounded softmax (svgen.core.boxes), cubes are not.
HEAD_RUNS = """\
svgen: 1
name: bounded_head_runs
geometry: {frames: 4, height: 8, width: 32}
attention: {heads: 2, head_dim: 128, dtype: float32, softmax: bounded}
patterns:
  spatial: {spatial_window: {frames: 0, rows: 2, cols: 3}}
  rows: {spatial_window: {frames: 1, rows: 0, cols: 4}}
heads:
  candidates:
    - {pattern: spatial}
    - {pattern: rows, layout: {order: [h, f, w]}}
  assign: [spatial, rows]
tiling: {block_q: 128, block_kv: 128}
"""


def test_a_head_runs_call_reads_its_own_heads_key_bound(shared_compile):
    """The second run's call (head 1) must read head 1's key bound, not the call's row 0's
    (head 0's): head 0 has N(0, 1) keys (bound about 21: bounded), head 1 keys 40 times as
    long (bound about 840: online). Head 0's bound in head 1's tiles would run them bounded
    with scores ~150 past R: exp2 overflows to inf, and the output is not finite."""
    plan, module = shared_compile(HEAD_RUNS)
    attention = module.attention
    head_pattern = np.asarray(module.HEAD_PATTERN)
    kinds = [type(b).__name__ for b in attention.layout_boxes]
    assert kinds == ["NoneType", "CubeDma"]
    assert attention._head_runs(head_pattern) == ((0, 1, 0), (1, 2, 1))
    q, k, v = normal(plan.layout.seq_len, seed=14)
    small_k = k.copy()
    k[1] *= 40
    bounds = bound_of(q, k)
    assert bounds[0] <= softmax.BOUND_LIMIT < 10 * bounds[0] < bounds[1]
    modes = np.asarray(jitted(attention, "softmax_modes", interpret=True)(q, k, v))
    assert np.all(modes[0] == 1) and np.all(modes[1] == 0), modes
    out = np.asarray(jitted(attention, interpret=POISONED)(q, k, v))
    assert np.all(np.isfinite(out)), "non-finite rows: a head read another head's key bound"
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    for head, tolerance in enumerate((TOLERANCE["float32"], 1e-3)):
        keep = user_order_keep(plan.patterns[head_pattern[head]])
        ref = masked_attention_reference(q64[head], k64[head], v64[head], keep)
        err = np.max(np.abs(out[head] - ref)) / np.max(np.abs(ref))
        assert err <= tolerance, f"head {head}: relative error {err:.2e}"
    # Batched: element 1 is the call above, element 0 has only short keys; row b of the second
    # run's call is row 2 b + 1 of k, whose bound element 1 must read (element 0's head 1's
    # would overflow as above).
    batched = jitted(attention, interpret=POISONED)(
        *(np.stack(pair) for pair in ((q, q), (small_k, k), (v, v)))
    )
    np.testing.assert_array_equal(np.asarray(batched[1]), out)
    small = np.asarray(jitted(attention, interpret=POISONED)(q, small_k, v))
    np.testing.assert_array_equal(np.asarray(batched[0]), small)
