"""The analysis sizes the kernel's VMEM once, from the query values its masks' printed code
reads (svgen.analysis.mask_code): the limit a module asks for covers every query value its
kernels keep, and residual masks whose query values would not fit are left out (they are a
speed-up), never a refusal at rendering."""

from __future__ import annotations

import pytest

from helpers import REPO
from svgen import analysis
from svgen.analysis.targets import kernel_vmem, target

FEATURES = sorted((REPO / "bench" / "specs" / "features").glob("*.yaml"))


def _module_need(module, chip: str) -> int:
    """The VMEM limit the module's kernels need for the query values they keep."""
    keeps = max(len(p.query_coords) for p in module.attention.patterns)
    return kernel_vmem(
        int(module.BLOCK_Q),
        int(module.BLOCK_KV),
        int(module.COMPUTE_Q),
        int(module.COMPUTE_KV),
        int(module.HEAD_DIM),
        str(module.DTYPE),
        keeps,
        target(chip).mxu_width,
    ).limit()


@pytest.mark.parametrize("path", FEATURES, ids=[p.stem for p in FEATURES])
def test_the_module_asks_for_the_vmem_its_query_values_need(path, compile_text):
    plan, module = compile_text(path.read_text(), target_name="v5e")
    need = _module_need(module, "v5e")
    assert int(module.VMEM_LIMIT_BYTES) == plan.kernel.vmem.limit() >= need


def test_residual_masks_whose_query_values_do_not_fit_are_left_out(compile_text, monkeypatch):
    text = (REPO / "bench" / "specs" / "features" / "residual.yaml").read_text()
    plan, _ = compile_text(text, target_name="v5e")
    assert any(p.residuals is not None for p in plan.patterns)
    real = analysis.vmem_need
    calls = []

    def no_room(spec, chip, query_coords=0, tiles=None):
        """The residual masks' need (at the spec's tiling): over any chip's VMEM; the tiling
        check (check_vmem, which names its tiles) as it is."""
        if tiles is not None:
            return real(spec, chip, query_coords, tiles)
        calls.append(query_coords)
        need = real(spec, chip, query_coords)
        return type(need)(need.pipeline, need.scratch + chip.vmem_bytes, need.temporaries)

    monkeypatch.setattr(analysis, "vmem_need", no_room)
    plan, module = compile_text(text, target_name="v5e")
    assert calls  # asked once, for the patterns with their residual masks
    assert all(p.residuals is None for p in plan.patterns)
    assert module.attention.tables.variants is None
    need = _module_need(module, "v5e")
    assert int(module.VMEM_LIMIT_BYTES) >= need
