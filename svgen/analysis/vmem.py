"""The TPU kernel's VMEM: what a pattern's kernel keeps there of its printed masks (its query
values), the need at a tiling, and the one check of a tiling against the chip, which the
analysis makes before it classifies anything."""

from __future__ import annotations

from typing import Callable

from svgen import ir
from svgen.analysis.targets import MIB, VMEM_RESERVE, Target, VmemNeed, kernel_vmem
from svgen.spec import Spec
from svgen.spec.errors import SpecError


def query_coordinate_bound(mask: ir.Node) -> int:
    """At most how many query coordinates the mask's generated code reads (the kernel keeps
    each in VMEM, see svgen.runtime.forward): one per query symbol of its predicate, is_text
    twice (as bool and as int), and `place` when both rows and columns are read."""
    names = {s.name for s in mask.predicate().free_symbols if s.name.endswith("_q")}
    return len(names) + ("is_text_q" in names) + ({"h_q", "w_q"} <= names)


def pattern_query_values(spec: Spec, mask: ir.Node, printed) -> int:
    """How many query values (coordinates and query functions, each a [block_q, 128] int32
    buffer) a pattern's kernel keeps: those its printed masks read (`printed`, its
    MaskFunctions: svgen.analysis.mask_functions), at least the mask's query symbols
    (query_coordinate_bound, what the VMEM model counted before it counted the printed
    code; kept so that no module's VMEM limit moved). An aligned pattern's printed mask
    reads nothing."""
    return max(query_coordinate_bound(mask), printed.value_count)


def vmem_need(spec: Spec, chip: Target, query_coords: int = 0, tiles=None) -> VmemNeed:
    """The kernel's VMEM need on `chip` at `tiles` (block_q, block_kv, compute_q, compute_kv;
    None: the spec's tiling)."""
    t = spec.tiling
    bq, bkv, cq, ckv = tiles or (t.block_q, t.block_kv, t.cq, t.ckv)
    a = spec.attention
    return kernel_vmem(bq, bkv, cq, ckv, a.head_dim, a.dtype, query_coords, chip.mxu_width)


def check_vmem(spec: Spec, chip: Target, query_coords: int = 0, need_at: Callable = vmem_need):
    """The kernel's VMEM need on `chip`; a SpecError (with a tiling that fits) when over.
    need_at: the VMEM model (vmem_need, or the one an analysis's Settings name)."""
    t = spec.tiling

    def _spec_vmem(*tiles: int) -> VmemNeed:
        return need_at(spec, chip, query_coords, tiles)

    need = _spec_vmem(t.block_q, t.block_kv, t.cq, t.ckv)
    available = chip.vmem_bytes - VMEM_RESERVE
    if need.limit() <= available:
        return need
    bq, bkv, cq, ckv = t.block_q, t.block_kv, t.cq, t.ckv
    while _spec_vmem(bq, bkv, cq, ckv).limit() > available and max(bq, bkv) > 128:
        # Halve the larger side (and its compute block with it when it is the whole tile).
        if bq >= bkv:
            bq, cq = bq // 2, min(cq, bq // 2)
        else:
            bkv, ckv = bkv // 2, min(ckv, bkv // 2)
    hint = (
        f"tiling {{block_q: {bq}, block_kv: {bkv}, compute_q: {cq}, compute_kv: {ckv}}} "
        f"would fit ({_spec_vmem(bq, bkv, cq, ckv).limit() / MIB:.0f} MiB)"
    )
    raise SpecError(
        f"the kernel needs {need.limit() / MIB:.1f} MiB of VMEM at {t.block_q} x {t.block_kv} "
        f"tiles with {t.cq} x {t.ckv} compute blocks (blocks {need.pipeline / MIB:.1f}, "
        f"scratch {need.scratch / MIB:.1f}, compiler spills {need.temporaries / MIB:.1f} MiB), "
        f"over the {available / MIB:.0f} MiB a kernel may use on {chip.name} "
        f"({chip.vmem_bytes / MIB:.0f} MiB per TensorCore); {hint}",
        file=spec.source,
        key=spec.tiling_source(spec.tiling_chip),
    )
