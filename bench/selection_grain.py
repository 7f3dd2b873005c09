"""How close svgen's selection grain, the compute block, comes to VMoBA's key blocks.

    python bench/selection_grain.py [--json FILE]

VMoBA (arXiv 2506.23858; its reference code, KwaiVGI/VMoBA src/vmoba.py) cuts the keys of a
T x H x W video into blocks, cycling three partitions by layer:
  1-D  n whole frames (the last block shorter where n does not divide T);
  2-D  ch x cw patches of every frame, a block holding the patch across all T frames;
  3-D  ct x ch x cw cubes;
the 2-D and 3-D sizes must divide the axes. Its code permutes q, k and v so that each block is
one contiguous run of tokens: the 2-D order is (patch row, patch column, frame, row, column),
which is svgen's tiled layout with cubes of T x ch x cw, and the 3-D order is svgen's tiled
layout with ct x ch x cw cubes; 1-D needs no permutation (frame-major). Each query picks key
blocks by its dot product with their mean key and always keeps its own block.

svgen's `select` picks compute blocks: compute_kv keys for a block of compute_q queries. For
each partition, at each compute block size, in the layout that reproduces VMoBA's order,
this script counts from coordinates alone (not from the layouts' own formulas):
  * run: whether every VMoBA block is one contiguous run of the layout's kernel order (the
    layout reproduces VMoBA's permutation);
  * exact: whether every block is a union of whole compute blocks (a compute-grain selection
    can then be VMoBA's key choice exactly);
  * key excess: the keys of the compute blocks a block touches beyond the block's own, over
    all blocks (what a selection that covers a chosen VMoBA block attends in addition);
  * shared query blocks: the share of compute_q query blocks holding queries of two or more
    VMoBA blocks (their queries have different own blocks, but svgen chooses per query
    block).
Nothing here runs a kernel; the figures are counts, exact for the geometry.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import numpy as np

from svgen.core.layout import FRAME_MAJOR, Tiled, TokenLayout

#: Compute block sizes (keys, and queries) svgen's kernels take: multiples of 128.
COMPUTE_BLOCKS = (128, 256, 384, 512)


@dataclasses.dataclass(frozen=True)
class Partition:
    kind: str  # "1-D", "2-D", "3-D"
    sizes: tuple[int, ...]  # (n,), (ch, cw) or (ct, ch, cw)

    def words(self) -> str:
        return f"{self.kind} {'x'.join(map(str, self.sizes))}"

    def check(self, frames: int, height: int, width: int) -> None:
        """VMoBA's own rule: 2-D and 3-D sizes divide their axes (its code asserts it)."""
        axes = {"1-D": (), "2-D": (height, width), "3-D": (frames, height, width)}[self.kind]
        sizes = self.sizes if self.kind != "1-D" else ()
        if any(a % s for a, s in zip(axes, sizes)):
            raise ValueError(f"{self.words()} does not divide {frames}x{height}x{width}")

    def layout(self, video: TokenLayout) -> TokenLayout:
        """The svgen layout whose kernel order is VMoBA's permuted order."""
        if self.kind == "1-D":
            return video.with_order(FRAME_MAJOR)
        if self.kind == "2-D":
            return video.with_order(Tiled(video.frames, *self.sizes))
        return video.with_order(Tiled(*self.sizes))

    def block_of(self, f, h, w, frames: int, height: int, width: int) -> np.ndarray:
        """VMoBA's block index of each token (f, h, w), from its coordinates."""
        if self.kind == "1-D":
            return f // self.sizes[0]
        if self.kind == "2-D":
            ch, cw = self.sizes
            return (h // ch) * (width // cw) + w // cw
        ct, ch, cw = self.sizes
        return ((f // ct) * (height // ch) + h // ch) * (width // cw) + w // cw


def measure(partition: Partition, frames: int, height: int, width: int, compute: int) -> dict:
    partition.check(frames, height, width)
    video = TokenLayout(frames=frames, height=height, width=width)
    lay = partition.layout(video)
    n = video.seq_len
    user = lay.original_index(np.arange(n))  # the user's (frame-major) index of each position
    f, rest = np.divmod(user, height * width)
    h, w = np.divmod(rest, width)
    block = partition.block_of(f, h, w, frames, height, width)  # per kernel position
    starts = np.flatnonzero(np.r_[True, block[1:] != block[:-1]])
    one_run = len(starts) == len(np.unique(block))
    compute_of = np.arange(n) // compute
    sizes = np.minimum(compute, n - np.arange(-(-n // compute)) * compute)  # last one short
    pairs = np.unique(np.stack([block, compute_of]), axis=1)  # (block, compute block) touched
    covered = int(sizes[pairs[1]].sum())
    blocks_per_compute = np.bincount(pairs[1], minlength=len(sizes))
    return {
        "partition": partition.words(),
        "geometry": f"{frames}x{height}x{width}",
        "compute_block": compute,
        "blocks": int(len(np.unique(block))),
        "block_tokens": int(np.bincount(block).max()),
        "one_run": bool(one_run),
        "exact": bool(covered == n),
        "key_excess": round(covered / n - 1, 4),
        "shared_query_blocks": round(float(np.mean(blocks_per_compute > 1)), 4),
    }


#: VMoBA-like sizes for Wan 2.1 720p (21 x 45 x 80) and the same video padded to 48 rows, where
#: 8 x 16 patches make 2-D blocks of 21 x 128 tokens and 3-D cubes of ct x 128.
CASES = (
    (21, 45, 80, Partition("1-D", (1,))),
    (21, 45, 80, Partition("1-D", (3,))),
    (21, 45, 80, Partition("2-D", (9, 10))),
    (21, 45, 80, Partition("2-D", (15, 16))),
    (21, 45, 80, Partition("3-D", (3, 9, 16))),
    (21, 45, 80, Partition("3-D", (7, 15, 16))),
    (21, 48, 80, Partition("1-D", (1,))),
    (21, 48, 80, Partition("1-D", (3,))),
    (21, 48, 80, Partition("2-D", (8, 16))),
    (21, 48, 80, Partition("3-D", (3, 8, 16))),
    (21, 48, 80, Partition("3-D", (7, 8, 16))),
)


def table(rows: list[dict]) -> list[str]:
    out = [
        "| geometry | partition | blocks of (tokens) | compute block | one run | exact | key excess | shared query blocks |",
        "|---|---|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['geometry']} | {r['partition']} | {r['blocks']} ({r['block_tokens']}) | "
            f"{r['compute_block']} | {'yes' if r['one_run'] else 'no'} | "
            f"{'yes' if r['exact'] else 'no'} | {r['key_excess']:.1%} | "
            f"{r['shared_query_blocks']:.1%} |"
        )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    rows = [measure(p, *geometry, c) for *geometry, p in CASES for c in COMPUTE_BLOCKS]
    print("\n".join(table(rows)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
