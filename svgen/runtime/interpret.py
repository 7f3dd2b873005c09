"""Running the kernels in Pallas's interpreters (CPU, no TPU): one guard they need.

Pallas's TPU interpreter (`interpret=pltpu.InterpretParams(...)`) simulates DMAs, semaphores
and clocks in io_callbacks that call back into JAX. Called eagerly, a pallas_call is
dispatched asynchronously: while its callbacks run, the caller goes on dispatching its next
eager ops, and the two can deadlock (seen with jax 0.10.2: the wrapper's `jnp.repeat` in
`steps.head_operands` waiting while the permute kernel's callback waited in the interpreter's
clock update; about 1 run in 3 of an eager `attention` with a temporal-major head). Under
`jax.jit` the whole call is one program and nothing is dispatched meanwhile.
"""

from __future__ import annotations

import jax


def settled(x, interpret):
    """x once computed, when it is the concrete result of an interpret-mode call (eager);
    otherwise x as it is (traced, or compiled for a TPU: nothing to wait for)."""
    if interpret and not isinstance(x, jax.core.Tracer):
        jax.block_until_ready(x)
    return x
