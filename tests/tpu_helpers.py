"""Helpers several test modules share (no test module imports another): AOT compiles for
TPU v6e (or another TPU) on this CPU-only host, reading data movement out of compiled HLO, a
TPU kernel's heads against float64 under one keep mask, and specs used by more than one
module."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies

from helpers import TOLERANCE
from spec_corpus import ANCHOR, SPATIAL, any_of, spec_text
from svgen.runtime.reference import masked_attention_reference


@functools.lru_cache(maxsize=2)
def tpu_device(topology_name: str = "v6e:2x2"):
    topology = topologies.get_topology_desc(platform="tpu", topology_name=topology_name)
    return topology.devices[0]


def v6e_device():
    return tpu_device("v6e:2x2")


def compile_for_v6e(module, dtype=None, batch=None, topology_name: str = "v6e:2x2"):
    """The module's forward call AOT-compiled for a TPU (v6e unless topology_name says)."""
    sharding = jax.sharding.SingleDeviceSharding(tpu_device(topology_name))
    lead = (module.HEADS,) if batch is None else (batch, module.HEADS)
    arg = jax.ShapeDtypeStruct(
        lead + (module.SEQ_LEN, module.HEAD_DIM),
        jnp.dtype(dtype or module.DTYPE),
        sharding=sharding,
    )
    # The head -> pattern assignment is a traced argument, as when it comes from profile().
    head_pattern = jax.ShapeDtypeStruct((module.HEADS,), jnp.int32, sharding=sharding)

    def run(q, k, v, hp):
        return module.attention(q, k, v, head_pattern=hp)

    return jax.jit(run).lower(arg, arg, arg, head_pattern).compile()


def v5e_gradient_hlo(module, batch=None, **call_kwargs) -> str:
    """The compiled HLO of jax.grad of a module's call through q, k and v (and call_kwargs,
    such as segment ids), AOT for a TPU v5e on this host (bf16 inputs): that Mosaic and
    libtpu take the forward and backward kernels, not that they fit the chip's VMEM at run
    time or run fast."""
    device = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    lead = (module.HEADS,) if batch is None else (batch, module.HEADS)
    arg = jax.ShapeDtypeStruct(
        lead + (module.SEQ_LEN, module.HEAD_DIM), jnp.bfloat16, sharding=sharding
    )

    def loss(q, k, v):
        return jnp.sum(module.attention(q, k, v, **call_kwargs).astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(arg, arg, arg).compile().as_text()


def check_heads_on_keep(out, q, k, v, keep, dtype):
    """Each head of a kernel's output ([heads, seq, d]) against float64 attention of its q, k,
    v under ``keep`` (the user's order): every row written and finite, and the relative error
    within TOLERANCE[dtype]."""
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite output rows"
    for head in range(len(out)):
        q64, k64, v64 = (
            np.asarray(jnp.asarray(x[head], jnp.float32), np.float64) for x in (q, k, v)
        )
        ref = masked_attention_reference(q64, k64, v64, keep)
        err = np.max(np.abs(out[head] - ref)) / np.max(np.abs(ref))
        assert err <= TOLERANCE[dtype], f"head {head}: relative error {err:.2e}"


def mosaic_kernels(hlo: str) -> list[str]:
    """The Pallas kernels libtpu compiled into a program, in program order: the name of each
    tpu_custom_call instruction's pallas_call, from its op_name metadata, without the
    transformations around it ("transpose(jvp(svgen_attention_dkv))": svgen_attention_dkv)."""
    pattern = r'custom_call_target="tpu_custom_call"[^\n]*op_name="(?:[^"]*/)?([^"/]+)/pallas_call"'
    return [re.search(r"(\w+)\)*$", name)[1] for name in re.findall(pattern, hlo)]


def data_movement(hlo: str) -> set[str]:
    """The JAX ops behind XLA instructions that move q, k, v or o data (floating results, by
    their op_name metadata; the int32 head tables may be gathered)."""
    pattern = r'= (?:f32|bf16)\[[^\n]*op_name="[^"]*/(transpose|gather|concatenate|copy)[^"/]*"'
    return set(re.findall(pattern, hlo))


CUBE_DMA_SPEC = spec_text(
    "sta_dma",
    (4, 8, 16),
    2,
    dtype="DTYPE",
    layout="{tiled: {frames: 2, rows: 4, cols: 16}}",
    mask=any_of(
        "{cube_window: {cube_frames: 2, cube_rows: 4, cube_cols: 16, frames: 1, rows: 0, cols: 0}}",
        "{spatial_window: {frames: 0, rows: 1, cols: 3}}",
    ),
)

MIXED_SPEC = spec_text(
    "mixed_permute",
    (4, 8, 24, 40),
    3,
    dtype="DTYPE",
    patterns={
        "spatial": SPATIAL,
        "temporal": any_of(ANCHOR, "{temporal_stride: {rows: 0, cols: 1}}"),
    },
    layouts={"temporal": "temporal_major"},
)
