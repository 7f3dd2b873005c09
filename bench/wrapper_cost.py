"""What the wrapper around the kernel costs: layout permutations, scaling and padding in HBM.

    .venv/bin/python bench/wrapper_cost.py

A generated `attention` permutes q, k, v into each head's kernel order (scaling q and padding
to tiles in the same pass) and permutes o back. Those are XLA ops, not the kernel: they read
and write whole tensors in HBM. Here the wrapper alone (the kernel replaced by an optimization
barrier, so XLA cannot fuse across it) is AOT-compiled for TPU v6e, XLA's own cost analysis
gives the bytes it accesses, and bytes / HBM bandwidth (1.64 TB/s) is its time: a floor,
since these ops are bandwidth-bound. The kernel's time is `svgen cost`'s static model. One
"tensor pass" is one read or one write of a [heads, seq_len, head_dim] tensor. The stand-in
reads q, k, v and writes o, as the kernel does: 4.0 passes means the wrapper adds none, and
the "wrapper" columns count only what is above those 4.

Temporal-major heads are permuted by svgen's permute kernel (svgen/runtime/permute.py: every
element read once and written once, frame-major heads of a mixed spec copied whole), or, in
the rows marked "XLA permutation", by XLA's reshape + transpose as before that kernel. For the
permute kernel the floor is not its time: its DMAs and its in-VMEM transpose do not overlap,
see the module's docstring for its bundles per block.

Rows marked "token_order=kernel" call `attention(..., token_order="kernel")`: q, k, v arrive in
each head's kernel order and o leaves in it (a model that keeps its activations in that
order converts once with `attention.to_kernel_order`, not per call).

The last two rows are Sliding Tile Attention at HunyuanVideo's size (30 x 48 x 80 latents,
24 heads, no text; a window of 3 x 3 x 3 cubes of 6 x 8 x 8) in the tiled layout with one cube
per tile: with the kernel's cube DMA (tiles read and written as boxes of the user's array) and
with it switched off (q, k, v permuted into cube order, o back), the kernel's cost modelled
for each (the box DMA costs bundles per step).
"""

from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from svgen.estimate import tpu_schedule  # noqa: E402

tpu_schedule.ensure_dump_flags()  # before anything starts libtpu

import contextlib  # noqa: E402
import functools  # noqa: E402
import importlib.util  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402
from jax import lax  # noqa: E402

from svgen import codegen  # noqa: E402
from svgen.estimate import cost  # noqa: E402
from svgen.analysis import analyze  # noqa: E402
from svgen.runtime import kernel, permute  # noqa: E402
from svgen.spec import parse_spec  # noqa: E402

HBM_BYTES_PER_S = 1.64e12  # TPU v6e
KERNEL_PASSES = 4  # the kernel's own: q, k, v read, o written
MIXED_5_5 = {
    "candidates": [{"pattern": "spatial"}, {"pattern": "temporal", "layout": "temporal_major"}],
    "assign": ["spatial", "temporal"] * 5,
}
CASES = [
    # label, spec, overrides, head_pattern: "static" (the spec's) or "traced"
    ("band (frame-major: identity)", "wan21_720p_band.yaml", {}, "static"),
    (
        "temporal, temporal-major, permute kernel",
        "wan21_720p_temporal.yaml",
        {"layout": "temporal_major"},
        "static",
    ),
    (
        "temporal, temporal-major, token_order=kernel",
        "wan21_720p_temporal.yaml",
        {"layout": "temporal_major", "token_order": "kernel"},
        "static",
    ),
    (
        "temporal, temporal-major, XLA permutation",
        "wan21_720p_temporal.yaml",
        {"layout": "temporal_major", "permute_kernel": False},
        "static",
    ),
    (
        "mixed, static 5 + 5, permute kernel",
        "wan21_720p_mixed.yaml",
        {"heads": MIXED_5_5},
        "static",
    ),
    (
        "mixed, static 5 + 5, XLA permutation",
        "wan21_720p_mixed.yaml",
        {"heads": MIXED_5_5, "permute_kernel": False},
        "static",
    ),
    ("mixed, traced head_pattern, permute kernel", "wan21_720p_mixed.yaml", {}, "traced"),
    (
        "mixed, traced head_pattern, token_order=kernel",
        "wan21_720p_mixed.yaml",
        {"token_order": "kernel"},
        "traced",
    ),
    (
        "mixed, traced head_pattern, XLA permutation",
        "wan21_720p_mixed.yaml",
        {"permute_kernel": False},
        "traced",
    ),
    ("STA cubes, tiled, cube DMA", "STA", {}, "static"),
    ("STA cubes, tiled, permuted", "STA", {"cube_dma": False}, "static"),
]

STA = """\
svgen: 1
name: hunyuan_sta
geometry: {frames: 30, height: 48, width: 80}
attention: {heads: 24, head_dim: 128, dtype: bfloat16}
layout: {tiled: {frames: 6, rows: 8, cols: 8}}
mask: {cube_window: {cube_frames: 6, cube_rows: 8, cube_cols: 8, frames: 1, rows: 1, cols: 1}}
tiling: {block_q: 384, block_kv: 384}
"""


class _Patched:
    """Within: `module.name` is `value` (the bench's switches for what generated modules
    built inside do: no cube DMA, or XLA's permutation instead of the permute kernel)."""

    def __init__(self, module, name: str, value):
        self.module, self.name, self.value = module, name, value

    def __enter__(self):
        self.real = getattr(self.module, self.name)
        setattr(self.module, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.real)


def _module(text: str, name: str):
    plan = analyze(parse_spec(text, source=name))
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="svgen_wrapper_"))
    for filename, data in codegen.render(plan, f"specs/{name}").items():
        (tmp / filename).write_bytes(data)
    spec = importlib.util.spec_from_file_location(
        f"_wrapper_{plan.spec.name}", tmp / codegen.module_filename(plan.spec.name)
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return plan, module


def _wrapper_bytes(module, traced: bool, token_order: str) -> float:
    """Bytes XLA's cost analysis gives for the wrapper alone on v6e."""
    real = kernel.flat_attention

    def stand_in(q, k, v, *args, **kwargs):
        # The kernel's HBM footprint: q, k and v read once, o written once. All three operands
        # must be consumed: a barrier whose k and v outputs go unused lets XLA drop their
        # permutations (the first version of this bench did, and counted only q's and o's).
        q, k, v = lax.optimization_barrier((q, k, v))
        return q + k + v

    kernel.flat_attention = stand_in
    try:
        sharding = tpu_schedule.tpu_sharding("v6e")
        arg = jax.ShapeDtypeStruct(
            (module.HEADS, module.SEQ_LEN, module.HEAD_DIM),
            jnp.dtype(module.DTYPE),
            sharding=sharding,
        )
        call = functools.partial(module.attention, token_order=token_order)
        if traced:
            hp = jax.ShapeDtypeStruct((module.HEADS,), jnp.int32, sharding=sharding)
            lowered = jax.jit(lambda q, k, v, h: call(q, k, v, head_pattern=h)).lower(
                arg, arg, arg, hp
            )
        else:
            lowered = jax.jit(lambda q, k, v: call(q, k, v)).lower(arg, arg, arg)
        analysis = lowered.compile().cost_analysis()
    finally:
        kernel.flat_attention = real
    if isinstance(analysis, list):
        analysis = analysis[0]
    return float(analysis["bytes accessed"])


def main() -> None:
    print(
        "| case | HBM bytes, all | tensor passes, all | wrapper passes | "
        "wrapper ms (at 1.64 TB/s) | kernel ms (svgen cost) | wrapper / kernel |"
    )
    print("|" + "---|" * 7)
    kernel_ms_of = {}  # spec text -> the kernel's modelled ms (the switches leave it alone)
    for label, filename, overrides, head_pattern in CASES:
        overrides = dict(overrides)
        token_order = overrides.pop("token_order", "user")
        switches = contextlib.ExitStack()
        if not overrides.pop("cube_dma", True):
            switches.enter_context(_Patched(kernel, "cube_dma", lambda layouts, shape: None))
        if not overrides.pop("permute_kernel", True):
            switches.enter_context(_Patched(permute, "applies", lambda layouts: False))
        if filename == "STA":
            text, filename = STA, "hunyuan_sta.yaml"
        else:
            spec = yaml.safe_load((REPO / "specs" / filename).read_text())
            for key, value in overrides.items():
                spec.pop("mask" if key == "heads" else "", None)
                spec[key] = value
            text = yaml.safe_dump(spec, sort_keys=False)
        with switches:
            plan, module = _module(text, filename)
            traced = head_pattern == "traced"
            total = _wrapper_bytes(module, traced, token_order)
            if text not in kernel_ms_of or filename == "hunyuan_sta.yaml":
                # Uncached: both STA rows share the kernel source and the masks, but the cube
                # DMA changes the kernel.
                kernel_ms_of[text] = cost.cost_plan(plan, f"specs/{filename}", use_cache=False).ms
            kernel_ms = kernel_ms_of[text]
        tensor = (
            module.HEADS
            * module.SEQ_LEN
            * module.HEAD_DIM
            * np.dtype(jnp.dtype(module.DTYPE)).itemsize
        )
        wrapper = total - KERNEL_PASSES * tensor
        wrapper_ms = wrapper / HBM_BYTES_PER_S * 1e3
        print(
            f"| {label} | {total / 1e6:,.0f} MB | {total / tensor:.1f} | "
            f"{wrapper / tensor:.1f} | {wrapper_ms:.2f} | {kernel_ms:.2f} | {wrapper_ms / kernel_ms:.1%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
