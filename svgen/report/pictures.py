"""A PNG of the tile map: one square of pixels per tile, colored by kind, with a title, a
legend of color swatches and axes numbered in tiles.

Pixels are placed with `figimage` (no resampling), so tile (i, j) is exactly the square at
row TOP_PX + i*scale, column LEFT_PX + j*scale: reviewers get a faithful picture and tests
can read colors back. The axes are drawn over the same rectangle, transparent, only for their
ticks. Grids larger than MAX_CELLS are downsampled the same way as the text map (a cell of
several tiles is FULL or EMPTY only when all its tiles are); the ticks still count tiles.
"""

from __future__ import annotations

import numpy as np

from svgen.codegen.tilemap import downsample
from svgen.core.kinds import TileKind

COLORS = {  # RGB
    TileKind.FULL: (31, 78, 160),
    TileKind.BOUNDARY: (240, 150, 40),
    TileKind.EMPTY: (245, 245, 245),
}
MEANING = {  # legend text: what the kernel does on a tile of this kind
    TileKind.FULL: "FULL: computed, no mask",
    TileKind.BOUNDARY: "BOUNDARY: computed with the mask",
    TileKind.EMPTY: "EMPTY: skipped",
}
TITLE_PX = 48  # title line and legend line
AXIS_PX = 36  # kv tick labels and axis name, between the legend and the map
TOP_PX = TITLE_PX + AXIS_PX  # first pixel row of the map
LEFT_PX = 64  # q tick labels and axis name
BOTTOM_PX = 8
RIGHT_PX = 16
TARGET_PX = 640
MIN_WIDTH_PX = 800  # room for the title
MAX_CELLS = 1280
DPI = 100
TICK_PX = 64  # at most one axis tick per this many pixels, so that labels never overlap


def tile_image(kinds: np.ndarray) -> tuple[np.ndarray, int]:
    """RGB uint8 image of the (downsampled) tile map and the pixels per cell side."""
    cells, _, _ = downsample(kinds, MAX_CELLS, MAX_CELLS)
    scale = max(1, TARGET_PX // max(cells.shape))
    palette = np.zeros((3, 3), np.uint8)
    for kind, rgb in COLORS.items():
        palette[kind] = rgb
    image = palette[cells.astype(np.intp)]
    return np.repeat(np.repeat(image, scale, axis=0), scale, axis=1), scale


def write_tile_map_png(kinds: np.ndarray, path, title: str) -> tuple[int, int]:
    """Write the PNG; returns its (width, height) in pixels."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    image, _ = tile_image(kinds)
    cells, tiles_per_cell, _ = downsample(kinds, MAX_CELLS, MAX_CELLS)
    map_h, map_w = image.shape[:2]
    width = max(LEFT_PX + map_w + RIGHT_PX, MIN_WIDTH_PX)
    height = TOP_PX + map_h + BOTTOM_PX
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, facecolor="white")
    fig.figimage(image, xo=LEFT_PX, yo=BOTTOM_PX, origin="upper")
    _title_and_legend(fig, title, width, height)
    # The axes span whole cells, in tiles (past the last tile when the last cell is partial).
    rows, cols = (n * tiles_per_cell for n in cells.shape)
    _tile_axes(
        fig,
        (LEFT_PX / width, BOTTOM_PX / height, map_w / width, map_h / height),
        (rows, cols),
        (map_h, map_w),
    )
    fig.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
    return width, height


def _title_and_legend(fig, title: str, width: int, height: int) -> None:
    from matplotlib.patches import Patch

    fig.text(4 / width, 1 - 4 / height, title, va="top", ha="left", fontsize=9)
    swatches = [
        Patch(facecolor=np.array(COLORS[k]) / 255, edgecolor="#888888", label=MEANING[k])
        for k in (TileKind.FULL, TileKind.BOUNDARY, TileKind.EMPTY)
    ]
    fig.legend(
        handles=swatches,
        loc="upper left",
        bbox_to_anchor=(0, 1 - 20 / height),
        ncol=3,
        frameon=False,
        fontsize=8,
        handlelength=1.2,
        handleheight=1.0,
        borderaxespad=0.2,
        columnspacing=1.5,
    )


def _tile_axes(fig, rect, tiles: tuple[int, int], pixels: tuple[int, int]) -> None:
    """Transparent axes over the map: kv tiles across (on top), q tiles down, in tile units
    (a tick at t is the edge where tile t begins), about one tick per TICK_PX pixels."""
    from matplotlib.ticker import MaxNLocator

    ax = fig.add_axes(rect, facecolor="none")
    ax.set_xlim(0, tiles[1])
    ax.set_ylim(tiles[0], 0)  # q tile 0 at the top, as in the text map
    for axis, extent in ((ax.yaxis, pixels[0]), (ax.xaxis, pixels[1])):
        axis.set_major_locator(MaxNLocator(nbins=max(1, min(8, extent // TICK_PX)), integer=True))
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("kv tile", fontsize=8, labelpad=2)
    ax.set_ylabel("q tile", fontsize=8, labelpad=2)
    ax.tick_params(labelsize=7, length=3, pad=1)
    for spine in ax.spines.values():
        spine.set_color("#888888")
        spine.set_linewidth(0.5)
