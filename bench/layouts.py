"""Frame-major vs temporal-major order for Sparse VideoGen's heads, and frame-major vs tiled
order for Sliding Tile Attention, as tables.

    python bench/layouts.py

For the Wan 720p temporal head (same place in every frame + first frame) and spatial head
(+-1 frame + first frame), at 75,600 and 399,600 tokens with 512 x 512 tiles: tile counts,
visited fraction, grid steps doing work and the analysis time, in both layouts. The
temporal-major layout keeps the first frame as an anchor block at the front.

Second table: STA at HunyuanVideo's size (30 x 48 x 80 latents, no text), a window of 3 x 3
x 3 cubes of 6 x 8 x 8 (`cube_window`), at 384 x 384 tiles (one cube), in frame-major order
and in the tiled layout of the same cubes.
"""

from __future__ import annotations

import time

from svgen import ir
from svgen.analysis import TileGrid
from svgen.analysis.classify import classify_tiles
from svgen.analysis.tables import build_runs, kernel_tiles
from svgen.core.layout import Tiled, TokenLayout

STA_CUBE = (6, 8, 8)
STA_MASK = ir.CubeWindow(*STA_CUBE, 1, 1, 1)

HEADS = {
    "temporal": ir.AnyOf((ir.FirstFrame(1), ir.TemporalStride(0, 0, 1, None))),
    "spatial": ir.AnyOf((ir.FirstFrame(1), ir.SpatialWindow(1, None, None))),
}


def measure(head: str, frames: int, order: str) -> dict:
    mask = HEADS[head]
    layout = TokenLayout(
        frames, 45, 80, 0, "last", order, mask.anchor_frames() if order == "temporal_major" else 0
    )
    return _classified(head, mask, layout, TileGrid(layout.seq_len, 512, 512))


def measure_sta(order: str) -> dict:
    layout = TokenLayout(30, 48, 80)
    layout = layout.with_order(Tiled(*STA_CUBE)) if order == "tiled" else layout
    return _classified("sta", STA_MASK, layout, TileGrid(layout.seq_len, 384, 384))


def _classified(head: str, mask, layout: TokenLayout, grid: TileGrid) -> dict:
    start = time.perf_counter()
    c = classify_tiles(mask, layout, grid)
    runs = build_runs(*kernel_tiles(c.kinds, grid, grid), grid)
    seconds = time.perf_counter() - start
    counts = [(c.kinds == k).sum() for k in (2, 1, 0)]
    return {
        "head": head,
        "tokens": layout.seq_len,
        "order": layout.order,
        "full": counts[0],
        "boundary": counts[1],
        "empty": counts[2],
        "visited": (c.kinds != 0).mean(),
        "density": c.kept_pairs / layout.seq_len**2,
        "steps": int(runs[:, 2].sum()),
        "seconds": seconds,
    }


def main() -> None:
    print(
        "| head | tokens | order | full | boundary | empty | density | visited fraction "
        "| steps per head | analysis s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    cases = [
        ("temporal", frames, order)
        for frames in (21, 111)
        for order in ("frame_major", "temporal_major")
    ]
    # A spatial head in temporal-major order is the wrong choice (every tile is visited, one
    # key interval per place per row): shown at 75.6K only, it takes ~40 s to analyze.
    cases += [
        ("spatial", 21, "frame_major"),
        ("spatial", 21, "temporal_major"),
        ("spatial", 111, "frame_major"),
    ]
    for head, frames, order in cases:
        _print_row(measure(head, frames, order))
    print()
    print("Sliding Tile Attention, HunyuanVideo size, 384 x 384 tiles:")
    print()
    print(
        "| head | tokens | order | full | boundary | empty | density | visited fraction "
        "| steps per head | analysis s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for order in ("frame_major", "tiled"):
        _print_row(measure_sta(order))


def _print_row(r: dict) -> None:
    print(
        f"| {r['head']} | {r['tokens']:,} | {r['order']} | {r['full']:,} | "
        f"{r['boundary']:,} | {r['empty']:,} | {r['density']:.4f} | "
        f"{r['visited']:.4f} | {r['steps']:,} | {r['seconds']:.2f} |"
    )


if __name__ == "__main__":
    main()
