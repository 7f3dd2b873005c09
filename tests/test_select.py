"""Blocks chosen from the activations (`select:`, svgen.runtime.select): the on-device
selection against a NumPy reference on the same pooled scores (ties, NaN, +-inf), the kernels
(NaN-poisoned interpret mode) against float64 attention under the selected mask, gradients
with the selection held fixed, one compile for every traced k and p, batches, a tiled head
layout, the spec's refusals, and the v6e AOT compile."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from svgen.spec.errors import SpecError
from svgen.runtime import select as sel
from svgen.spec import MAX_SELECT_BLOCKS, parse_spec

from helpers import HEADS_SELECT_SPECS, SELECT_SPECS, TWO_LEVEL, dense_keep, scaled_spec_text
from kernel_helpers import POISONED
from tpu_helpers import mosaic_kernels, v5e_gradient_hlo, v6e_device

# The one-pattern specs' mask, selection (its rule: %(rule)s) and tiling, the last sections.
SELECTED_MASK = """\
mask:
  any_of:
    - first_frame: {frames: 1}
    - spatial_window: {frames: 1}
select:
  candidate: {spatial_window: {frames: 3}}
  %(rule)s
tiling: {block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}
"""

SPEC = (
    """
svgen: 1
name: select_%(name)s
geometry: {frames: 7, height: 10, width: 20}
attention: {heads: 2, head_dim: 64, dtype: %(dtype)s}
layout: %(layout)s
"""
    + SELECTED_MASK
)

TOP_K = "top_k: {k: 2, max: 4}"
TOP_P = "top_p: {p: 0.5, min: 1, max: 5}"


def spec_text(rule=TOP_K, layout="frame_major", dtype="float32", name="tiny") -> str:
    return SPEC % dict(rule=rule, layout=layout, dtype=dtype, name=name)


# -- the selection itself ------------------------------------------------------------------


def _scores(rng, shape, specials: bool):
    scores = np.round(rng.standard_normal(shape) * 2, 1).astype(np.float32)  # ties
    if specials:
        flat = scores.reshape(-1)
        for value in (np.nan, np.inf, -np.inf):
            flat[rng.choice(flat.size, size=max(1, flat.size // 40), replace=False)] = value
    return scores


@pytest.mark.parametrize("specials", [False, True], ids=["finite", "nan_inf"])
@pytest.mark.parametrize("seed", range(4))
def test_top_k_selection_equals_the_numpy_reference(seed, specials):
    rng = np.random.default_rng(seed)
    rows, cols = 9, 13
    selectable = rng.random((rows, cols)) < 0.6
    policy = sel.SelectPolicy(sel.TOP_K, 3, int(rng.integers(0, 3)), int(rng.integers(3, 9)))
    scores = _scores(rng, (3, rows, cols), specials)
    for k in (0, 1, 4, 20):
        got = np.asarray(sel.select_blocks(jnp.asarray(scores), selectable, policy, k))
        want = sel.reference_selection(scores, selectable, policy, k)
        np.testing.assert_array_equal(got, want)
        assert not np.any(got & ~selectable), "a block outside the candidates was chosen"
        forced = selectable & (np.isnan(scores) | (scores == np.inf))
        assert np.all(got[forced]), "a NaN or +inf score must select its block"


@pytest.mark.parametrize("specials", [False, True], ids=["finite", "nan_inf"])
@pytest.mark.parametrize("seed", range(4))
def test_top_p_selection_equals_the_numpy_reference(seed, specials):
    rng = np.random.default_rng(100 + seed)
    rows, cols = 9, 13
    selectable = rng.random((rows, cols)) < 0.6
    policy = sel.SelectPolicy(sel.TOP_P, 0.5, 1, 6)
    scores = _scores(rng, (3, rows, cols), specials)
    for p in (0.0, 0.3, 0.62, 0.9, 1.0):
        got = np.asarray(sel.select_blocks(jnp.asarray(scores), selectable, policy, p))
        want = sel.reference_selection(scores, selectable, policy, p)
        # f32 on device, f64 here: a row whose cumulative mass lies within 1e-5 of p may
        # count one block differently; such rows are rare (asserted) and left out.
        close = (
            _rows_near_threshold(scores, selectable, p) if p > 0 else np.zeros(got.shape[:-1], bool)
        )
        assert close.mean() < 0.2
        np.testing.assert_array_equal(got[~close], want[~close])


def _rows_near_threshold(scores, selectable, p) -> np.ndarray:
    near = np.zeros(scores.shape[:-1], bool)
    for index in np.ndindex(scores.shape[:-1]):
        row = scores[index].astype(np.float64)
        valid = selectable[index[-1]] & np.isfinite(row)
        s = np.sort(row[valid])[::-1]
        if s.size == 0:
            continue
        w = np.exp(s - s.max())
        before = np.cumsum(w / w.sum()) - w / w.sum()
        near[index] = bool(np.any(np.abs(before - p) < 1e-5))
    return near


@pytest.mark.parametrize("rule", [sel.TOP_K, sel.TOP_P])
def test_the_sorted_ranking_of_long_rows_equals_the_compared_one(rule, monkeypatch):
    """Rows of more than MAX_COMPARED_COLUMNS blocks sort instead of comparing all pairs:
    both give the reference's selection."""
    rng = np.random.default_rng(11)
    selectable = rng.random((6, 40)) < 0.7
    policy = sel.SelectPolicy(rule, 0, 1, 12)
    scores = _scores(rng, (2, 6, 40), specials=True)
    amounts = (0, 3, 9) if rule == sel.TOP_K else (0.2, 0.6)
    compared = [
        np.asarray(sel.select_blocks(jnp.asarray(scores), selectable, policy, a)) for a in amounts
    ]
    monkeypatch.setattr(sel, "MAX_COMPARED_COLUMNS", 8)
    for amount, want in zip(amounts, compared):
        got = np.asarray(sel.select_blocks(jnp.asarray(scores), selectable, policy, amount))
        close = _rows_near_threshold(scores, selectable, amount) if rule == sel.TOP_P else False
        np.testing.assert_array_equal(got[~close], want[~close])
        if rule == sel.TOP_K:
            np.testing.assert_array_equal(
                want, sel.reference_selection(scores, selectable, policy, amount)
            )


@pytest.mark.parametrize("seq", [384, 400, 130])
def test_pooling_averages_the_real_tokens_of_each_block(seq):
    x = np.random.default_rng(seq).standard_normal((2, seq, 8)).astype(np.float32)
    got = np.asarray(sel.pooled_blocks(jnp.asarray(x), 128, 4))
    for b in range(4):
        part = x[:, b * 128 : (b + 1) * 128]
        want = part.mean(axis=1) if part.shape[1] else np.zeros((2, 8))
        np.testing.assert_allclose(got[:, b], want, atol=1e-6)


def test_scores_of_minus_infinity_still_rank_and_never_outrank_finite_ones():
    selectable = np.ones((1, 5), bool)
    scores = jnp.asarray([[[-np.inf, 1.0, -np.inf, 0.5, 2.0]]], jnp.float32)
    policy = sel.SelectPolicy(sel.TOP_K, 2, 0, 5)
    got = np.asarray(sel.select_blocks(scores, selectable, policy, 4))[0, 0]
    assert got.tolist() == [True, True, False, True, True]  # -inf ties: the lower column


# -- the kernels -----------------------------------------------------------------------------


def _kernel_order64(plan, q, k, v):
    """q, k, v as float64 [rows, seq, d] in the head's kernel order (rows = batch * heads)."""
    layout = plan.patterns[0].layout
    flat = [
        np.asarray(jnp.asarray(x, jnp.float32), np.float64).reshape((-1,) + x.shape[-2:])
        for x in (q, k, v)
    ]
    return [layout.to_kernel(x, np) for x in flat]


def _reference(plan, module, q, k, v, amount):
    """float64 attention (user order) under the mask a call selects, and the selection,
    both built here: pooled scores in each head's kernel order, reference_selection."""
    shape, select = module.SHAPE, module.attention.select
    qk, kk, _ = _kernel_order64(plan, q, k, v)
    rows_b, cols_b = select.selectable.shape
    scale = 1.0 / np.sqrt(q.shape[-1])
    if select.policy.sampled_rows:
        scores = _sampled_scores(qk, kk, shape, rows_b, cols_b, scale, select.policy.sampled_rows)
    else:
        scores = (
            np.einsum("rqd,rkd->rqk", _pool(qk, shape.cq, rows_b), _pool(kk, shape.ckv, cols_b))
            * scale
        )
    chosen = sel.reference_selection(
        scores.astype(np.float32), select.selectable, select.policy, amount
    )
    return _attention_under(plan, module, q, k, v, chosen), chosen


def _attention_under(plan, module, q, k, v, chosen):
    """float64 attention (user order, q's shape) under the mask and the selected blocks
    `chosen` (bool [rows, row blocks, col blocks], kernel order)."""
    pattern, shape = plan.patterns[0], module.SHAPE
    layout = pattern.layout
    qk, kk, vk = _kernel_order64(plan, q, k, v)
    scale = 1.0 / np.sqrt(q.shape[-1])
    always = dense_keep(pattern.mask, layout)
    n = layout.seq_len
    row_of, col_of = np.arange(n) // shape.cq, np.arange(n) // shape.ckv
    out = np.empty_like(qk)
    for r in range(qk.shape[0]):
        keep = always | chosen[r][row_of][:, col_of]
        s = np.where(keep, qk[r] @ kk[r].T * scale, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[r] = (p / p.sum(axis=1, keepdims=True)) @ vk[r]
    return layout.from_kernel(out, np).reshape(q.shape)


def _sampled_scores(q, k, shape, rows_b, cols_b, scale, per_block) -> np.ndarray:
    """float64 reference of sampled_block_scores, from its documented meaning: per block row,
    the log of the mean, over `per_block` rows evenly spaced in the block (the middles of
    equal parts, clipped to the last row), of each key block's share of the row's softmax."""
    seq = k.shape[1]
    out = np.empty((q.shape[0], rows_b, cols_b))
    n = min(per_block, shape.cq)
    for b in range(rows_b):
        rows = [min(b * shape.cq + (2 * i + 1) * shape.cq // (2 * n), seq - 1) for i in range(n)]
        logits = np.einsum("rsd,rnd->rsn", q[:, rows], k) * scale
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        mass = np.zeros((q.shape[0], n, cols_b))
        for c in range(cols_b):
            mass[:, :, c] = probs[:, :, c * shape.ckv : (c + 1) * shape.ckv].sum(axis=-1)
        with np.errstate(divide="ignore"):
            out[:, b] = np.log(mass.mean(axis=1))
    return out


def _pool(x, block: int, num_blocks: int) -> np.ndarray:
    out = np.zeros((x.shape[0], num_blocks, x.shape[-1]))
    for b in range(num_blocks):
        part = x[:, b * block : (b + 1) * block]
        if part.shape[1]:
            out[:, b] = part.mean(axis=1)
    return out


def _inputs(rng, lead, seq, d, dtype="float32"):
    q, k, v = (rng.standard_normal(lead + (seq, d)).astype(np.float32) for _ in range(3))
    # A per-head offset gives the pooled scores a spread worth ranking.
    q += rng.standard_normal(lead[:-1] + (lead[-1], 1, d)).astype(np.float32)
    return tuple(jnp.asarray(x, jnp.dtype(dtype)) for x in (q, k, v))


SAMPLED_TOP_P = TOP_P + "\n  sampled_rows: 8"


@pytest.mark.parametrize(
    "rule, amounts",
    [(TOP_K, (0, 1, 3)), (TOP_P, (0.2, 0.7)), (SAMPLED_TOP_P, (0.3, 0.9))],
    ids=["top_k", "top_p", "sampled_top_p"],
)
def test_kernel_matches_float64_under_the_selected_mask(compile_text, rule, amounts):
    plan, module = compile_text(spec_text(rule))
    q, k, v = _inputs(np.random.default_rng(1), (2,), module.SEQ_LEN, module.HEAD_DIM)
    outputs = []
    for amount in amounts:
        kwargs = {module.attention.select.policy.rule: amount}
        out = np.asarray(module.attention(q, k, v, interpret=POISONED, **kwargs))
        want, chosen = _reference(plan, module, q, k, v, amount)
        assert np.all(np.isfinite(out)), "unwritten (NaN) output rows"
        np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)
        outputs.append((out, chosen.sum()))
    assert outputs[0][1] != outputs[-1][1], "the amounts chose the same number of blocks"
    assert np.abs(outputs[0][0] - outputs[-1][0]).max() > 1e-2, "the selection changed nothing"


def test_the_last_key_block_is_selected_whole_but_for_padding(compile_text):
    """seq_len 1,400 leaves the last 128-key block 120 real keys: a selected one is PADDED
    (kind 3) in the forward tables, and the poisoned keys past the end never leak."""
    plan, module = compile_text(spec_text("top_k: {k: 4, max: 4}"))
    select = module.attention.select
    assert select.padded_col == module.SEQ_LEN // module.SHAPE.ckv
    assert select.selectable[:, select.padded_col].any()
    q, k, v = _inputs(np.random.default_rng(2), (2,), module.SEQ_LEN, module.HEAD_DIM)
    k = k.at[:, -120:].multiply(4.0)  # make the last block's keys win the ranking
    chosen = select.select(q, k, 1.0 / np.sqrt(module.HEAD_DIM), select.amount(4, None))
    assert np.asarray(chosen.blocks)[:, :, select.padded_col].any()
    out = np.asarray(module.attention(q, k, v, interpret=POISONED, top_k=4))
    want, _ = _reference(plan, module, q, k, v, 4)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


def test_gradients_hold_the_selection_fixed(compile_text):
    plan, module = compile_text(spec_text())
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, (2,), module.SEQ_LEN, module.HEAD_DIM)
    do = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    _, chosen = _reference(plan, module, q, k, v, 3)
    grads = jax.grad(
        lambda q, k, v: jnp.sum(module.attention(q, k, v, interpret=POISONED, top_k=3) * do),
        argnums=(0, 1, 2),
    )(q, k, v)
    layout, shape = plan.patterns[0].layout, module.SHAPE
    always = dense_keep(plan.patterns[0].mask, layout)
    n = layout.seq_len
    keep = [always | c[np.arange(n) // shape.cq][:, np.arange(n) // shape.ckv] for c in chosen]

    def dense(q, k, v):  # frame_major: the kernel order is the user's
        s = jnp.einsum("hqd,hkd->hqk", q, k) / np.sqrt(q.shape[-1])
        s = jnp.where(jnp.asarray(np.stack(keep)), s, -jnp.inf)
        return jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, axis=-1), v)

    _check_gradients(grads, dense, (q, k, v), do)


def _check_gradients(grads, dense, inputs, do) -> None:
    """The kernel's grads of sum(o * do) against jax.grad of the float64 `dense` attention
    (under the mask the call selected) at the same inputs: finite, within 5e-5."""
    with jax.enable_x64():
        args = [jnp.asarray(np.asarray(x), jnp.float64) for x in inputs]
        weight = jnp.asarray(np.asarray(do), jnp.float64)
        want = jax.grad(lambda *a: jnp.sum(dense(*a) * weight), argnums=(0, 1, 2))(*args)
    for got, ref in zip(grads, want):
        got = np.asarray(got)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, np.asarray(ref), atol=5e-5, rtol=0)


def test_traced_amounts_share_one_compile_and_batches_select_per_element(compile_text):
    plan, module = compile_text(spec_text(TOP_P))
    q, k, v = _inputs(np.random.default_rng(4), (2, 2), module.SEQ_LEN, module.HEAD_DIM)
    run = jax.jit(lambda q, k, v, p: module.attention(q, k, v, interpret=POISONED, top_p=p))
    for p in (0.25, 0.8):
        out = np.asarray(run(q, k, v, jnp.float32(p)))
        want, chosen = _reference(plan, module, q, k, v, p)
        np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)
    assert run._cache_size() == 1
    assert not np.array_equal(chosen[0], chosen[2]), "batch elements should select apart"


def test_tiled_heads_select_in_their_kernel_order(compile_text):
    plan, module = compile_text(
        spec_text(layout="{tiled: {frames: 1, rows: 5, cols: 8}}", name="tiled")
    )
    assert not plan.patterns[0].layout.is_identity
    q, k, v = _inputs(np.random.default_rng(5), (2,), module.SEQ_LEN, module.HEAD_DIM)
    out = np.asarray(module.attention(q, k, v, interpret=POISONED, top_k=2))
    want, _ = _reference(plan, module, q, k, v, 2)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("curve", ["hilbert", "morton"])
def test_curve_heads_select_in_their_kernel_order(compile_text, curve):
    """Jenga's setting: blocks of places along a curve in each frame, chosen by scores."""
    plan, module = compile_text(spec_text(layout=f"{{curve: {curve}}}", name=curve))
    assert plan.patterns[0].layout.curve == curve
    q, k, v = _inputs(np.random.default_rng(6), (2,), module.SEQ_LEN, module.HEAD_DIM)
    out = np.asarray(module.attention(q, k, v, interpret=POISONED, top_k=2))
    want, _ = _reference(plan, module, q, k, v, 2)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


def test_bfloat16_inputs(compile_text):
    plan, module = compile_text(spec_text(dtype="bfloat16", name="bf16"))
    q, k, v = _inputs(np.random.default_rng(6), (2,), module.SEQ_LEN, module.HEAD_DIM, "bfloat16")
    out = np.asarray(jnp.asarray(module.attention(q, k, v, interpret=POISONED), jnp.float32))
    want, _ = _reference(plan, module, q, k, v, 2)
    np.testing.assert_allclose(out, want, atol=3e-2, rtol=0)


def test_always_kept_blocks_stay_whatever_the_scores(compile_text):
    """Scores of -inf everywhere select nothing (k blocks at -inf still rank, so k = 0 here):
    the call then equals the always-kept mask alone; and every always-kept kind survives in
    the tables of any selection."""
    plan, module = compile_text(spec_text())
    select = module.attention.select
    walk = select.forward_walk
    rng = np.random.default_rng(7)
    chosen = rng.random((3,) + select.selectable.shape) < 0.5
    chosen &= select.selectable
    words = np.asarray(jax.vmap(walk.words)(jnp.asarray(chosen)))
    rq, rk = walk.visits.q_blocks_per_tile, walk.visits.kv_blocks_per_tile
    shifts = 2 * np.arange(rq * rk).reshape(rq, rk)
    blocks = (words.view(np.uint32)[:, :, None, None] >> shifts) & 3
    kept = walk.always[None] != 0
    assert np.all(blocks[np.broadcast_to(kept, blocks.shape)] != 0)
    q, k, v = _inputs(rng, (2,), module.SEQ_LEN, module.HEAD_DIM)
    out = np.asarray(module.attention(q, k, v, interpret=POISONED, top_k=0))
    want, chosen = _reference(plan, module, q, k, v, 0)
    assert not chosen.any()
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


# -- the call's arguments and the spec -------------------------------------------------------


def test_call_arguments_are_checked(compile_text):
    _, module = compile_text(spec_text())
    q = jnp.zeros((2, module.SEQ_LEN, module.HEAD_DIM), jnp.float32)
    with pytest.raises(TypeError, match="select policy is top_k"):
        module.attention(q, q, q, interpret=True, top_p=0.5)
    with pytest.raises(ValueError, match="whole numbers"):
        module.attention(q, q, q, interpret=True, top_k=1.5)
    with pytest.raises(ValueError, match="whole numbers"):
        module.attention(q, q, q, interpret=True, top_k=np.array([1, -2]))
    with pytest.raises(ValueError, match=r"scalar or one value per head \(shape \(2,\)\)"):
        module.attention(q, q, q, interpret=True, top_k=np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="scalar or one value per head"):
        jax.jit(lambda n: module.attention(q, q, q, interpret=True, top_k=n))(
            jnp.ones((2, 1), jnp.int32)
        )
    with pytest.raises(TypeError, match="top_k must be a number, got a bool"):
        module.attention(q, q, q, interpret=True, top_k=True)
    with pytest.raises(TypeError, match="traced top_k must have an integer dtype"):
        jax.jit(lambda n: module.attention(q, q, q, interpret=True, top_k=n))(jnp.float32(2.7))
    for flag in (1, "yes", None, jnp.asarray(True)):
        with pytest.raises(TypeError, match="return_selection must be True or False"):
            module.attention(q, q, q, interpret=True, return_selection=flag)
    signature = str(__import__("inspect").signature(module.attention))
    assert "top_k" in signature and "top_p" not in signature
    assert "return_selection=False" in signature
    assert "With return_selection=True, (o, selected)" in module.attention.__doc__


def test_top_p_is_no_bool(compile_text):
    _, module = compile_text(spec_text(TOP_P, name="p_bool"))
    q = jnp.zeros((2, module.SEQ_LEN, module.HEAD_DIM), jnp.float32)
    with pytest.raises(TypeError, match="top_p must be a number, got a bool"):
        module.attention(q, q, q, interpret=True, top_p=np.bool_(True))


def test_a_module_without_select_refuses_top_k(compile_text):
    _, module = compile_text(
        spec_text().split("select:")[0] + "tiling: {block_q: 256, block_kv: 256}\n"
    )
    q = jnp.zeros((2, module.SEQ_LEN, module.HEAD_DIM), jnp.float32)
    with pytest.raises(TypeError, match="without a `select:` policy"):
        module.attention(q, q, q, interpret=True, top_k=2)
    with pytest.raises(TypeError, match="return_selection: .*without a `select:` policy"):
        module.attention(q, q, q, interpret=True, return_selection=True)
    assert "return_selection" not in __import__("inspect").signature(module.attention).parameters


@pytest.mark.parametrize(
    "rule, key, message",
    [
        ("top_k: {k: 2, max: 4}\n  top_p: {p: 0.5, max: 4}", "select", "exactly one of"),
        ("top_k: {k: 5, max: 4}", "select.top_k.k", "at most 4"),
        ("top_k: {max: 4}", "select.top_k", "'k'"),
        ("top_k: {k: 40000}", "select.top_k.k", "MAX_SELECT_BLOCKS"),
        ("top_p: {p: 0.5, min: 40000}", "select.top_p.min", "MAX_SELECT_BLOCKS"),
        ("top_p: {p: 1.5, max: 4}", "select.top_p.p", "in 0 .. 1"),
        ("top_p: {p: 0.5, min: 5, max: 4}", "select.top_p.min", "at most 4"),
        ("top_k: {k: 2, max: 40000}", "select.top_k.max", "MAX_SELECT_BLOCKS"),
    ],
)
def test_bad_select_sections_are_refused_at_their_key(rule, key, message):
    with pytest.raises(SpecError, match=message) as err:
        parse_spec(spec_text(rule), source="s.yaml")
    assert err.value.key == key and err.value.line is not None


@pytest.mark.parametrize("target", ["v6e", "h100"])
@pytest.mark.parametrize("rule", ["top_k: {k: 2}", "top_p: {p: 0.5, min: 1}"])
def test_without_max_the_candidate_bounds_the_selection(compile_text, rule, target):
    """No `max`: the policy's bound is the most selectable blocks any row of the module
    has (read here from the module's own Selection), so it clamps nothing: the selection
    equals the reference without a bound, and an amount past every row's candidates
    selects each row's every one (the documented meaning)."""
    plan, module = compile_text(spec_text(rule, name=f"no_max_{target}"), target_name=target)
    select = module.attention.select
    most = int(select.selectable.sum(axis=1).max())
    assert select.policy.max_blocks == most
    if plan.backend == "tpu":  # `svgen inspect --json` (a GPU plan's summary has no select key)
        assert plan.summary()["select"]["max_blocks"] == most
    assert 1 < most < sel.MAX_COMPARED_COLUMNS, "a bound worth testing, on the compared path"
    unbounded = dataclasses.replace(select.policy, max_blocks=MAX_SELECT_BLOCKS)
    rng = np.random.default_rng(21)
    scores = _scores(rng, (2,) + select.selectable.shape, specials=False)
    amounts = (1, most - 1, most, 10 * most) if select.policy.rule == sel.TOP_K else (0.3, 1.0)
    for amount in amounts:
        got = np.asarray(
            sel.select_blocks(jnp.asarray(scores), select.selectable, select.policy, amount)
        )
        want = sel.reference_selection(scores, select.selectable, unbounded, amount)
        np.testing.assert_array_equal(got, want, err_msg=str(amount))
    everything = sel.select_blocks(
        jnp.asarray(scores), select.selectable, select.policy, amounts[-1]
    )
    np.testing.assert_array_equal(
        np.asarray(everything), np.broadcast_to(select.selectable, scores.shape)
    )
    assert f"at most {most} blocks per row (the spec gives no max" in " ".join(
        module.__doc__.split()
    )


def test_without_max_the_kernel_attends_every_candidate_block(compile_text):
    """top_k past the candidate's widest row, no `max`: the kernel attends the mask and
    every selectable block (float64 reference under exactly that mask)."""
    plan, module = compile_text(spec_text("top_k: {k: 1}", name="no_max_kernel"))
    select = module.attention.select
    q, k, v = _inputs(np.random.default_rng(22), (2,), module.SEQ_LEN, module.HEAD_DIM)
    amount = 4 * int(select.selectable.sum(axis=1).max())
    want, chosen = _reference(plan, module, q, k, v, amount)
    np.testing.assert_array_equal(chosen, np.broadcast_to(select.selectable, chosen.shape))
    out = np.asarray(module.attention(q, k, v, interpret=POISONED, top_k=amount))
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


# Heads of two patterns in two layouts, one policy: each head chooses among its own
# pattern's blocks, in its own kernel order.
HEADS_SPEC = """
svgen: 1
name: select_heads_%(name)s
geometry: {frames: 7, height: 10, width: 20}
attention: {heads: 3, head_dim: 64, dtype: float32}
patterns:
  spatial: {any_of: [{first_frame: {frames: 1}}, {spatial_window: {frames: 1}}]}
  temporal: {any_of: [{first_frame: {frames: 1}}, {temporal_stride: {}}]}
heads:
  candidates:
    - {pattern: spatial}
    - {pattern: temporal, layout: temporal_major}
  assign: %(assign)s
select:
  candidate: {spatial_window: {frames: 3}}
  %(rule)s
tiling: {block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}
"""


def _heads_reference(plan, module, q, k, v, head_pattern, amount):
    """float64 attention (user order) of each head under its pattern's mask and the blocks
    chosen for it among its pattern's selectable ones, by its pattern's policy, from scores
    pooled in its layout's kernel order (reference_selection): written per head, as
    one-pattern calls would. amount: one for every head, one per head (a list), or None
    (each pattern's default)."""
    shape, select = module.SHAPE, module.attention.select
    scale = 1.0 / np.sqrt(q.shape[-1])
    out = np.empty(q.shape)
    chosen = {}
    for head, p in enumerate(head_pattern):
        pattern = plan.patterns[p]
        layout = pattern.layout
        qk, kk, vk = (
            layout.to_kernel(np.asarray(jnp.asarray(x[:, head], jnp.float32), np.float64), np)
            for x in (q, k, v)
        )
        selectable = select.selections[p].selectable
        rows_b, cols_b = selectable.shape
        scores = (
            np.einsum("rqd,rkd->rqk", _pool(qk, shape.cq, rows_b), _pool(kk, shape.ckv, cols_b))
            * scale
        )
        policy = select.selections[p].policy
        own = amount[head] if isinstance(amount, list) else amount
        picked = sel.reference_selection(
            scores.astype(np.float32), selectable, policy, policy.default if own is None else own
        )
        chosen[head] = picked
        n = layout.seq_len
        always = dense_keep(pattern.mask, layout)
        row_of, col_of = np.arange(n) // shape.cq, np.arange(n) // shape.ckv
        for b in range(q.shape[0]):
            keep = always | picked[b][row_of][:, col_of]
            s = np.where(keep, qk[b] @ kk[b].T * scale, -np.inf)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, head] = layout.from_kernel((w / w.sum(axis=1, keepdims=True)) @ vk[b], np)
    return out, chosen


@pytest.mark.parametrize("rule, amount", [(TOP_K, 3), (TOP_P, 0.6)], ids=["top_k", "top_p"])
def test_heads_each_select_among_their_patterns_blocks(compile_text, rule, amount):
    plan, module = compile_text(
        HEADS_SPEC % dict(name="static", assign="[temporal, spatial, temporal]", rule=rule)
    )
    assert len(module.attention.select.selections) == 2
    selections = module.attention.select.selections
    assert not np.array_equal(selections[0].selectable, selections[1].selectable)
    q, k, v = _inputs(np.random.default_rng(30), (2, 3), module.SEQ_LEN, module.HEAD_DIM)
    kwargs = {module.attention.select.policy.rule: amount}
    out = np.asarray(module.attention(q, k, v, interpret=POISONED, **kwargs))
    want, _ = _heads_reference(plan, module, q, k, v, (1, 0, 1), amount)
    assert np.all(np.isfinite(out)), "unwritten (NaN) output rows"
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


def test_heads_with_a_traced_pattern_and_gradients(compile_text):
    plan, module = compile_text(HEADS_SPEC % dict(name="runtime", assign="runtime", rule=TOP_K))
    rng = np.random.default_rng(31)
    q, k, v = _inputs(rng, (1, 3), module.SEQ_LEN, module.HEAD_DIM)
    head_pattern = jnp.asarray([0, 1, 1], jnp.int32)
    run = jax.jit(
        lambda q, k, v, hp: module.attention(q, k, v, head_pattern=hp, interpret=POISONED, top_k=2)
    )
    want, chosen = _heads_reference(plan, module, q, k, v, (0, 1, 1), 2)
    np.testing.assert_allclose(np.asarray(run(q, k, v, head_pattern)), want, atol=2e-5, rtol=0)
    _, selected = module.attention(
        q, k, v, head_pattern=head_pattern, interpret=POISONED, top_k=2, return_selection=True
    )
    for head in range(3):
        np.testing.assert_array_equal(np.asarray(selected)[0, head], chosen[head][0])

    do = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    grads = jax.jit(
        jax.grad(
            lambda q, k, v: jnp.sum(
                module.attention(q, k, v, head_pattern=head_pattern, interpret=POISONED, top_k=2)
                * do
            ),
            argnums=(0, 1, 2),
        )
    )(q, k, v)
    keeps = []
    for head, p in enumerate((0, 1, 1)):
        layout, shape = plan.patterns[p].layout, module.SHAPE
        n = layout.seq_len
        kernel_keep = (
            dense_keep(plan.patterns[p].mask, layout)
            | chosen[head][0][np.arange(n) // shape.cq][:, np.arange(n) // shape.ckv]
        )
        position = layout.kernel_position
        keeps.append(kernel_keep[np.ix_(position, position)])  # the user's order

    def dense(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
        s = jnp.where(jnp.asarray(np.stack(keeps))[None], s, -jnp.inf)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)

    _check_gradients(grads, dense, (q, k, v), do)


# Per pattern: the temporal heads choose among fewer blocks (a band along their order), fewer
# of them.
OWN_SELECT = """
  patterns:
    temporal: {candidate: {band: {width: 256}}, top_k: {k: 1, max: 2}}
"""


def test_heads_of_a_pattern_choose_by_its_own_candidate_and_amounts(compile_text):
    text = HEADS_SPEC % dict(name="own", assign="[temporal, spatial, temporal]", rule=TOP_K)
    text = text.replace("\ntiling:", OWN_SELECT.rstrip() + "\ntiling:")
    plan, module = compile_text(text)
    _, shared = compile_text(
        HEADS_SPEC % dict(name="shared", assign="[temporal, spatial, temporal]", rule=TOP_K)
    )
    own, common = module.attention.select.selections, shared.attention.select.selections
    # The spatial heads' selection is the section's; the temporal heads' their own.
    np.testing.assert_array_equal(own[0].selectable, common[0].selectable)
    assert own[0].policy == common[0].policy
    assert own[1].selectable.sum() < common[1].selectable.sum()
    assert (own[1].policy.default, own[1].policy.min_blocks, own[1].policy.max_blocks) == (1, 0, 2)
    assert "Heads of temporal choose otherwise" in " ".join(module.__doc__.split())
    q, k, v = _inputs(np.random.default_rng(32), (2, 3), module.SEQ_LEN, module.HEAD_DIM)
    out = np.asarray(module.attention(q, k, v, interpret=POISONED))
    want, chosen = _heads_reference(plan, module, q, k, v, (1, 0, 1), None)
    # Temporal heads (0 and 2): k = 1 of their own; the spatial head: the section's k = 2.
    assert chosen[0].sum(axis=-1).max() == 1 and chosen[1].sum(axis=-1).max() == 2
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)
    # A call's amount per head overrides every pattern's default, within each one's bounds.
    per_head = [3, 4, 0]
    out = np.asarray(
        module.attention(q, k, v, interpret=POISONED, top_k=np.asarray(per_head, np.int32))
    )
    want, chosen = _heads_reference(plan, module, q, k, v, (1, 0, 1), per_head)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    "rule, amounts", [(TOP_K, [1, 4]), (TOP_P, [0.2, 0.9])], ids=["top_k", "top_p"]
)
def test_an_amount_per_head(compile_text, rule, amounts):
    """top_k / top_p of shape [heads], concrete and traced (one compile): head h selects by
    amounts[h] (rows are batch x heads, head = row % heads)."""
    plan, module = compile_text(spec_text(rule, name=f"per_head_{rule[:5]}"))
    select = module.attention.select
    q, k, v = _inputs(np.random.default_rng(33), (2, 2), module.SEQ_LEN, module.HEAD_DIM)
    name = select.policy.rule
    dtype = np.int32 if name == "top_k" else np.float32
    run = jax.jit(
        lambda q, k, v, a: module.attention(
            q, k, v, interpret=POISONED, return_selection=True, **{name: a}
        )
    )
    out, selected = run(q, k, v, jnp.asarray(amounts, dtype))
    qk, kk, _ = _kernel_order64(plan, q, k, v)
    rows_b, cols_b = select.selectable.shape
    scale = 1.0 / np.sqrt(q.shape[-1])
    scores = (
        np.einsum(
            "rqd,rkd->rqk", _pool(qk, module.SHAPE.cq, rows_b), _pool(kk, module.SHAPE.ckv, cols_b)
        )
        * scale
    )
    chosen = np.stack(
        [
            sel.reference_selection(
                scores[r : r + 1].astype(np.float32),
                select.selectable,
                select.policy,
                amounts[r % 2],
            )[0]
            for r in range(scores.shape[0])
        ]
    )
    counts = chosen.sum(axis=-1)
    assert not np.array_equal(counts[0::2], counts[1::2]), "the heads' amounts changed nothing"
    np.testing.assert_array_equal(np.asarray(selected).reshape(chosen.shape), chosen)
    want = _attention_under(plan, module, q, k, v, chosen)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    "extra, key, message",
    [
        (
            "  patterns:\n    temporal: {top_p: {p: 0.5}}\n",
            "select.patterns.temporal.top_p",
            "the rule is every head's",
        ),
        (
            "  patterns:\n    radial: {top_k: {k: 1}}\n",
            "select.patterns.radial",
            "the patterns of heads.candidates are: spatial, temporal",
        ),
        ("  patterns:\n    temporal: {}\n", "select.patterns.temporal", "is empty"),
        ("  patterns: {}\n", "select.patterns", "is empty"),
        (
            "  patterns:\n    temporal: {top_k: {k: 3, max: 2}}\n",
            "select.patterns.temporal.top_k.k",
            r"must be at most 2 \(select.patterns.temporal.top_k.max\)",
        ),
    ],
    ids=["other_rule", "unknown_pattern", "empty_entry", "empty", "k_over_max"],
)
def test_select_patterns_errors_name_the_key(extra, key, message):
    text = HEADS_SPEC % dict(name="bad", assign="[temporal, spatial, temporal]", rule=TOP_K)
    text = text.replace("\ntiling:", "\n" + extra.rstrip() + "\ntiling:")
    with pytest.raises(SpecError, match=message) as info:
        parse_spec(text, source="s.yaml")
    assert info.value.key == key and info.value.line is not None


def test_select_patterns_need_heads():
    text = spec_text().replace("\ntiling:", "\n  patterns:\n    mask: {top_k: {k: 1}}\ntiling:")
    with pytest.raises(SpecError, match="needs heads:") as info:
        parse_spec(text, source="s.yaml")
    assert info.value.key == "select.patterns"


# -- packed batches: segments and text lengths ------------------------------------------------

SEGMENT_SPEC = (
    """
svgen: 1
name: select_segments_%(name)s
geometry: {frames: 7, height: 10, width: 20, text_tokens: %(text)d}
attention: {heads: 2, head_dim: 64, dtype: float32}
layout: %(layout)s
runtime: {segments: true, text_lengths: %(lengths)s}
"""
    + SELECTED_MASK
)


def _segment_reference(plan, module, q, k, v, amount, query_ids, key_ids, with_keeps=False):
    """float64 attention (user order) of a packed call, and its selection, written from the
    rule: per row, the blocks a call may choose are the candidate's selectable ones whose
    queries and keys share a non-negative segment id; keep(q, k) = same id (>= 0) and
    (mask(q, k) or the block of (q, k) chosen). ids: int32 [batch, seq], user order.
    with_keeps: the rows' keep masks instead (user order)."""
    pattern, shape, select = plan.patterns[0], module.SHAPE, module.attention.select
    layout = pattern.layout
    qk, kk, vk = _kernel_order64(plan, q, k, v)
    heads = q.shape[1]
    rows_b, cols_b = select.selectable.shape
    scale = 1.0 / np.sqrt(q.shape[-1])
    scores = (
        np.einsum("rqd,rkd->rqk", _pool(qk, shape.cq, rows_b), _pool(kk, shape.ckv, cols_b)) * scale
    )
    n = layout.seq_len
    row_of, col_of = np.arange(n) // shape.cq, np.arange(n) // shape.ckv
    always = dense_keep(pattern.mask, layout)
    chosen = np.zeros(scores.shape, bool)
    out, keeps = np.empty_like(qk), []
    for r in range(qk.shape[0]):
        qi = layout.to_kernel(query_ids[r // heads][:, None], np)[:, 0]
        ki = layout.to_kernel(key_ids[r // heads][:, None], np)[:, 0]
        same = (qi[:, None] == ki[None, :]) & (qi[:, None] >= 0)
        share = np.zeros((rows_b, cols_b), bool)
        np.logical_or.at(share, (row_of[:, None], col_of[None, :]), same)
        chosen[r] = sel.reference_selection(
            scores[r : r + 1].astype(np.float32), select.selectable & share, select.policy, amount
        )[0]
        keep = same & (always | chosen[r][row_of][:, col_of])
        keeps.append(keep)
        s = np.where(keep, qk[r] @ kk[r].T * scale, -np.inf)
        top = np.max(s, axis=1, keepdims=True)
        w = np.where(keep, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
        total = w.sum(axis=1, keepdims=True)
        out[r] = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0) @ vk[r]
    if with_keeps:  # per row, in the user's order
        position = layout.kernel_position
        return [keep[np.ix_(position, position)] for keep in keeps]
    return layout.from_kernel(out, np).reshape(q.shape), chosen


def _packed_ids(layout, batch: int, rng):
    """Segment ids [batch, seq] of packed videos whose frames split at a random frame (the
    text, if any, shared out in order), element 0 with a run of padding frames too."""
    ids = np.zeros((batch, layout.seq_len), np.int32)
    frame_of = (np.arange(layout.seq_len) - layout.video_start) // layout.tokens_per_frame
    video = (np.arange(layout.seq_len) >= layout.video_start) & (
        np.arange(layout.seq_len) < layout.video_start + layout.video_tokens
    )
    for b in range(batch):
        cut = int(rng.integers(2, layout.frames - 1))
        ids[b] = np.where(video & (frame_of >= cut), 1, 0)
        text = np.arange(layout.seq_len) - layout.text_start
        is_text = (text >= 0) & (text < layout.text_tokens)
        ids[b] = np.where(is_text, (text * 2) // max(layout.text_tokens, 1), ids[b])
    ids[0] = np.where(video & (frame_of == layout.frames - 1), -1, ids[0])
    return ids


@pytest.mark.parametrize(
    "rule, amount, layout",
    [(TOP_K, 3, "frame_major"), (TOP_P, 0.6, "temporal_major")],
    ids=["top_k_frame_major", "top_p_temporal_major"],
)
def test_selection_in_packed_batches_keeps_each_segment_apart(compile_text, rule, amount, layout):
    """Segment ids (two videos per element, a padding frame): a chosen block attends the
    keys of its queries' segment only, and a block whose queries and keys share no segment
    is never chosen; against float64 of the rule, with the selection."""
    text = SEGMENT_SPEC % dict(
        name=f"{rule[:5]}_{layout}", text=0, layout=layout, lengths="false", rule=rule
    )
    plan, module = compile_text(text)
    rng = np.random.default_rng(40)
    q, k, v = _inputs(rng, (2, 2), module.SEQ_LEN, module.HEAD_DIM)
    ids = _packed_ids(plan.patterns[0].layout, 2, rng)
    name = module.attention.select.policy.rule
    out, selected = jax.jit(
        lambda q, k, v, ids: module.attention(
            q, k, v, segment_ids=ids, interpret=POISONED, return_selection=True, **{name: amount}
        )
    )(q, k, v, jnp.asarray(ids))
    key_ids = np.where(ids < 0, -2, ids)
    want, chosen = _segment_reference(plan, module, q, k, v, amount, ids, key_ids)
    assert chosen.any()
    np.testing.assert_array_equal(np.asarray(selected).reshape(chosen.shape), chosen)
    assert np.all(np.isfinite(np.asarray(out)))
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=0)


def test_selection_with_text_lengths_and_gradients(compile_text):
    """Packed videos with text (prompt lengths per element): forward and gradients against
    float64 attention under the keep mask the call selected (the selection held fixed)."""
    text = SEGMENT_SPEC % dict(
        name="text", text=64, layout="frame_major", lengths="true", rule=TOP_K
    )
    plan, module = compile_text(text)
    layout = plan.patterns[0].layout
    rng = np.random.default_rng(41)
    q, k, v = _inputs(rng, (2, 2), module.SEQ_LEN, module.HEAD_DIM)
    ids = _packed_ids(layout, 2, rng)
    lengths = np.asarray([40, 17], np.int32)
    padded = np.arange(layout.seq_len)[None, :] - layout.text_start >= lengths[:, None]
    padded &= np.arange(layout.seq_len)[None, :] >= layout.text_start
    query_ids, key_ids = np.where(padded, -1, ids), np.where(padded, -2, ids)
    key_ids = np.where(key_ids == -1, -2, key_ids)

    def call(q, k, v):
        return module.attention(
            q,
            k,
            v,
            segment_ids=jnp.asarray(ids),
            text_lengths=jnp.asarray(lengths),
            interpret=POISONED,
            top_k=2,
        )

    want, _ = _segment_reference(plan, module, q, k, v, 2, query_ids, key_ids)
    np.testing.assert_allclose(np.asarray(jax.jit(call)(q, k, v)), want, atol=2e-5, rtol=0)
    keeps = np.stack(
        _segment_reference(plan, module, q, k, v, 2, query_ids, key_ids, with_keeps=True)
    ).reshape(2, 2, layout.seq_len, layout.seq_len)
    do = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(call(q, k, v) * do), argnums=(0, 1, 2)))(
        q, k, v
    )

    def dense(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
        s = jnp.where(keeps, s, -jnp.inf)
        top = jnp.max(s, axis=-1, keepdims=True)
        w = jnp.where(keeps, jnp.exp(s - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
        total = jnp.sum(w, axis=-1, keepdims=True)
        return jnp.einsum("bhqk,bhkd->bhqd", w / jnp.where(total > 0, total, 1.0), v)

    _check_gradients(grads, dense, (q, k, v), do)


def test_packed_selection_compiles_for_v5e_both_directions(compile_text):
    """Mosaic and libtpu accept the forward and backward kernels of a selection across
    segments (their SEGMENT_BOUNDARY blocks branch on the piece's chosen word)."""
    text = SEGMENT_SPEC % dict(
        name="v5e", text=0, layout="frame_major", lengths="false", rule=TOP_K
    )
    text = text.replace("float32", "bfloat16")
    _, module = compile_text(text)
    ids = _packed_ids(module.attention.layouts[0], 1, np.random.default_rng(42))[0]
    hlo = v5e_gradient_hlo(module, batch=2, segment_ids=jnp.asarray(ids))
    kernels = mosaic_kernels(hlo)
    assert "svgen_attention" in kernels and "svgen_attention_dkv" in kernels


def test_heads_of_two_patterns_select_in_packed_batches(compile_text):
    """Heads of two layouts, each choosing among its own pattern's blocks that share a
    segment in its own kernel order; against float64 written per head."""
    text = HEADS_SPEC % dict(name="packed", assign="[temporal, spatial, temporal]", rule=TOP_K)
    text = text.replace("\nheads:", "\nruntime: {segments: true}\nheads:")
    plan, module = compile_text(text)
    select, shape = module.attention.select, module.SHAPE
    rng = np.random.default_rng(43)
    q, k, v = _inputs(rng, (2, 3), module.SEQ_LEN, module.HEAD_DIM)
    ids = _packed_ids(plan.patterns[0].layout, 2, rng)
    out = jax.jit(
        lambda q, k, v, ids: module.attention(q, k, v, segment_ids=ids, interpret=POISONED, top_k=2)
    )(q, k, v, jnp.asarray(ids))
    scale = 1.0 / np.sqrt(q.shape[-1])
    want = np.empty(q.shape)
    for head, p in enumerate((1, 0, 1)):
        layout, selection = plan.patterns[p].layout, select.selections[p]
        rows_b, cols_b = selection.selectable.shape
        n = layout.seq_len
        row_of, col_of = np.arange(n) // shape.cq, np.arange(n) // shape.ckv
        always = dense_keep(plan.patterns[p].mask, layout)
        for b in range(2):
            qk, kk, vk = (
                layout.to_kernel(np.asarray(x[b, head], np.float64), np) for x in (q, k, v)
            )
            qi = layout.to_kernel(ids[b][:, None], np)[:, 0]
            ki = np.where(qi < 0, -2, qi)
            same = (qi[:, None] == ki[None, :]) & (qi[:, None] >= 0)
            share = np.zeros((rows_b, cols_b), bool)
            np.logical_or.at(share, (row_of[:, None], col_of[None, :]), same)
            scores = _pool(qk[None], shape.cq, rows_b)[0] @ _pool(kk[None], shape.ckv, cols_b)[0].T
            picked = sel.reference_selection(
                (scores * scale)[None].astype(np.float32),
                selection.selectable & share,
                selection.policy,
                2,
            )[0]
            keep = same & (always | picked[row_of][:, col_of])
            s = np.where(keep, qk @ kk.T * scale, -np.inf)
            top = np.max(s, axis=1, keepdims=True)
            w = np.where(keep, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
            total = w.sum(axis=1, keepdims=True)
            o = np.where(total > 0, w / np.where(total > 0, total, 1.0), 0.0) @ vk
            want[b, head] = layout.from_kernel(o, np)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=0)


def test_selection_refuses_kv_caches_and_per_video_frames():
    for runtime, key in (
        ("{per_video_frames: true, segments: true}", "per_video_frames"),
        ("{kv_cache: {chunk_frames: 1}}", "kv_cache"),
    ):
        text = SEGMENT_SPEC % dict(
            name="refused", text=0, layout="frame_major", lengths="false", rule=TOP_K
        )
        text = text.replace("runtime: {segments: true, text_lengths: false}", f"runtime: {runtime}")
        with pytest.raises(SpecError, match=f"cannot be combined with runtime.{key} yet") as info:
            parse_spec(text, source="s.yaml")
        assert info.value.key == "select"


def test_packed_selection_is_refused_on_gpu():
    from svgen.analysis import analyze

    text = SEGMENT_SPEC % dict(
        name="gpu", text=0, layout="frame_major", lengths="false", rule=TOP_K
    )
    with pytest.raises(SpecError, match="runtime segments or text lengths does not run in the"):
        analyze(parse_spec(text, source="s.yaml"), target_name="h100")


def test_heads_selection_is_refused_on_gpu():
    from svgen.analysis import analyze

    text = HEADS_SPEC % dict(name="gpu", assign="[spatial, temporal, spatial]", rule=TOP_K)
    with pytest.raises(SpecError, match="several patterns does not run in the"):
        analyze(parse_spec(text, source="s.yaml"), target_name="h200")


@pytest.mark.parametrize("rule, amount", [(TOP_K, 3), (TOP_P, 0.6)], ids=["top_k", "top_p"])
def test_gpu_forward_matches_float64_under_the_selected_mask(compile_text, rule, amount):
    """--target h100: the selection's grain is the GPU tile (64 x 64 here); the Triton
    kernel (interpret mode) walks per-row CSR tables built on device."""
    plan, module = compile_text(spec_text(rule, name="gpu"), target_name="h100")
    assert module.attention.select.selectable.shape == (22, 22)  # 1,400 tokens / 64
    q, k, v = _inputs(np.random.default_rng(14), (2, 2), module.SEQ_LEN, module.HEAD_DIM)
    kwargs = {module.attention.select.policy.rule: amount}
    out, selected = jax.jit(
        lambda q, k, v: module.attention(q, k, v, interpret=True, return_selection=True, **kwargs)
    )(q, k, v)
    want, chosen = _reference(plan, module, q, k, v, amount)
    assert chosen.any()
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=0)
    np.testing.assert_array_equal(np.asarray(selected).reshape(chosen.shape), chosen)


def test_gpu_selection_lowers_for_cuda(compile_text):
    """A TPU select module's GPU kernel (gpu_attention_of) lowers to one Triton call."""
    from svgen.runtime import gpu

    _, module = compile_text(spec_text(dtype="bfloat16", name="gpu_ir"))
    attention = gpu.gpu_attention_of(module, block_q=64, block_kv=64)
    q = jax.ShapeDtypeStruct((2, module.SEQ_LEN, module.HEAD_DIM), jnp.bfloat16)
    text = (
        jax.jit(lambda q, k, v, n: attention(q, k, v, top_k=n))
        .trace(q, q, q, jax.ShapeDtypeStruct((), jnp.int32))
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    assert text.count("__gpu$xla.gpu.triton") == 1


def test_the_digest_changes_only_with_a_select_section():
    with_select = parse_spec(spec_text(), source="s.yaml")
    other_amount = parse_spec(spec_text("top_k: {k: 3, max: 4}"), source="s.yaml")
    assert with_select.digest != other_amount.digest
    assert with_select.select.candidate.op == "spatial_window"


def test_selection_compiles_for_v6e(compile_text):
    """A selection module's forward (traced k) and gradient pass Mosaic and libtpu."""
    _, module = compile_text(spec_text(name="aot"))
    sharding = jax.sharding.SingleDeviceSharding(v6e_device())
    arg = jax.ShapeDtypeStruct((2, module.SEQ_LEN, module.HEAD_DIM), jnp.float32, sharding=sharding)
    amount = jax.ShapeDtypeStruct((), jnp.int32, sharding=sharding)

    def call(q, k, v, top_k):
        return module.attention(q, k, v, top_k=top_k)

    text = jax.jit(call).lower(arg, arg, arg, amount).compile().as_text()
    assert "tpu_custom_call" in text
    grad = jax.grad(lambda q, k, v, n: jnp.sum(call(q, k, v, n)), argnums=(0, 1, 2))
    text = jax.jit(grad).lower(arg, arg, arg, amount).compile().as_text()
    assert "svgen_attention_dkv" in text
    assert {"svgen_attention", "svgen_attention_dkv"} <= set(mosaic_kernels(text))


@pytest.mark.parametrize(
    "spec_path", [p for p in SELECT_SPECS if p not in HEADS_SELECT_SPECS], ids=lambda p: p.stem
)
def test_shipped_select_specs_scaled_down(spec_path, compile_text):
    """Each shipped select spec at the small geometry with two-level tiles: forward at its
    default amount and gradients, against float64 under the call's own selection."""
    plan, module = compile_text(scaled_spec_text(spec_path, tiling=TWO_LEVEL))
    rng = np.random.default_rng(12)
    q, k, v = _inputs(rng, (2,), module.SEQ_LEN, module.HEAD_DIM)
    default = module.attention.select.policy.default
    out = np.asarray(module.attention(q, k, v, interpret=POISONED))
    want, chosen = _reference(plan, module, q, k, v, default)
    assert chosen.any()
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)
    do = jnp.asarray(rng.standard_normal(q.shape), jnp.float32)
    grads = jax.jit(
        jax.grad(
            lambda q, k, v: jnp.sum(module.attention(q, k, v, interpret=POISONED) * do),
            argnums=(0, 1, 2),
        )
    )(q, k, v)
    step = 1e-3  # central differences of the float64 reference along random directions
    for index, got in enumerate(grads):
        direction = rng.standard_normal(q.shape)
        args = [np.asarray(x, np.float64) for x in (q, k, v)]
        plus, minus = list(args), list(args)
        plus[index] = args[index] + step * direction
        minus[index] = args[index] - step * direction
        loss = lambda a: float(np.sum(_fixed(plan, module, chosen, *a) * np.asarray(do)))  # noqa: E731
        numeric = (loss(plus) - loss(minus)) / (2 * step)
        analytic = float(np.sum(np.asarray(got, np.float64) * direction))
        assert abs(numeric - analytic) <= 1e-3 * max(1.0, abs(numeric)), (index, numeric, analytic)


@pytest.mark.parametrize("spec_path", HEADS_SELECT_SPECS, ids=lambda p: p.stem)
def test_shipped_heads_select_specs_scaled_down(spec_path, compile_text):
    """Each shipped select spec with heads of several patterns, at the small geometry with
    two-level tiles: each head against float64 under its pattern's mask and its own choice,
    by its pattern's default amount."""
    plan, module = compile_text(scaled_spec_text(spec_path, tiling=TWO_LEVEL))
    q, k, v = _inputs(np.random.default_rng(13), (1, 2), module.SEQ_LEN, module.HEAD_DIM)
    out = np.asarray(module.attention(q, k, v, interpret=POISONED))
    want, chosen = _heads_reference(plan, module, q, k, v, tuple(module.HEAD_PATTERN), None)
    assert all(c.any() for c in chosen.values())
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)


def _fixed(plan, module, chosen, q, k, v):
    """float64 attention (frame_major: user order) under a fixed selection `chosen`."""
    pattern, shape = plan.patterns[0], module.SHAPE
    always = dense_keep(pattern.mask, pattern.layout)
    n = pattern.layout.seq_len
    out = np.empty_like(q)
    for r in range(q.shape[0]):
        keep = always | chosen[r][np.arange(n) // shape.cq][:, np.arange(n) // shape.ckv]
        s = np.where(keep, q[r] @ k[r].T / np.sqrt(q.shape[-1]), -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[r] = (p / p.sum(axis=1, keepdims=True)) @ v[r]
    return out


def test_vmap_gives_each_element_its_own_amount(compile_text):
    """jax.vmap over a batch with a k per element: each element equals its own call."""
    _, module = compile_text(spec_text(name="vmap"))
    q, k, v = _inputs(np.random.default_rng(13), (2, 2), module.SEQ_LEN, module.HEAD_DIM)
    mapped = jax.jit(
        jax.vmap(lambda q, k, v, n: module.attention(q, k, v, interpret=POISONED, top_k=n))
    )(q, k, v, jnp.array([1, 3], jnp.int32))
    for b, n in enumerate((1, 3)):
        alone = module.attention(q[b], k[b], v[b], interpret=POISONED, top_k=n)
        np.testing.assert_array_equal(np.asarray(mapped[b]), np.asarray(alone))


# -- what a call selected (return_selection) and traced amounts out of range -----------------

TILED = "{tiled: {frames: 1, rows: 5, cols: 8}}"


def _rule64(plan, module, q, k, amount):
    """(chosen, margin): the selection rule as its documentation states it, in float64 and
    written here (not svgen's reference_selection): per block row, the selectable blocks
    ranked by mean-pooled q . k * sm_scale in each head's kernel order, highest first;
    top_k keeps k, top_p the fewest whose softmax mass over the row's selectable blocks
    reaches p; the count clamped to [min, max] and to the selectable blocks. margin: the
    least gap between the last chosen and the first left-out score, and between a
    cumulative mass and p (for top_p), which must dwarf float32 rounding for the kernel's
    float32 choice to be this one."""
    select, shape = module.attention.select, module.SHAPE
    policy = select.policy
    qk, kk, _ = _kernel_order64(plan, q, k, k)
    rows_b, cols_b = select.selectable.shape
    pq, pk = _pool(qk, shape.cq, rows_b), _pool(kk, shape.ckv, cols_b)
    scores = np.einsum("rqd,rkd->rqk", pq, pk) / np.sqrt(q.shape[-1])
    chosen, margin = np.zeros(scores.shape, bool), np.inf
    for r, i in np.ndindex(scores.shape[:2]):
        columns = np.flatnonzero(select.selectable[i])
        if columns.size == 0:
            continue
        ranked = sorted(columns, key=lambda c: -scores[r, i, c])
        best = scores[r, i, ranked]
        if policy.rule == sel.TOP_K:
            count = amount
        else:
            mass = np.exp(best - best.max()) / np.exp(best - best.max()).sum()
            before = np.cumsum(mass) - mass
            count = int(np.sum(before < amount))
            margin = min(margin, np.abs(before - amount).min())
        count = min(max(count, policy.min_blocks), policy.max_blocks, len(ranked))
        if 0 < count < len(ranked):
            margin = min(margin, best[count - 1] - best[count])
        chosen[r, i, ranked[:count]] = True
    return chosen, margin


@pytest.mark.parametrize(
    "rule, layout, amount, jit",
    [(TOP_K, "frame_major", 2, False), (TOP_P, "frame_major", 0.6, False), (TOP_K, TILED, 3, True)],
    ids=["top_k", "top_p", "tiled_top_k_jit"],
)
def test_return_selection_gives_the_blocks_the_rule_chooses(
    compile_text, rule, layout, amount, jit
):
    """attention(..., return_selection=True) -> (o, selected): selected bool [batch, heads,
    row blocks, col blocks] in each head's kernel order, equal to the float64 rule; o bit
    for bit the call's without it, and float64 attention under the mask and those blocks
    (NaN-poisoned interpret mode)."""
    plan, module = compile_text(spec_text(rule, layout=layout, name="ret"))
    select = module.attention.select
    q, k, v = _inputs(np.random.default_rng(15), (2, 2), module.SEQ_LEN, module.HEAD_DIM)
    want, margin = _rule64(plan, module, q, k, amount)
    assert margin > 1e-4, "a decision within float32 rounding: pick another seed"
    assert want.any() and (want != select.selectable).any(), "the rule chose all or nothing"

    def call(q, k, v, amount, return_selection=False):
        kwargs = {select.policy.rule: amount, "return_selection": return_selection}
        return module.attention(q, k, v, interpret=POISONED, **kwargs)

    run = jax.jit(call, static_argnames="return_selection") if jit else call
    out, selected = run(q, k, v, amount, return_selection=True)
    assert selected.dtype == jnp.bool_ and selected.shape == (2, 2) + select.selectable.shape
    np.testing.assert_array_equal(np.asarray(selected).reshape(want.shape), want)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(run(q, k, v, amount)))
    np.testing.assert_allclose(
        np.asarray(out), _attention_under(plan, module, q, k, v, want), atol=2e-5, rtol=0
    )


def test_traced_top_p_out_of_range_selects_min_or_every_finite_block():
    """A traced p cannot raise: NaN or below 0 selects `min` blocks per row (as p = 0),
    above 1 every selectable block of finite score, the count clamped to [min, max]
    (docs/runtime.md)."""
    rng = np.random.default_rng(21)
    rows, cols = 9, 13
    selectable = rng.random((rows, cols)) < 0.6
    policy = sel.SelectPolicy(sel.TOP_P, 0.5, 3, 5)
    scores = _scores(rng, (3, rows, cols), specials=False)
    scores[rng.random(scores.shape) < 0.35] = -np.inf
    available = np.broadcast_to(selectable.sum(-1), scores.shape[:-1])
    finite = (selectable & np.isfinite(scores)).sum(-1)
    run = jax.jit(lambda p: sel.select_blocks(jnp.asarray(scores), selectable, policy, p))
    at_zero = np.asarray(run(jnp.float32(0.0)))
    np.testing.assert_array_equal(at_zero.sum(-1), np.minimum(policy.min_blocks, available))
    for p in (np.nan, -1.0, -np.inf):
        np.testing.assert_array_equal(np.asarray(run(jnp.float32(p))), at_zero)
    most = np.minimum(np.clip(finite, policy.min_blocks, policy.max_blocks), available)
    assert (finite > policy.max_blocks).any() and (finite < policy.min_blocks).any()
    for p in (2.0, np.inf):
        got = np.asarray(run(jnp.float32(p)))
        np.testing.assert_array_equal(got.sum(-1), most)
        every = (finite <= policy.max_blocks)[..., None] & selectable & np.isfinite(scores)
        assert np.all(got[every]), "a block of finite score left out"


def test_traced_top_p_out_of_range_in_a_call(compile_text):
    """Under jax.jit (one compile), min 0 and max every block column: a traced p of NaN or -1
    attends the mask alone, 2.0 every candidate block, against float64."""
    plan, module = compile_text(spec_text("top_p: {p: 0.5, min: 0, max: 12}", name="wild_p"))
    select = module.attention.select
    assert select.selectable.sum(-1).max() <= 12
    q, k, v = _inputs(np.random.default_rng(16), (2,), module.SEQ_LEN, module.HEAD_DIM)
    run = jax.jit(
        lambda q, k, v, p: module.attention(
            q, k, v, interpret=POISONED, top_p=p, return_selection=True
        )
    )
    nothing = np.zeros((2,) + select.selectable.shape, bool)
    every = np.broadcast_to(select.selectable, nothing.shape)
    for p, want in ((np.nan, nothing), (-1.0, nothing), (2.0, every)):
        out, selected = run(q, k, v, jnp.float32(p))
        np.testing.assert_array_equal(np.asarray(selected), want, err_msg=f"p = {p}")
        np.testing.assert_allclose(
            np.asarray(out), _attention_under(plan, module, q, k, v, want), atol=2e-5, rtol=0
        )
    assert run._cache_size() == 1


@pytest.mark.parametrize("per_block", [1, 8, 128], ids=["one_row", "eight_rows", "every_row"])
def test_sampled_scores_equal_their_float64_reference(per_block):
    """sampled_block_scores against its documented meaning; with every row sampled it is the
    log of each block's exact mean attention mass (the dense softmax pooled by blocks)."""
    from svgen.core.tables import KernelShape

    rng = np.random.default_rng(per_block)
    seq, d, rows_b, cols_b = 700, 32, 6, 6  # the last blocks hold padding
    shape = KernelShape(seq, 768, 256, 256, d, 2, compute_q=128, compute_kv=128)
    q, k = (rng.standard_normal((2, seq, d)).astype(np.float32) for _ in range(2))
    got = sel.sampled_block_scores(
        jnp.asarray(q), jnp.asarray(k), shape, rows_b, cols_b, 0.3, per_block
    )
    want = _sampled_scores(
        q.astype(np.float64), k.astype(np.float64), shape, rows_b, cols_b, 0.3, per_block
    )
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5)
    if per_block == 128:  # block row 0: every one of its rows sampled
        logits = np.einsum("rsd,rnd->rsn", q.astype(np.float64), k.astype(np.float64)) * 0.3
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        blocks = [probs[:, :128, c * 128 : (c + 1) * 128].sum(-1).mean(-1) for c in range(cols_b)]
        np.testing.assert_allclose(np.asarray(got)[:, 0], np.log(np.stack(blocks, -1)), atol=2e-5)


def test_sampled_rows_are_read_checked_and_in_the_digest():
    base = parse_spec(spec_text(TOP_P))
    sampled = parse_spec(spec_text(SAMPLED_TOP_P))
    assert sampled.select.sampled_rows == 8 and base.select.sampled_rows == 0
    assert sampled.digest != base.digest
    for bad in ("0", "65", "2.5", "many"):
        with pytest.raises(SpecError, match="sampled_rows") as err:
            parse_spec(spec_text(TOP_P + f"\n  sampled_rows: {bad}"))
        assert err.value.key == "select.sampled_rows"


def test_heads_selection_is_refused_by_the_cost_model():
    from svgen.analysis import analyze
    from svgen.estimate.cost import check_costable

    text = HEADS_SPEC % dict(name="cost", assign="[spatial, temporal, spatial]", rule=TOP_K)
    plan = analyze(parse_spec(text, source="s.yaml"))
    with pytest.raises(SpecError, match="models a selection of one pattern") as err:
        check_costable(plan)
    assert err.value.key == "select"


def test_heads_selection_compiles_for_v5e_both_directions(compile_text):
    """Mosaic and libtpu accept the kernels of heads of two patterns walking per-call tables
    (AOT for a v5e on this host: only that they compile)."""
    text = HEADS_SPEC % dict(name="aot", assign="[spatial, temporal, spatial]", rule=TOP_P)
    _, module = compile_text(text.replace("dtype: float32", "dtype: bfloat16"))
    hlo = v5e_gradient_hlo(module, batch=2)
    assert hlo.count("tpu_custom_call") >= 2  # the forward and the dk/dv walk


def test_selection_over_a_video_curve(compile_text):
    """Jenga's setting over the whole video: blocks of a 3-D curve chosen by their scores."""
    text = (
        spec_text(layout="{curve: hilbert, over: video}", name="carve")
        .replace("- first_frame: {frames: 1}", "- band: {width: 40}")
        .replace("- spatial_window: {frames: 1}", "- prefix: {tokens: 30}")
        .replace("candidate: {spatial_window: {frames: 3}}", "candidate: {spatial_window: {}}")
    )
    plan, module = compile_text(text)
    assert plan.patterns[0].layout.curve_over_video
    q, k, v = _inputs(np.random.default_rng(8), (2,), module.SEQ_LEN, module.HEAD_DIM)
    out = np.asarray(module.attention(q, k, v, interpret=POISONED, top_k=2))
    want, _ = _reference(plan, module, q, k, v, 2)
    np.testing.assert_allclose(out, want, atol=2e-5, rtol=0)
