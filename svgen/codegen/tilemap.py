"""A text picture of the tile kinds: q tiles down, kv tiles across, one glyph per cell.

Large grids are downsampled: a cell covers a block of tiles and shows FULL or EMPTY only when
every tile in it is, BOUNDARY otherwise (a mixed cell needs the mask somewhere).
"""

from __future__ import annotations

import numpy as np

from svgen.core.kinds import TileKind


def downsample(kinds: np.ndarray, max_rows: int, max_cols: int) -> tuple[np.ndarray, int, int]:
    """(cells, tiles per cell down, tiles per cell across); cells are square in tiles."""
    nq, nk = kinds.shape
    step_q = step_k = max(-(-nq // max_rows), -(-nk // max_cols))
    rows = -(-nq // step_q)
    cols = -(-nk // step_k)
    cells = np.empty((rows, cols), np.int8)
    for i in range(rows):
        block_rows = kinds[i * step_q : (i + 1) * step_q]
        for j in range(cols):
            block = block_rows[:, j * step_k : (j + 1) * step_k]
            if np.all(block == TileKind.FULL):
                cells[i, j] = TileKind.FULL
            elif np.all(block == TileKind.EMPTY):
                cells[i, j] = TileKind.EMPTY
            else:
                cells[i, j] = TileKind.BOUNDARY
    return cells, step_q, step_k


def render_tile_map(kinds: np.ndarray, max_rows: int = 40, max_cols: int = 60) -> list[str]:
    cells, step_q, step_k = downsample(kinds, max_rows, max_cols)
    glyph = {int(k): k.glyph for k in TileKind}
    if step_q == step_k == 1:
        scale = "one cell per tile"
    else:
        scale = f"one cell per {step_q} x {step_k} tiles; mixed cells show as BOUNDARY"
    legend = "   ".join(
        f"{k.glyph} {k.name}" for k in (TileKind.FULL, TileKind.BOUNDARY, TileKind.EMPTY)
    )
    lines = [f"q tiles down, kv tiles across ({scale})", legend]
    lines += ["".join(glyph[int(c)] for c in row) for row in cells]
    return lines
