"""The TPU kernels' branches declared as a tree: every `pl.when` branch one grid step of a
kernel emits, by name, in the order its body emits them, from the kernel's `Branches`
(svgen.runtime.variant). The cost model finds each in libtpu's schedule by its place in this
tree and reads every path's cost by name (svgen.estimate.paths.read_paths), without JAX.

    init, full, mixed[p] (segment[p]) per pattern, [padded,] finalize

with a bounded kernel's phases twice, in `bounded` and `online`. Inside mixed[p] of a tile of
several compute blocks: straight[j] per straight word, then (in `blocks` when there are
words) full@i and boundary@i per compute block i, row-major, and segment@i (segment tables)
or, on a selection's padding column, padded@i; inside boundary@i, variant[j] per residual
variant (the whole mask first); inside a masked body on the padding column, PADDING_TWINS.
A tile of one compute block: mixed[p] is its BOUNDARY block. init's own branches (a query
decode per pattern) are not declared.
"""

from __future__ import annotations

import dataclasses

from svgen.runtime.variant import Branches


@dataclasses.dataclass(frozen=True)
class Branch:
    """One `pl.when` branch of a kernel body, by name, with the branches it holds directly,
    in the order the body emits them."""

    name: str
    children: tuple["Branch", ...] = ()


# The two twins of a masked body on the padding column (Branches.padding_column): without,
# then with the padding test (chosen by the kv tile).
PADDING_TWINS = (Branch("plain"), Branch("padding"))


def step(branches: Branches) -> tuple[Branch, ...]:
    """The branches of one grid step: init, the phases (a bounded kernel's two sets in a
    branch each, `bounded` then `online`, the online one without straight bodies),
    finalize."""
    if branches.bounded:
        sets = (
            Branch("bounded", phase_set(branches, straight=True)),
            Branch("online", phase_set(branches, straight=False)),
        )
    else:
        sets = phase_set(branches, straight=True)
    return (Branch("init"), *sets, Branch("finalize"))


def phase_set(branches: Branches, straight: bool) -> tuple[Branch, ...]:
    """One set of phases (named as Branches.phases): full, mixed[p] per pattern (and, for
    tiles of one compute block across segments, segment[p]), then a selection's tile of one
    block holding padding keys, padded; straight: whether BOUNDARY tiles run their words'
    straight-line bodies."""
    one_block = branches.compute_blocks == 1
    phases = [Branch("full")]
    for p in range(branches.patterns):
        phases.append(Branch(f"mixed[{p}]", boundary_tile(branches, p, straight)))
        if branches.segmented and one_block:
            phases.append(Branch(f"segment[{p}]", masked(branches, 0)))
    if branches.padded_column is not None and one_block:
        phases.append(Branch("padded", masked(branches, 0)))
    return tuple(phases)


def boundary_tile(branches: Branches, pattern: int, straight: bool) -> tuple[Branch, ...]:
    """Inside a BOUNDARY tile of `pattern`: a tile of one compute block is its BOUNDARY
    block; else straight[j] per word (the pattern's j-th), then the per-block branches (in
    one branch, `blocks`, when there are words)."""
    if branches.compute_blocks == 1:
        return boundary_block(branches, pattern, 0)
    per_block = tuple(
        b for index in range(branches.compute_blocks) for b in block(branches, pattern, index)
    )
    words = branches.straight[pattern] if straight else ()
    if not words:
        return per_block
    bodies = tuple(Branch(f"straight[{j}]") for j in range(len(words)))
    return (*bodies, Branch("blocks", per_block))


def block(branches: Branches, pattern: int, index: int) -> tuple[Branch, ...]:
    """Compute block `index`'s branches in a BOUNDARY tile: full@index, boundary@index, and
    segment@index (segment tables) or, on a selection's padding column, padded@index."""
    column = _column(branches, index)
    out = [
        Branch(f"full@{index}"),
        Branch(f"boundary@{index}", boundary_block(branches, pattern, index)),
    ]
    if branches.segmented:
        out.append(Branch(f"segment@{index}", masked(branches, column)))
    elif branches.padded_column is not None and column == branches.padded_column:
        out.append(Branch(f"padded@{index}", masked(branches, column)))
    return tuple(out)


def boundary_block(branches: Branches, pattern: int, index: int) -> tuple[Branch, ...]:
    """Inside a BOUNDARY block: variant[j] per residual variant (variant[0]: the whole mask),
    each a masked body; without residual masks, the masked body itself."""
    column, residuals = _column(branches, index), branches.residuals[pattern]
    if not residuals:
        return masked(branches, column)
    return tuple(Branch(f"variant[{j}]", masked(branches, column)) for j in range(residuals + 1))


def masked(branches: Branches, column: int) -> tuple[Branch, ...]:
    """Inside a masked body of this block column: PADDING_TWINS on the padding column."""
    return PADDING_TWINS if column == branches.padding_column else ()


def _column(branches: Branches, index: int) -> int:
    """Compute block `index`'s column in its tile (blocks row-major)."""
    return index % (branches.compute_blocks // branches.q_blocks_per_tile)
