"""Multi-device: heads sharded with shard_map, and the Ulysses recipe for sequence-sharded
activations, on 4 virtual CPU devices, against the unsharded call: outputs, and gradients
through both recipes (jax.grad through shard_map, the all-to-alls and the kernel's VJP)."""

from helpers import REPO, run_on_cpu_devices

SPEC = str(REPO / "specs" / "wan21_720p_mixed.yaml")

SCRIPT = """
    from helpers import compile_spec_text, scaled_spec_text
    from svgen.runtime.sharding import ulysses

    assert len(jax.devices()) == 4
    plan, module = compile_spec_text(
        scaled_spec_text(pathlib.Path({spec!r}), heads=8), pathlib.Path(tempfile.mkdtemp()))
    rng = np.random.default_rng(0)
    shape = (2, 8, plan.layout.seq_len, 128)  # [batch, heads, seq, d]
    q, k, v = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(3))
    head_pattern = jnp.asarray([0, 1, 1, 0, 1, 0, 0, 1], jnp.int32)
    expected = np.asarray(module.attention(q, k, v, head_pattern=head_pattern, interpret=True))

    mesh = Mesh(np.array(jax.devices()), ("x",))
    heads = P(None, "x", None, None)
    by_heads = jax.jit(jax.shard_map(
        lambda q, k, v, hp: module.attention(q, k, v, head_pattern=hp, interpret=True),
        mesh=mesh, in_specs=(heads, heads, heads, P("x")), out_specs=heads, check_vma=False))
    got = np.asarray(by_heads(q, k, v, head_pattern))
    print("heads-sharded max diff", np.max(np.abs(got - expected)))
    assert np.max(np.abs(got - expected)) <= 1e-6

    seq = P(None, None, "x", None)
    by_sequence = jax.jit(jax.shard_map(
        lambda q, k, v, hp: ulysses(module.attention, q, k, v, axis_name="x",
                                    head_pattern=hp, interpret=True),
        mesh=mesh, in_specs=(seq, seq, seq, P()), out_specs=seq, check_vma=False))
    got = np.asarray(by_sequence(q, k, v, head_pattern))
    print("sequence-sharded (Ulysses) max diff", np.max(np.abs(got - expected)))
    assert np.max(np.abs(got - expected)) <= 1e-6
    print("OK")
"""


def test_shard_map_over_heads_and_ulysses_match_the_unsharded_call():
    run_on_cpu_devices(SCRIPT, 4, spec=SPEC)


# Gradients of sum(attention(q, k, v) * do) through each recipe against the unsharded
# gradient, and all three against the float64 reference. The sharded recipes run the same
# per-head kernels as the unsharded call (the all-to-alls only move data, and their
# transposes are all-to-alls back), so on CPU the sharded gradients agree bitwise. The bound
# 1e-6 absolute (the forward test's; the largest entries are ~2) leaves room for another
# XLA fusion order and nothing more: a wrong head pattern, a shard routed to the wrong
# device, or a dropped or doubled cotangent moves entries by far more. Against float64 the
# kernel's own float32 error is ~5e-7 relative (norm), ~1.3e-6 max abs; 1e-5 relative is
# 10x tighter than test_backward's float32 bound.
GRAD_SCRIPT = '''
    from helpers import compile_spec_text, scaled_spec_text
    from kernel_helpers import reference_grads
    from svgen.runtime.sharding import ulysses

    assert len(jax.devices()) == 4
    plan, module = compile_spec_text(
        scaled_spec_text(pathlib.Path({spec!r}), heads=8), pathlib.Path(tempfile.mkdtemp()))
    rng = np.random.default_rng(1)
    shape = (2, 8, plan.layout.seq_len, 128)  # [batch, heads, seq, d]: 2 heads per device
    q, k, v, do = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(4))
    pattern = np.asarray([0, 1, 1, 0, 1, 0, 0, 1])  # shards [0, 1], [1, 0], [1, 0], [0, 1]
    head_pattern = jnp.asarray(pattern, jnp.int32)

    def grads(attention):
        """dq, dk, dv of sum(attention(q, k, v, hp) * do), under jit (eager interpret-mode
        gradients stall)."""
        loss = lambda q, k, v, hp: jnp.sum(attention(q, k, v, hp) * do)
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        return [np.asarray(g) for g in grad(q, k, v, head_pattern)]

    mesh = Mesh(np.array(jax.devices()), ("x",))
    heads, seq = P(None, "x", None, None), P(None, None, "x", None)
    unsharded = lambda q, k, v, hp: module.attention(q, k, v, head_pattern=hp, interpret=True)
    # check_vma=False as for the forward pass (the kernel's pallas_call outputs carry no
    # varying-mesh-axis annotation); the backward kernels need nothing more.
    by_heads = jax.shard_map(unsharded, mesh=mesh, in_specs=(heads, heads, heads, P("x")),
                             out_specs=heads, check_vma=False)
    by_sequence = jax.shard_map(
        lambda q, k, v, hp: ulysses(module.attention, q, k, v, axis_name="x",
                                    head_pattern=hp, interpret=True),
        mesh=mesh, in_specs=(seq, seq, seq, P()), out_specs=seq, check_vma=False)

    want = grads(unsharded)
    reference = reference_grads(plan, q, k, v, pattern, do)
    for recipe, attention in (("unsharded", None), ("heads-sharded", by_heads),
                              ("sequence-sharded (Ulysses)", by_sequence)):
        got = want if attention is None else grads(attention)
        for name, a, b, r in zip(("dq", "dk", "dv"), got, want, reference):
            assert a.shape == shape and np.all(np.isfinite(a)), (recipe, name)
            diff = float(np.max(np.abs(a - b)))
            error = float(np.linalg.norm(a - r) / np.linalg.norm(r))
            print(f"{{recipe}} {{name}}: max diff {{diff:.2e}} vs unsharded, "
                  f"relative error {{error:.2e}} vs float64")
            assert diff <= 1e-6, (recipe, name, diff)
            assert error <= 1e-5, (recipe, name, error)
    print("OK")
'''


def test_gradients_through_shard_map_over_heads_and_ulysses_match_the_unsharded_ones():
    print(run_on_cpu_devices(GRAD_SCRIPT, 4, spec=SPEC))
