"""A PNG of the tile map: one square of pixels per tile, colored by kind, with a title.

Pixels are placed with `figimage` (no resampling), so tile (i, j) is exactly the square at
row TITLE_PX + i*scale, column j*scale: reviewers get a faithful picture and tests can read
colors back. Grids wider than MAX_CELLS are downsampled the same way as the text map.
"""

from __future__ import annotations

import numpy as np

from svgen.codegen.tilemap import downsample
from svgen.runtime.kinds import TileKind

COLORS = {  # RGB
    TileKind.FULL: (31, 78, 160),
    TileKind.BOUNDARY: (240, 150, 40),
    TileKind.EMPTY: (245, 245, 245),
}
TITLE_PX = 48
TARGET_PX = 640
MIN_WIDTH_PX = 800  # room for the title
MAX_CELLS = 1280


def tile_image(kinds: np.ndarray) -> tuple[np.ndarray, int]:
    """RGB uint8 image of the (downsampled) tile map and the pixels per tile side."""
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
    height, width = image.shape[0] + TITLE_PX, max(image.shape[1], MIN_WIDTH_PX)
    dpi = 100
    fig = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, facecolor="white")
    fig.figimage(image, xo=0, yo=0, origin="upper")
    legend = "   ".join(f"{k.name.lower()}" for k in (TileKind.FULL, TileKind.BOUNDARY,
                                                      TileKind.EMPTY))
    fig.text(0.01, 1 - 4 / height, title, va="top", ha="left", fontsize=9)
    fig.text(0.01, 1 - 26 / height, f"colors: {legend} (blue, orange, light grey); q tiles "
             f"down, kv tiles across", va="top", ha="left", fontsize=8, color="#444444")
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": None})
    return width, height
