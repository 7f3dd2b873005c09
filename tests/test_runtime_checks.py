"""Run-time argument checks at the call: wrong head_pattern, wrong arrays, wrong dtype, and
every keyword a module does not declare refused."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import REPO, TWO_LEVEL, scaled_spec_text
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


# -- every run-time keyword is used or refused ------------------------------------------------

# attention()'s keywords that every module uses; the others only some modules declare.
ALWAYS_USED = {"head_pattern", "interpret", "sm_scale", "token_order"}
# A value of each optional keyword; refusals come before any shape check.
OPTIONAL_VALUES = {
    "segment_ids": np.zeros(1, np.int32),
    "text_lengths": np.int32(0),
    "q_frame_offset": 0,
    "top_k": 1,
    "top_p": 0.5,
    "return_selection": True,
}
RUNTIME_INPUTS = "runtime: {segments: true, text_lengths: true}\n"
MODULES = [
    ("self_forcing_chunks", None, ""),
    ("self_forcing_rolling", None, ""),
    ("wan21_720p_select", TWO_LEVEL, ""),
    ("hunyuan_720p_text", None, RUNTIME_INPUTS),
    ("wan21_720p_band", None, ""),
]


@pytest.mark.parametrize("name, tiling, extra", MODULES, ids=[m[0] for m in MODULES])
def test_every_keyword_a_module_does_not_declare_is_refused(compile_text, name, tiling, extra):
    """Issue 44: nothing accepted silently. Each keyword of attention() beyond the ones every
    module uses is in the module's signature (its spec declares it) or refused, naming
    itself, by the full-sequence call and, where the module has one, by the chunked call."""
    from svgen.runtime.calls import Attention

    keywords = set(inspect.signature(Attention.__call__).parameters) - {"self", "q", "k", "v"}
    assert keywords - ALWAYS_USED == set(OPTIONAL_VALUES), "a new keyword: add it here"
    text = scaled_spec_text(REPO / "specs" / f"{name}.yaml", tiling=tiling) + extra
    _, module = compile_text(text)
    declared = set(inspect.signature(module.attention).parameters)
    assert ALWAYS_USED <= declared
    q = jnp.zeros((2, module.SEQ_LEN, module.HEAD_DIM), jnp.float32)
    calls = [lambda **given: module.attention(q, q, q, interpret=True, **given)]
    cache = module.attention.kv_cache
    if cache is not None:
        chunk = jnp.zeros((2, cache.rows, module.HEAD_DIM), jnp.float32)
        ring = jnp.zeros((2, cache.cache_tokens, module.HEAD_DIM), jnp.float32)
        calls.append(
            lambda **given: module.attention(
                chunk, ring, ring, q_frame_offset=0, interpret=True, **given
            )
        )
    undeclared = set(OPTIONAL_VALUES) - declared
    assert undeclared, "every module leaves some keyword out"
    for keyword in sorted(undeclared):
        for call in calls:
            with pytest.raises(TypeError, match=f"^{keyword}: "):
                call(**{keyword: OPTIONAL_VALUES[keyword]})
