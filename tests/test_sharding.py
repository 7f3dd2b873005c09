"""Multi-device: heads sharded with shard_map, and the Ulysses recipe for sequence-sharded
activations, on 4 virtual CPU devices, against the unsharded call."""

import subprocess
import sys
import textwrap

from conftest import REPO

SCRIPT = textwrap.dedent('''
    import os, sys, tempfile, pathlib
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    sys.path.insert(0, {tests!r})
    from conftest import compile_spec_text
    from test_kernels import scaled_spec_text
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
''')


def test_shard_map_over_heads_and_ulysses_match_the_unsharded_call():
    script = SCRIPT.format(tests=str(REPO / "tests"),
                           spec=str(REPO / "specs" / "wan21_720p_mixed.yaml"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert "OK" in result.stdout
