"""A helper the GPU kernel tests and the run-time segment tests share (no test module
imports another): lowering a GPU attention for CUDA on this CPU-only host and verifying the
Triton IR it builds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax._src.pallas.triton import lowering as triton_lowering


def verified_triton_lowering(attention, q, head_pattern):
    """Lower `attention` for CUDA (no device needed) and verify the Triton module it builds;
    returns its text."""
    modules = []
    original = triton_lowering.lower_jaxpr_to_triton_module

    def verify(*args, **kwargs):
        result = original(*args, **kwargs)
        result.module.operation.verify()  # raises MLIRError naming the op
        modules.append(str(result.module))
        return result

    triton_lowering.lower_jaxpr_to_triton_module = verify
    try:
        hp = jnp.asarray(head_pattern, jnp.int32)
        text = (
            jax.jit(lambda q, k, v, hp: attention(q, k, v, head_pattern=hp))
            .trace(q, q, q, hp)
            .lower(lowering_platforms=("cuda",))
            .as_text()
        )
    finally:
        triton_lowering.lower_jaxpr_to_triton_module = original
    assert text.count("__gpu$xla.gpu.triton") == 1 and len(modules) == 1
    return modules[0]
