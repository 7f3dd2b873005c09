"""Box DMA: a tile read and written as a box of the user's own array, so that the wrapper moves
no token between the user's order and the kernel's.

Two layouts have tiles that are boxes:

* **Cubes** (`CubeDma`). In a tiled layout whose cubes divide the video, with no text tokens
  and tiles of exactly one cube, every tile is a strided box of the user's own [frames, height,
  width, d] array. The forward kernel reads and writes those boxes directly (4-D blocks, the
  cube's (frame, row, column) group from the tile index, the VMEM block viewed as [cube tokens,
  d]); inside a cube the kernel order is the box's own (f, h, w) order. The box DMA costs
  about 75 bundles per step more than a contiguous block (v6e, 384-token cubes).
* **Place boxes** (`PlaceBoxes`). In the temporal-major order with no anchor frames and no text
  (PARO's [h, w, f]: places row by row, each place's frames together), a tile of n places x
  every frame is the box [frames, n] of the user's [frames, places, d] array (block_q =
  frames * n_q, block_kv = frames * n_kv, each n a multiple of 16). The kernel reads it frame
  by frame, so its rows are the tile's tokens in another order than the kernel's: row r is
  kernel position tile * frames * n + (r % n) * frames + r // n. Attention does not care in
  which order a tile's tokens sit, as long as each row's coordinates are its own and its
  output goes back where it came from: the kernel decodes every row's coordinates from that
  position, and the box DMA writes o back to the same box. A tile is the same set of tokens
  in either order, so the tables' classes hold for it; a compute block smaller than its tile
  would not be (it would hold some frames of every place of the tile, not a run of kernel
  positions), so place boxes take one compute block per tile. The last box may reach past
  the places (a partial block, as the last tile of a plain call reaches past the sequence):
  its rows past them are padding, masked by position as there.

The user's array goes in and the output comes out in the user's order, with no HBM pass over
q, k, v or o. With cubes the backward pass permutes its operands into kernel order as for any
other layout; with place boxes its kernels read and write boxes too (svgen.runtime.backward:
D in the q boxes' order, `to_box_order`, as the forward's lse; dq accumulated in a boxed HBM
buffer), unless svgen.runtime.kernel.BOX_BACKWARD is False (then the lse is moved to kernel
order, `lse_to_kernel_order`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from svgen.core.boxes import cube_fits, place_box_places
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

    @property
    def block(self) -> tuple[int, ...]:
        """The VMEM block of q and o (without the row and head_dim axes)."""
        return self.cube

    @property
    def kv_block(self) -> tuple[int, ...]:
        """The VMEM block of k and v."""
        return self.cube

    @property
    def q_places(self) -> int:
        """0: a tile's rows are its kernel positions in order (see PlaceBoxes)."""
        return 0

    kv_places = q_places

    def box(self, tile):
        """The (frame, row, column) group of cube `tile` (cubes in (frame, row, column) group
        order): the block index of its box. lax.div / lax.rem: non-negative, and no `sign`
        (which does not lower for TPU from a CPU host)."""
        _, rows, cols = self.groups
        return lax.div(tile, rows * cols), lax.rem(lax.div(tile, cols), rows), lax.rem(tile, cols)


@dataclasses.dataclass(frozen=True)
class PlaceBoxes:
    """A temporal-major q tile is the box [frames, q_places] of the user's [frames, places, d]
    array, a kv tile the box [frames, kv_places] (see the module docstring): a tile's rows
    are frame-major inside its box, the kernel's positions place-major."""

    frames: int
    places: int  # height * width
    q_places: int  # a q tile is q_places places x every frame
    kv_places: int  # a kv tile, kv_places places x every frame

    @property
    def view(self) -> tuple[int, int]:
        return self.frames, self.places

    @property
    def block(self) -> tuple[int, int]:
        return self.frames, self.q_places

    @property
    def kv_block(self) -> tuple[int, int]:
        return self.frames, self.kv_places

    @property
    def seq_len(self) -> int:
        return self.frames * self.places

    def box(self, tile):
        return 0, tile

    def to_box_order(self, x):
        """A per-token vector [rows, frames, padded places] in the user's order to the q
        boxes' order, lane-major [rows, 1, padded length] (as the forward's lse)."""
        rows, frames, places = x.shape
        tiles = places // self.q_places
        boxed = jnp.swapaxes(x.reshape(rows, frames, tiles, self.q_places), 1, 2)
        return boxed.reshape(rows, 1, frames * places)

    def lse_to_kernel_order(self, lse):
        """The forward's lse [rows, 1, q tiles * block_q], each tile's rows in box order, to
        kernel order (what the backward kernels read)."""
        rows, _, length = lse.shape
        tiles = length // (self.frames * self.q_places)
        boxed = lse.reshape(rows, 1, tiles, self.frames, self.q_places)
        return jnp.swapaxes(boxed, -1, -2).reshape(lse.shape)


def tile_positions(tile, block: int, places_per_box: int, shape, axis: int, offset=None):
    """The kernel positions (int32 of `shape`) of the rows offset + iota(shape, axis) of tile
    `tile` of `block` tokens: in order, or with place boxes (places_per_box > 0) row r is
    place r % n, frame r // n of the box (lax.div / lax.rem: the operands are
    non-negative). In order the sum is tile * block + offset + iota, in the order the kernels
    always traced it (the same program)."""
    if not places_per_box:
        start = tile * block if offset is None else tile * block + offset
        return start + lax.broadcasted_iota(jnp.int32, shape, axis)
    rows = lax.broadcasted_iota(jnp.int32, shape, axis)
    if offset is not None:
        rows = offset + rows
    frames = block // places_per_box
    place, frame = lax.rem(rows, places_per_box), lax.div(rows, places_per_box)
    return tile * block + place * frames + frame


class BoxRows:
    """A box DMA block ([a, b, c, d] or [frames, n, d]) read and written as [box tokens, d]
    values, as the kernel body reads its blocks: `x[...]`, `x[pl.ds(start, size), :]`
    (static), `x[...] = y`. The value reshape merges whole (8, 128) tiles (see
    svgen.core.boxes), so it moves no data: on v6e it compiles to the same bundles as a ref
    reshape, which Pallas's TPU interpreter does not run."""

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


def cube_dma(layouts: Sequence[TokenLayout], shape: KernelShape) -> "CubeDma | PlaceBoxes | None":
    """The box DMA of a kernel whose heads all use `layouts` (cubes or place boxes), or None
    where it does not apply (then the wrapper permutes q, k, v into kernel order and o back):
    svgen.core.boxes decides."""
    if len(layouts) != 1 or layouts[0].is_identity:
        return None  # (an identity layout's tiles are contiguous already: plain blocks)
    if shape.qk_int8:
        # int8 QK^T quantizes q and k per compute block of kernel order before the kernel
        # (svgen.runtime.quantize): the tokens are moved there, and the kernel reads tiles.
        return None
    lay = layouts[0]
    if lay.is_temporal_major:
        return place_boxes(lay, shape)
    if not cube_fits(lay, shape.block_q, shape.block_kv):
        return None
    return CubeDma(lay.frames, lay.height, lay.width, lay.cube)


def place_boxes(lay: TokenLayout, shape: KernelShape) -> PlaceBoxes | None:
    """Place boxes where each tile is whole places x every frame of a temporal-major layout
    (svgen.core.boxes.place_box_places; see the module docstring)."""
    places = place_box_places(
        lay, shape.block_q, shape.block_kv, shape.compute_blocks, shape.bounded_softmax
    )
    if places is None:
        return None
    return PlaceBoxes(lay.frames, lay.tokens_per_frame, *places)


def cube_order(x, layout: TokenLayout, to_kernel: bool, view: tuple[int, ...]):
    """Box DMA's [rows, *view, d] (the user's order) to [rows, seq_len, d] in the layout's
    kernel order, or back (the backward pass's operands and gradients)."""
    if to_kernel:
        return layout.to_kernel(x.reshape(x.shape[0], -1, x.shape[-1]), jnp)
    y = layout.from_kernel(x, jnp)
    return y.reshape(y.shape[0], *view, y.shape[-1])
