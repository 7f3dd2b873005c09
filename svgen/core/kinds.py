"""The tile kinds shared by the analysis, the tables and the kernels.

One enum, rendered into every generated file from here, so the meaning of 0/1/2 cannot drift
between the docs, the tables and the kernel.
"""

from __future__ import annotations

import enum


class TileKind(enum.IntEnum):
    """How a (q tile, kv tile) pair is run."""

    EMPTY = 0  # no allowed pair: never visited
    BOUNDARY = 1  # some pairs allowed: the kernel computes the mask from coordinates
    FULL = 2  # every real pair allowed: the kernel runs with no mask at all

    @property
    def glyph(self) -> str:
        """One character for text tile maps."""
        return _GLYPHS[self]


_GLYPHS = {TileKind.EMPTY: ".", TileKind.BOUNDARY: "+", TileKind.FULL: "#"}
