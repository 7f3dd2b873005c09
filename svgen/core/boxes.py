"""Which tiles are boxes of the user's own arrays (NumPy only: the compiler's words and the
runtime's box DMA, svgen.runtime.cube, decide it the same way).

A tile is a box when its tokens fill a rectangle of the user's array, so that the kernel can
read and write it there with one strided DMA and the wrapper moves no token:
  * cubes: a tiled layout's tile of exactly one cube, the cubes dividing the video, no text;
  * place boxes: a temporal-major tile of whole places x every frame, no anchor frame, no
    text, the video's own frame, one compute block per tile.
"""

from __future__ import annotations

from svgen.core.layout import TokenLayout

# The sublane tile of the box's last spatial axis: a [cube tokens, d] view of a 4-D VMEM block
# merges whole (8, 128) tiles only when the cube's column count is a multiple of 8.
CUBE_COLS_MULTIPLE = 8

# A place box [frames, n, d] is viewed as [frames * n, d] with no data moved only when n fills
# whole sublane tiles of bf16, which packs 16 rows in one.
PLACES_MULTIPLE = 16


def cube_fits(lay: TokenLayout, block_q: int, block_kv: int) -> bool:
    """Each tile of a tiled layout is one cube box of the user's [frames, height, width]."""
    if not lay.is_tiled or lay.is_identity:
        return False
    a, b, c = lay.cube
    return (
        lay.text_tokens == 0
        and lay.frames % a == 0
        and lay.height % b == 0
        and lay.width % c == 0
        and c % CUBE_COLS_MULTIPLE == 0
        and block_q == block_kv == a * b * c
    )


def place_box_places(
    lay: TokenLayout, block_q: int, block_kv: int, compute_blocks: int, bounded: bool
) -> tuple[int, int] | None:
    """(places per q box, places per kv box) where each tile of a temporal-major layout is a
    place box of the user's [frames, places] (svgen.runtime.cube), else None. compute_blocks:
    per tile (one: a smaller compute block of a box is not a run of kernel positions, which
    the tables classify); bounded: the bounded softmax, whose bound reads every row of a tile,
    padding too."""
    frames = lay.frames
    fits = (
        lay.is_temporal_major
        and lay.anchor_frames == 0
        and lay.text_tokens == 0
        and not lay.transposed
        and not bounded
        and compute_blocks == 1
        and all(
            block % frames == 0 and (block // frames) % PLACES_MULTIPLE == 0
            for block in (block_q, block_kv)
        )
    )
    return (block_q // frames, block_kv // frames) if fits else None
