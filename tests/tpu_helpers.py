"""Helpers several test modules share (no test module imports another): AOT compiles for
TPU v6e (or another TPU) on this CPU-only host, reading data movement out of compiled HLO, and specs used by
more than one module."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
from jax.experimental import topologies


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


CUBE_DMA_SPEC = """\
svgen: 1
name: sta_dma
geometry: {frames: 4, height: 8, width: 16}
attention: {heads: 2, head_dim: 128, dtype: DTYPE}
layout: {tiled: {frames: 2, rows: 4, cols: 16}}
mask: {any_of: [{cube_window: {cube_frames: 2, cube_rows: 4, cube_cols: 16, frames: 1, rows: 0, cols: 0}}, {spatial_window: {frames: 0, rows: 1, cols: 3}}]}
tiling: {block_q: 128, block_kv: 128}
"""

MIXED_SPEC = """\
svgen: 1
name: mixed_permute
geometry: {frames: 4, height: 8, width: 24, text_tokens: 40}
attention: {heads: 3, head_dim: 128, dtype: DTYPE}
patterns:
  spatial: {any_of: [{first_frame: {frames: 1}}, {spatial_window: {frames: 1}}]}
  temporal: {any_of: [{first_frame: {frames: 1}}, {temporal_stride: {rows: 0, cols: 1}}]}
heads:
  candidates:
    - {pattern: spatial}
    - {pattern: temporal, layout: temporal_major}
  assign: runtime
tiling: {block_q: 128, block_kv: 128}
"""
