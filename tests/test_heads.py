"""Per-head patterns: temporal-major layouts, mixed heads in one call, online profiling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import MIXED_SPECS, REPO, scaled_spec_text
from kernel_helpers import POISONED, check_per_head, mixed_inputs


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", MIXED_SPECS)
def test_mixed_heads_traced_pattern_equal_dense_references(name, dtype, compile_text):
    plan, module = compile_text(
        scaled_spec_text(REPO / "specs" / f"{name}.yaml", heads=4, dtype=dtype)
    )
    assert [p.layout.order for p in plan.patterns] == ["frame_major", "temporal_major"]
    q, k, v = mixed_inputs(plan, dtype, seed=len(name))
    head_pattern = jnp.asarray([1, 0, 0, 1], jnp.int32)
    run = jax.jit(
        lambda q, k, v, hp: module.attention(q, k, v, head_pattern=hp, interpret=POISONED)
    )
    check_per_head(plan, run(q, k, v, head_pattern), q, k, v, head_pattern, dtype)


def test_static_assignment_and_all_heads_one_pattern(compile_text):
    text = scaled_spec_text(REPO / "specs" / "wan21_720p_mixed.yaml", heads=4).replace(
        "assign: runtime", "assign: [temporal, spatial, temporal, temporal]"
    )
    plan, module = compile_text(text)
    assert module.HEAD_PATTERN == (1, 0, 1, 1)
    q, k, v = mixed_inputs(plan, "float32", seed=5)
    check_per_head(
        plan, module.attention(q, k, v, interpret=POISONED), q, k, v, module.HEAD_PATTERN, "float32"
    )
    everything_temporal = jnp.ones(4, jnp.int32)
    check_per_head(
        plan,
        module.attention(q, k, v, head_pattern=everything_temporal, interpret=POISONED),
        q,
        k,
        v,
        everything_temporal,
        "float32",
    )


def test_runtime_assignment_requires_head_pattern(compile_text):
    plan, module = compile_text(scaled_spec_text(REPO / "specs" / "wan21_720p_mixed.yaml", heads=4))
    q, k, v = mixed_inputs(plan, "float32", seed=1)
    with pytest.raises(ValueError, match="assigned at run time: pass head_pattern"):
        module.attention(q, k, v, interpret=True)


def planted_inputs(plan, kinds, seed, strength=6.0):
    """q = k with a shared component per frame (spatial heads) or per place (temporal)."""
    lay = plan.layout
    rng = np.random.default_rng(seed)
    d = plan.spec.attention.head_dim
    s = lay.tokens_per_frame
    original = np.arange(lay.seq_len)
    video = original - lay.video_start
    is_text = (video < 0) | (video >= lay.video_tokens)
    frame, place = np.where(is_text, 0, video // s), np.where(is_text, 0, video % s)
    frame_vec = rng.standard_normal((lay.frames, d)) / np.sqrt(d)
    place_vec = rng.standard_normal((s, d)) / np.sqrt(d)
    heads = []
    for kind in kinds:
        base = frame_vec[frame] if kind == 0 else place_vec[place]
        x = strength * base * np.sqrt(np.sqrt(d)) + 0.3 * rng.standard_normal((lay.seq_len, d))
        x[is_text] = 0.3 * rng.standard_normal((int(is_text.sum()), d))
        heads.append(x)
    q = np.stack(heads).astype(np.float32)
    v = rng.standard_normal(q.shape).astype(np.float32)
    return q, q.copy(), v


@pytest.mark.parametrize("name", ["wan21_720p_mixed", "cogvideox_mixed"])
def test_profiling_recovers_planted_head_kinds(name, compile_text):
    plan, module = compile_text(scaled_spec_text(REPO / "specs" / f"{name}.yaml", heads=8))
    right = total = 0
    profile = jax.jit(module.profile)
    for seed in range(4):
        kinds = np.random.default_rng(seed).integers(0, 2, 8)
        q, k, v = planted_inputs(plan, kinds, seed)
        chosen = np.asarray(profile(q, k, v, key=jax.random.PRNGKey(seed)))
        right += int(np.sum(chosen == kinds))
        total += kinds.size
    assert right / total >= 0.95, f"{right}/{total} heads recovered"


def test_temporal_major_visits_far_fewer_tiles_for_the_shipped_temporal_pattern():
    """The Wan temporal pattern at 512 x 512 tiles, in frame-major and temporal-major order."""
    import dataclasses

    from svgen.analysis import analyze
    from svgen.spec import Tiling, load_spec

    def at_512(name):
        spec = load_spec(REPO / "specs" / f"{name}.yaml")
        return analyze(dataclasses.replace(spec, tiling=Tiling(512, 512)))

    temporal = {p.name: p for p in at_512("wan21_720p_mixed").patterns}["temporal"]
    frame_major = at_512("wan21_720p_temporal").only
    assert temporal.layout.order == "temporal_major" and temporal.layout.anchor_frames == 1
    assert temporal.classification.kept_pairs == frame_major.classification.kept_pairs
    assert temporal.visited_fraction < frame_major.visited_fraction / 4  # 0.077 vs 0.316
    assert temporal.tile_counts()["boundary"] * 8 < frame_major.tile_counts()["boundary"]


def _pallas_calls(jaxpr):
    """Every pallas_call equation in a jaxpr and the jaxprs nested in it (custom_vjp...)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else ():
            yield from _pallas_calls(sub)
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                yield from _pallas_calls(inner)
            elif hasattr(param, "eqns"):
                yield from _pallas_calls(param)


def _pallas_grid(fn, *args):
    """The grid of the one attention pallas_call in fn's jaxpr (temporal-major heads add the
    permutation kernels of svgen.runtime.permute around it)."""
    eqns = [
        e
        for e in _pallas_calls(jax.make_jaxpr(fn)(*args).jaxpr)
        if e.params["name"] == "svgen_attention"
    ]
    assert len(eqns) == 1
    return tuple(eqns[0].params["grid_mapping"].grid)


@pytest.mark.parametrize("name", MIXED_SPECS)
def test_each_head_walks_only_its_own_patterns_pieces(name, compile_text):
    """Mixed heads on a one-TensorCore chip: the grid holds each head's own pattern's pieces,
    one after another, and a pattern's pieces are exactly its visited tiles."""
    plan, module = compile_text(scaled_spec_text(REPO / "specs" / f"{name}.yaml", heads=4))
    tables = module.attention.tables
    assert tables.flat and tables.slots == 1
    for index, pattern in enumerate(plan.patterns):
        assert int(tables.num_pieces[index]) == pattern.table.visited_steps
    assert len(set(tables.num_pieces.tolist())) == 2  # the patterns differ in length
    q, k, v = mixed_inputs(plan, "float32", seed=3)
    head_pattern = np.array([1, 0, 0, 1])
    grid = _pallas_grid(
        lambda q, k, v: module.attention(q, k, v, head_pattern=head_pattern, interpret=True),
        q,
        k,
        v,
    )
    assert grid == (1, int(tables.num_pieces[head_pattern].sum()), 1)
    # The cost model walks the same tables: no skipped step.
    from svgen.estimate.cost import PathCosts, model_cycles

    paths = PathCosts(1, 2, (3, 3), (((4, 5, 6),) * 4,) * 2, (7, 7), 8, 9)
    _, steps, _ = model_cycles(paths, tables, head_pattern)
    assert steps["skipped"] == 0
    assert steps["full"] + steps["mixed"] + steps["empty"] == grid[1]


def test_two_tensor_core_targets_keep_the_per_head_walk(compile_text):
    """v7x splits the head axis over its two TensorCores: every head walks the longest
    pattern's pieces (the rest are skipped steps)."""
    text = scaled_spec_text(REPO / "specs" / "wan21_720p_mixed.yaml", heads=4)
    plan, module = compile_text(text, target_name="v7x")
    tables = module.attention.tables
    assert not tables.flat and module.TENSOR_CORES == 2
    q, k, v = mixed_inputs(plan, "float32", seed=4)
    head_pattern = jnp.asarray([1, 0, 0, 1], jnp.int32)
    grid = _pallas_grid(
        lambda q, k, v: module.attention(q, k, v, head_pattern=head_pattern, interpret=True),
        q,
        k,
        v,
    )
    assert grid == (4, tables.max_pieces, tables.slots)
    check_per_head(
        plan,
        module.attention(q, k, v, head_pattern=head_pattern, interpret=POISONED),
        q,
        k,
        v,
        head_pattern,
        "float32",
    )
