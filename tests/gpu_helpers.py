"""A helper the GPU kernel tests, the run-time segment tests and the KV-cache tests share (no
test module imports another): lowering a GPU attention call for CUDA on this CPU-only host
and verifying the Triton IR it builds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax._src.pallas.triton import lowering as triton_lowering


def verified_triton_module(call, *args) -> str:
    """Lower jax.jit(call) at ``args`` (arrays or ShapeDtypeStructs) for CUDA (no device
    needed) and verify the Triton module it builds: one Triton kernel; returns its text."""
    modules = []
    original = triton_lowering.lower_jaxpr_to_triton_module

    def verify(*args, **kwargs):
        result = original(*args, **kwargs)
        result.module.operation.verify()  # raises MLIRError naming the op
        modules.append(str(result.module))
        return result

    triton_lowering.lower_jaxpr_to_triton_module = verify
    try:
        text = jax.jit(call).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    finally:
        triton_lowering.lower_jaxpr_to_triton_module = original
    assert text.count("__gpu$xla.gpu.triton") == 1 and len(modules) == 1
    return modules[0]


def verified_triton_lowering(attention, q, head_pattern):
    """`attention` with a traced head_pattern, lowered and verified as above; the module text."""
    hp = jnp.asarray(head_pattern, jnp.int32)
    return verified_triton_module(
        lambda q, k, v, hp: attention(q, k, v, head_pattern=hp), q, q, q, hp
    )
