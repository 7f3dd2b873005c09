"""The kernel backends as the shared kernel tests see them (tests/test_kernel_base.py): how
each builds its `attention` from a compiled module and runs it on the CPU, unwritten output
poisoned (the TPU interpreter starts buffers as NaN; the GPU one pads operands and starts
outputs with NaN), and which dtypes it is checked in. A new backend is one more entry. And
what either backend's call hands its kernel functions (record_kernel_variants)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from kernel_helpers import POISONED


@dataclasses.dataclass(frozen=True)
class KernelBackend:
    name: str
    dtypes: tuple[str, ...]
    attention_of: Callable  # module -> its attention on this backend
    # (attention, q, k, v, head_pattern or None) -> o, in the interpreter, poisoned
    run: Callable

    def __str__(self) -> str:  # the test ids
        return self.name


def _run_tpu(attention, q, k, v, head_pattern=None):
    hp = None if head_pattern is None else np.asarray(head_pattern)
    return attention(q, k, v, head_pattern=hp, interpret=POISONED)


def _gpu_attention(module):
    from svgen.runtime import gpu

    return gpu.gpu_attention_of(module)


def _run_gpu(attention, q, k, v, head_pattern=None):
    """Under jit with a traced head_pattern, as a model calls it."""
    if head_pattern is None:
        return attention(q, k, v, interpret=True)
    run = jax.jit(lambda q, k, v, hp: attention(q, k, v, head_pattern=hp, interpret=True))
    return run(q, k, v, jnp.asarray(head_pattern, jnp.int32))


def record_kernel_variants(monkeypatch, owner, *names: str) -> list:
    """Wrap each kernel function ``owner.NAME`` (such as svgen.runtime.forward's
    _attention_kernel) so that every call appends (its variant, how many refs it was given)
    to the list returned, then runs the kernel."""
    seen = []
    for name in names:
        real = getattr(owner, name)

        def recording(*refs, variant, real=real):
            seen.append((variant, len(refs)))
            return real(*refs, variant=variant)

        monkeypatch.setattr(owner, name, recording)
    return seen


TPU = KernelBackend("tpu", ("float32", "bfloat16"), lambda module: module.attention, _run_tpu)
GPU = KernelBackend("gpu", ("float32",), _gpu_attention, _run_gpu)
BACKENDS = (TPU, GPU)
# (backend, dtype) pairs, for parametrize
BACKEND_DTYPES = [(b, d) for b in BACKENDS for d in b.dtypes]
