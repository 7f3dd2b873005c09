"""Residual masks: each spec's kernel with and without them, in one static model.

    .venv/bin/python bench/residual_cost.py [SPEC ...]

For every spec (default: the patterns written from their papers in bench/paper_specs/ and
the shipped specs whose BOUNDARY blocks get residual masks), the kernel is compiled twice
for TPU v6e by libtpu on this host and costed from its schedule (`svgen cost`, cached): with
every BOUNDARY block running the whole mask (`analyze(..., residual_masks=False)`), and with
the residual masks of svgen.analysis.residuals. Printed per spec: the BOUNDARY compute blocks
and how many run a residual mask; the bundles of a BOUNDARY block running the whole mask
(without variants, and with them: the variant dispatch's cost shows there) and running each
residual, each also as a multiple of a FULL block's body; the modelled call without and with,
and svgen's own kernel on a dense mask at the same tiling. Milliseconds assume the clock in
svgen.analysis.targets (static model: no DMA stalls); the ratios are the result.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from svgen.estimate import tpu_schedule  # noqa: E402

tpu_schedule.ensure_dump_flags()  # before anything starts libtpu

from svgen.estimate import cost  # noqa: E402
from svgen.estimate.paths import mean_rounded  # noqa: E402
from svgen.analysis import analyze  # noqa: E402
from svgen.core.kinds import TileKind  # noqa: E402
from svgen.spec import load_spec  # noqa: E402

DEFAULT_SPECS = [
    "bench/paper_specs/natten_3x7x7.yaml",
    "bench/paper_specs/natten_3x7x7_dilated.yaml",
    "bench/paper_specs/radial_wan21_720p.yaml",
    "specs/wan21_720p_frame_decay.yaml",
    "specs/hunyuan_720p_text.yaml",
    "specs/hunyuan_720p_mixed.yaml",
    "specs/cogvideox_mixed.yaml",
]


def _full_block(paths, plan, index: int) -> float:
    """Bundles of a FULL compute block's body: a FULL tile's over its blocks."""
    return (paths.full - paths.bookkeeping) / plan.spec.tiling.compute_blocks


def _row(path: str) -> list[str]:
    spec = load_spec(path)
    plain = analyze(spec, residual_masks=False)
    with_variants = analyze(spec)
    before = cost.cost_plan(plain, path, progress=None)
    after = cost.cost_plan(with_variants, path, progress=None)
    rows = []
    for index, pattern in enumerate(with_variants.patterns):
        boundary = int((pattern.compute_kinds == TileKind.BOUNDARY).sum())
        found = pattern.residuals
        full = _full_block(before.paths, plain, index)
        whole_before = mean_rounded([b for _, b, _ in before.paths.block[index]])
        whole_after = mean_rounded([b for _, b, _ in after.paths.block[index]])
        variants = "-"
        on_variants = 0
        if found is not None and after.paths.residual_block:
            per_variant = list(zip(*after.paths.residual_block[index]))
            variants = ", ".join(
                f"{mean_rounded([c for c, _ in costs])} ({mean_rounded([c for c, _ in costs]) / full:.2f}x)"
                for costs in per_variant
            )
            on_variants = sum(v.blocks for v in found.variants)
        label = spec.name if len(with_variants.patterns) == 1 else f"{spec.name} [{pattern.name}]"
        rows.append(
            [
                label,
                f"{boundary:,}",
                f"{on_variants:,}",
                f"{whole_before} ({whole_before / full:.2f}x)",
                f"{whole_after}",
                variants,
            ]
        )
    ms = [r.cycles / (r.clock_ghz * 1e6) for r in (before, after)]
    dense = after.dense_cycles / (after.clock_ghz * 1e6)
    rows[-1] += [f"{ms[0]:.2f}", f"{ms[1]:.2f}", f"{dense:.2f}", f"{dense / ms[1]:.2f}x"]
    for r in rows[:-1]:
        r += ["", "", "", ""]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=DEFAULT_SPECS)
    args = parser.parse_args()
    header = [
        "spec",
        "BOUNDARY blocks",
        "on residuals",
        "whole mask, before (x FULL)",
        "whole mask, after",
        "residual masks 1, 2, 3 (x FULL)",
        "ms before",
        "ms after",
        "dense ms",
        "vs dense",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for path in args.specs:
        for row in _row(str(REPO / path) if not pathlib.Path(path).is_absolute() else path):
            print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
