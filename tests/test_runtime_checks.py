"""Run-time argument checks at the call: wrong head_pattern, wrong arrays, wrong dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import REPO, scaled_spec_text
from kernel_helpers import POISONED, mixed_inputs


@pytest.fixture
def mixed(compile_text):
    """A two-pattern kernel (run-time assignment) for 4 heads, float32."""
    return compile_text(scaled_spec_text(REPO / "specs" / "wan21_720p_mixed.yaml", heads=4))


@pytest.mark.parametrize(
    "head_pattern, error, words",
    [
        ([0, 1, 0], ValueError, "shape (4,)"),
        ([[0, 1, 0, 1]], ValueError, "shape (4,)"),
        ([0.0, 1.0, 0.0, 1.0], TypeError, "integers"),
        ([True, False, True, False], TypeError, "integers"),
        ([0, 1, 2, 0], ValueError, "0..1; got [2]"),
        ([0, -1, 0, 99], ValueError, "got [-1, 99]"),
    ],
)
def test_bad_head_pattern_is_an_error(mixed, head_pattern, error, words):
    plan, module = mixed
    q, k, v = mixed_inputs(plan, "float32", seed=0)
    with pytest.raises(error) as info:
        module.attention(q, k, v, head_pattern=np.asarray(head_pattern), interpret=True)
    assert words in str(info.value)


def test_traced_head_pattern_out_of_range_gives_nan_heads(mixed):
    """Under jit values cannot raise: a head whose value is no pattern index comes out NaN
    (never the clamped pattern's result, which would pass for its own); the other heads are
    exactly what a valid assignment gives them, and no table is read out of bounds."""
    plan, module = mixed
    q, k, v = mixed_inputs(plan, "float32", seed=1)
    run = jax.jit(lambda hp: module.attention(q, k, v, head_pattern=hp, interpret=POISONED))
    wild = np.asarray(run(jnp.asarray([-5, 0, 7, 1], jnp.int32)))
    valid = np.asarray(run(jnp.asarray([0, 0, 1, 1], jnp.int32)))
    assert np.isnan(wild[[0, 2]]).all()
    np.testing.assert_array_equal(wild[[1, 3]], valid[[1, 3]])
    assert np.isfinite(valid).all()


def test_traced_head_pattern_out_of_range_gives_nan_gradients(mixed):
    plan, module = mixed
    q, k, v = mixed_inputs(plan, "float32", seed=3)

    @jax.jit
    def grads(hp):
        loss = lambda q, k, v: module.attention(q, k, v, head_pattern=hp, interpret=True).sum()
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    for g in grads(jnp.asarray([0, 2, 1, 0], jnp.int32)):
        g = np.asarray(g)
        assert np.isnan(g[1]).all() and np.isfinite(g[[0, 2, 3]]).all()


def test_gpu_module_traced_head_pattern_out_of_range_gives_nan_heads(compile_text):
    plan, module = compile_text(
        scaled_spec_text(REPO / "specs" / "wan21_720p_mixed.yaml", heads=4), target_name="h100"
    )
    q, k, v = mixed_inputs(plan, "float32", seed=4)
    run = jax.jit(lambda hp: module.attention(q, k, v, head_pattern=hp, interpret=True))
    wild = np.asarray(run(jnp.asarray([0, 3, 1, -1], jnp.int32)))
    valid = np.asarray(run(jnp.asarray([0, 1, 1, 1], jnp.int32)))
    assert np.isnan(wild[[1, 3]]).all()
    np.testing.assert_array_equal(wild[[0, 2]], valid[[0, 2]])
    with pytest.raises(ValueError, match="got \\[3, -1\\]"):
        module.attention(q, k, v, head_pattern=np.asarray([0, 3, 1, -1]), interpret=True)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda q: q.astype(jnp.int32), TypeError, "floating array"),
        (lambda q: np.asarray(q).tolist(), TypeError, "must be an array"),
        (lambda q: q.astype(jnp.bfloat16), TypeError, "compiled for float32"),
    ],
)
def test_bad_operands_are_errors(mixed, make, error, words):
    plan, module = mixed
    q, k, v = mixed_inputs(plan, "float32", seed=2)
    q, k, v = make(q), make(k), make(v)
    with pytest.raises(error, match=None) as info:
        module.attention(q, k, v, head_pattern=np.array([0, 1, 0, 1]), interpret=True)
    assert words in str(info.value)


def test_operand_dtypes_must_agree(mixed):
    plan, module = mixed
    q, k, v = mixed_inputs(plan, "float32", seed=3)
    with pytest.raises(TypeError, match="dtypes differ"):
        module.attention(q, k.astype(jnp.bfloat16), v, head_pattern=np.array([0, 1, 0, 1]))


@pytest.mark.parametrize("num_queries", [0, -3, 2.5])
def test_profile_needs_a_positive_number_of_queries(mixed, num_queries):
    plan, module = mixed
    q, k, v = mixed_inputs(plan, "float32", seed=4)
    with pytest.raises(ValueError, match="num_queries must be a positive integer"):
        module.profile(q, k, v, key=jax.random.PRNGKey(0), num_queries=num_queries)


def test_more_heads_than_the_spec_says_how_to_run_them(compile_text):
    """q with more heads than the spec, no head_pattern: the error says a head_pattern runs
    any number of heads, and with one it runs."""
    plan, module = compile_text(scaled_spec_text(REPO / "specs" / "wan21_720p_band.yaml", heads=2))
    q, k, v = mixed_inputs(plan, "float32", seed=5, heads=3)
    with pytest.raises(ValueError, match="any number of heads runs when you pass head_pattern"):
        module.attention(q, k, v, interpret=True)
    out = module.attention(q, k, v, head_pattern=np.zeros(3, np.int32), interpret=POISONED)
    assert np.asarray(out).shape == q.shape and np.isfinite(np.asarray(out)).all()
