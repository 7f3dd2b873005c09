"""`tiling.align`: aligned kinds and the exact pair budget against brute force (dense masks at
small geometries), the kernel against the float64 reference of the aligned mask, and the
rules of `balanced`."""

import jax.numpy as jnp
import numpy as np
import pytest

from svgen.analysis import analyze
from svgen.analysis.align import align_classification, balanced_order, promoted_blocks
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.spec.errors import SpecError
from svgen.core.kinds import TileKind
from svgen.runtime.reference import masked_attention_reference
from svgen.spec import ALIGN_MODES, canonical_json, parse_spec

from helpers import (
    aligned_user_keep,
    brute_force_align,
    check_budget,
    TOLERANCE,
    dense_keep,
    lower_mask_dict,
    random_layout,
    random_mask,
)
from kernel_helpers import POISONED, check_grads, mixed_inputs
from spec_corpus import spec_text

MODES = [m for m in ALIGN_MODES if m != "exact"]


@pytest.mark.parametrize("seed", range(60))
def test_random_masks_every_mode_against_brute_force(seed):
    rng = np.random.default_rng(1000 + seed)
    lay = random_layout(rng)
    bq, bkv = int(rng.choice([8, 16, 32])), int(rng.choice([8, 16, 24]))
    _, mask = lower_mask_dict(random_mask(rng, lay), lay, 128, 128)
    grid = TileGrid(lay.seq_len, bq, bkv)
    exact = classify_tiles(mask, lay, grid, count_pairs=True)
    assert exact.pairs is not None  # small: every open pair evaluated
    keep = dense_keep(mask, lay)
    for mode in MODES:
        got, budget = align_classification(exact, mode, grid)
        kinds, aligned = brute_force_align(keep, bq, bkv, mode)
        np.testing.assert_array_equal(got.kinds, kinds, err_msg=mode)
        assert got.kept_pairs == int(aligned.sum())
        check_budget(budget, keep, aligned)


def test_frame_invariant_masks_are_counted_too():
    """A temporal head (classified from one frame's rows without counts) counts its pairs on
    the general path."""
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(4, 3, 5, 0, "last", "frame_major", 0)
    _, mask = lower_mask_dict(
        {"any_of": [{"first_frame": {"frames": 1}}, {"temporal_stride": {"rows": 1, "cols": 1}}]},
        lay,
        128,
        128,
    )
    grid = TileGrid(lay.seq_len, 16, 8)
    exact = classify_tiles(mask, lay, grid, count_pairs=True)
    np.testing.assert_array_equal(exact.kinds, classify_tiles(mask, lay, grid).kinds)
    keep = dense_keep(mask, lay)
    for mode in MODES:
        got, budget = align_classification(exact, mode, grid)
        kinds, aligned = brute_force_align(keep, 16, 8, mode)
        np.testing.assert_array_equal(got.kinds, kinds)
        check_budget(budget, keep, aligned)


# ----------------------------------------------------------------------------- balanced
@pytest.mark.parametrize("seed", range(20))
def test_balanced_promotes_by_fraction_and_reaches_the_closest_count(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    real = rng.choice([64, 96, 128, 4096], n)
    kept = np.minimum(rng.integers(1, 4097, n), real - 1)
    kept[::3] = real[::3] // 2  # ties: a third of the blocks keep exactly half
    base = int(rng.integers(0, 10_000))
    target = base + int(kept.sum())
    promote = promoted_blocks("balanced", kept, real, base, target)
    fraction = kept / real
    if promote.any() and (~promote).any():  # no promoted block below a dropped one
        assert fraction[promote].min() >= fraction[~promote].max()
    reached = base + int(real[promote].sum())
    order = balanced_order(kept, real)
    prefixes = base + np.concatenate([[0], np.cumsum(real[order])])
    assert abs(reached - target) == np.abs(prefixes - target).min()
    # Ties in fraction go in (q, kv) order: the promoted ones are the earliest of a tie.
    for value in np.unique(fraction[promote]):
        tied = np.flatnonzero(fraction == value)
        chosen = promote[tied]
        assert np.all(chosen[: chosen.sum()])


def test_balanced_keeps_the_density_close_on_a_band():
    lay_text = aligned_spec((8, 8, 16), "band: {width: 300}", TWO_LEVEL_KEYS + ", align: balanced")
    pattern = analyze(parse_spec(lay_text)).only
    b = pattern.budget
    assert b.mode == "balanced"
    assert abs(b.aligned_pairs - b.exact_pairs) <= 128 * 128 // 2
    assert not np.any(pattern.compute_kinds == TileKind.BOUNDARY)


# ----------------------------------------------------------------------------- specs
TWO_LEVEL_KEYS = "block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128"
# An anchor frame and a window of places in every frame (520 tokens: a padding column).
ANCHORED_STRIDE = "any_of: [{first_frame: {frames: 1}}, {temporal_stride: {rows: 1, cols: 2}}]"


def aligned_spec(geometry, mask: str, tiling: str, layout=None) -> str:
    """Two heads of ``mask`` over ``geometry`` (frames, height, width), ``mask`` and
    ``tiling`` the entries of their flow mappings."""
    return spec_text(
        "aligned", geometry, 2, layout=layout, mask=f"{{{mask}}}", tiling=f"{{{tiling}}}"
    )


def test_align_is_read_and_keeps_old_digests():
    base = aligned_spec((2, 4, 16), "band: {width: 30}", "block_q: 128, block_kv: 128")
    plain = parse_spec(base)
    assert plain.tiling.align == "exact" and not plain.tiling.aligned
    explicit = parse_spec(base.replace("block_kv: 128}", "block_kv: 128, align: exact}"))
    assert explicit.digest == plain.digest  # exact is the default: the same spec
    nearest = parse_spec(base.replace("block_kv: 128}", "block_kv: 128, align: nearest}"))
    assert nearest.tiling.align == "nearest" and nearest.digest != plain.digest
    assert '"align":"nearest"' in canonical_json(nearest)
    assert '"align"' not in canonical_json(plain)


def test_bad_align_value_names_the_modes():
    text = aligned_spec(
        (2, 4, 16), "band: {width: 30}", "block_q: 128, block_kv: 128, align: round"
    )
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="specs/demo.yaml")
    assert info.value.key == "tiling.align"
    assert "must be one of exact, superset, subset, nearest, balanced, got 'round'" in str(
        info.value
    )


def test_inspect_summary_reports_the_budget():
    text = aligned_spec((5, 4, 26), "band: {width: 60}", TWO_LEVEL_KEYS + ", align: nearest")
    plan = analyze(parse_spec(text))
    s = plan.summary()
    assert s["align"] == "nearest"
    for key in (
        "exact_density",
        "density",
        "pairs_added",
        "pairs_dropped",
        "recall",
        "precision",
        "rows_emptied",
    ):
        assert key in s
    b = plan.only.budget
    assert s["density"] == b.density == plan.density
    assert s["exact_density"] == b.exact_density
    # 520 tokens: the last key column holds padding; it is aligned like every other.
    assert plan.only.compute_grid.seq_len % 128 != 0
    assert not np.any(plan.only.compute_kinds == TileKind.BOUNDARY)
    exact = analyze(parse_spec(text.replace(", align: nearest", ""))).summary()
    assert exact["align"] == "exact" and "pairs_added" not in exact


# ----------------------------------------------------------------------------- the kernel
def run_against_aligned_reference(plan, module, seed=0):
    rng = np.random.default_rng(seed)
    shape = (2, plan.layout.seq_len, 128)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    out = np.asarray(
        module.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), interpret=POISONED)
    )
    assert np.all(np.isfinite(out))
    keep = aligned_user_keep(plan.only)
    for head in range(2):
        ref = masked_attention_reference(
            q[head].astype(np.float64), k[head].astype(np.float64), v[head].astype(np.float64), keep
        )
        err = np.max(np.abs(out[head] - ref)) / max(np.max(np.abs(ref)), 1e-30)
        assert err <= TOLERANCE["float32"], err
        assert np.all(out[head][~keep.any(axis=1)] == 0.0)
    return out, keep


@pytest.mark.parametrize("mode", ["superset", "balanced"])
def test_kernel_is_exact_for_the_aligned_mask_with_padding(mode, compile_text):
    """520 tokens, temporal-major with an anchor frame: the padding column is aligned too (its
    FULL blocks mask the padding keys), and the generated mask decodes no coordinates."""
    text = aligned_spec(
        (5, 4, 26), ANCHORED_STRIDE, TWO_LEVEL_KEYS + f", align: {mode}", "temporal_major"
    )
    plan, module = compile_text(text)
    assert plan.only.budget.mode == mode
    assert module._PATTERNS[0].query_coords == () and module.boundary_mask(None, None) is True
    run_against_aligned_reference(plan, module)


def test_kernel_without_boundary_blocks_and_rows_emptied(compile_text):
    """512 tokens (no padding column): aligned kinds are FULL / EMPTY only. The diagonal of a
    self-only mask is dropped by `subset`; the rows of the first half keep a FULL block."""
    mask = 'any_of: [{spatial_window: {frames: 0, rows: 0, cols: 0}}, {expr: "i_q < 256 and i_k < 128"}]'
    text = aligned_spec((4, 8, 16), mask, TWO_LEVEL_KEYS + ", align: subset")
    plan, module = compile_text(text)
    pattern = plan.only
    assert not np.any(pattern.compute_kinds == TileKind.BOUNDARY)
    assert pattern.budget.rows_emptied == 256
    out, keep = run_against_aligned_reference(plan, module)
    assert int((~keep.any(axis=1)).sum()) == 256
    assert np.all(out[:, 256:] == 0.0)


def test_gradients_of_an_aligned_mask(compile_text):
    """jax.grad through an aligned kernel equals the float64 gradient of the aligned mask
    (the backward walks the same FULL / EMPTY blocks; padding keys in the last column)."""
    text = aligned_spec((5, 4, 26), ANCHORED_STRIDE, TWO_LEVEL_KEYS + ", align: balanced")
    plan, module = compile_text(text)
    q, k, v = mixed_inputs(plan, "float32", seed=4, heads=plan.spec.attention.heads)
    heads = [0] * plan.spec.attention.heads
    check_grads(plan, module, q, k, v, heads, "float32", keeps=[aligned_user_keep(plan.only)])
