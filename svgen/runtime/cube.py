"""Cube DMA: a tile of a tiled layout read and written as a box of the user's own array.

In a tiled layout whose cubes divide the video, with no text tokens and tiles of exactly one
cube, every tile is a strided box of the user's own [frames, height, width, d] array. The
forward kernel then reads and writes those boxes directly (4-D blocks, the cube's (frame, row,
column) group from the tile index, the VMEM block viewed as [cube tokens, d]), and the wrapper
makes no permutation at all: the user's array goes in and the output comes out in the user's
order, with no HBM pass over q, k, v or o. The box DMA costs about 75 bundles per step more
than a contiguous block (v6e, 384-token cubes). The backward pass permutes its operands into
the cube order as for any other layout.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from svgen.core.layout import TokenLayout
from svgen.core.tables import KernelShape


@dataclasses.dataclass(frozen=True)
class CubeDma:
    """A tile is one cube, a box of the user's [frames, height, width, d] array (see the
    module docstring): the kernel's q, k, v and o are that 4-D view of each head."""

    frames: int
    height: int
    width: int
    cube: tuple[int, int, int]

    @property
    def groups(self) -> tuple[int, int, int]:
        a, b, c = self.cube
        return self.frames // a, self.height // b, self.width // c

    @property
    def view(self) -> tuple[int, int, int]:
        return self.frames, self.height, self.width

    def box(self, tile):
        """The (frame, row, column) group of cube `tile` (cubes in (frame, row, column) group
        order): the block index of its box. lax.div / lax.rem: non-negative, and no `sign`
        (which does not lower for TPU from a CPU host)."""
        _, rows, cols = self.groups
        return lax.div(tile, rows * cols), lax.rem(lax.div(tile, cols), rows), lax.rem(tile, cols)


class BoxRows:
    """A cube DMA block [a, b, c, d] read and written as [cube tokens, d] values, as the
    kernel body reads its blocks: `x[...]`, `x[pl.ds(start, size), :]` (static), `x[...] = y`.
    The value reshape merges whole (8, 128) tiles (see _CUBE_COLS_MULTIPLE), so it moves no
    data: on v6e it compiles to the same bundles as a ref reshape, which Pallas's TPU
    interpreter does not run."""

    def __init__(self, ref):
        self._ref = ref
        self.shape = (math.prod(ref.shape[:-1]), ref.shape[-1])
        self.dtype = ref.dtype

    def __getitem__(self, index):
        rows = self._ref[...].reshape(self.shape)
        if index is Ellipsis:
            return rows
        row_slice, cols = index
        if cols != slice(None) or not isinstance(row_slice, pl.Slice):
            raise NotImplementedError(f"cube DMA blocks are read by row ranges, got {index}")
        return rows[row_slice.start : row_slice.start + row_slice.size]

    def __setitem__(self, index, value):
        if index is not Ellipsis:
            raise NotImplementedError(f"cube DMA blocks are written whole, got {index}")
        self._ref[...] = value.reshape(self._ref.shape)


# The sublane tile of the box's last spatial axis: a [cube tokens, d] view of a 4-D VMEM block
# merges whole (8, 128) tiles only when the cube's column count is a multiple of 8.
_CUBE_COLS_MULTIPLE = 8


def cube_dma(layouts: Sequence[TokenLayout], shape: KernelShape) -> CubeDma | None:
    """The cube DMA of a kernel whose heads all use `layouts`, or None where it does not
    apply (then the wrapper permutes q, k, v into kernel order and o back)."""
    if len(layouts) != 1 or not layouts[0].is_tiled or layouts[0].is_identity:
        return None  # (an identity layout's tiles are contiguous already: plain blocks)
    lay = layouts[0]
    a, b, c = lay.cube
    cube_tokens = a * b * c
    fits = (
        lay.text_tokens == 0
        and lay.frames % a == 0
        and lay.height % b == 0
        and lay.width % c == 0
        and c % _CUBE_COLS_MULTIPLE == 0
        and shape.block_q == shape.block_kv == cube_tokens
    )
    return CubeDma(lay.frames, lay.height, lay.width, lay.cube) if fits else None


def cube_order(x, layout: TokenLayout, to_kernel: bool):
    """Cube DMA's [rows, frames, height, width, d] (the user's order) to [rows, seq_len, d]
    in the layout's kernel order, or back (the backward pass's operands and gradients)."""
    if to_kernel:
        return layout.to_kernel(x.reshape(x.shape[0], -1, x.shape[-1]), jnp)
    y = layout.from_kernel(x, jnp)
    return y.reshape(y.shape[0], layout.frames, layout.height, layout.width, y.shape[-1])
