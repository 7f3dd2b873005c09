"""Per-block residual masks: on each BOUNDARY compute block, the mask with the parts that are
constant there folded away.

A BOUNDARY block evaluates the whole mask on each of its pairs, though on most blocks most
parts of it are decided: the frame-distance band of a radial mask that a block's frames lie
in, the frame part of a neighborhood whose frames all fall inside the window, the members of a
union that keep nothing there. Every node of the mask's boolean skeleton (any_of / all_of /
not of primitives, and, inside a user `expr`, its and / or / not down to single relations)
is classified at the compute grid, each with the same exact or sound analysis as the mask
itself. On a block, a node FULL there is true, one EMPTY there false; folding those through
the skeleton leaves the block's *residual*: the smallest mask that agrees with the whole one on
every pair of the block.

The kernel cannot afford one function per block, so the distinct residuals are ranked by what
they save (blocks x full-block operations no longer evaluated, estimated from the mask's
expression) and the best become variants 1.. of the generated module, each a function of
its own; every other BOUNDARY block runs variant 0, the whole mask. The tables carry 2 bits
per compute block saying which, or 4 where a tile has at most 8 compute blocks
(svgen.core.tables, `variants`, `variant_bits`): at most MAX_VARIANTS variants, or 15, the
ones past MAX_VARIANTS only where they pay for the branch every BOUNDARY block then takes.

Soundness: a node is folded only where its classification proves it constant (a bounded
predicate's tiles are BOUNDARY where unproven, so they stay), and a variant is chosen for a
block only when the block's own residual is exactly it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy

from svgen import ir
from svgen.analysis.axis_terms import axis_sizes, polynomial
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.spec.expr import FloorMod, abs_upper_bound, simplify_union, split_sides

# Variants a block can name besides the whole mask: 2 bits per compute block, or 4 where a
# tile has few compute blocks (svgen.core.tables.variant_bits): 3, or 15.
MAX_VARIANTS = 3
# The kernel tries the variants one after another (a scalar compare and a branch each), so a
# variant past the first MAX_VARIANTS is kept only where it saves at least this many
# full-block ops per BOUNDARY block of the pattern (a branch: ~10 bundles of a ~65-bundle op).
MIN_SAVED_PER_BRANCH = 0.25
# Skeletons with more nodes than this get no variants (each node is one classification).
MAX_NODES = 48
# A variant must save at least this many full-block operations per block over the whole
# mask: the per-block choice costs a few scalar bundles and a branch.
MIN_SAVED_OPS = 2
# ... and the variants together at least this share of the BOUNDARY blocks' mask work:
# below it the choice, paid by every BOUNDARY block, would cost about what it saves.
MIN_SAVED_SHARE = 0.25
# A full-block operation of a BOUNDARY block's mask costs at most about this share of a FULL
# block (v6e, bench/residual_cost.py: 0.06-0.12 over seven masks) ...
MAX_SHARE_PER_MASK_OP = 0.12
# ... so residual masks are looked for only where even all of the BOUNDARY blocks' mask work
# is at least this share of the kernel's block work: below it the classification of every
# mask node (1-2 s at 1.74M tokens) would buy nothing a cost model could see.
MIN_KERNEL_SHARE = 0.005
# The full-block ops of a conjunction of two or more comparisons between a query-side and a
# key-side value: the code printer packs them into bit fields, one coords.fields (a subtract,
# an AND and a compare, the query side computed once per q tile; svgen.analysis.mask_code).
FIELDS_OPS = 3
# ... and of one window |a - b + s| <= c alone (or < c + 1): one coords.within, a subtract of
# the two sides (the query side once per q tile where it sums several coordinates) and an
# unsigned compare. (A lower bound |x| >= c as the same compare the other way round measured
# dearer than abs and a compare: 1,378 against 1,244 bundles for Radial Attention's residual
# (4 <= |df|) & |dp| < 900, v6e, 512 x 512 blocks; left as it is.)
WITHIN_OPS = 2

_TRUE, _FALSE, _OPEN, _UNUSED = 1, 0, 2, 3


@dataclasses.dataclass(frozen=True)
class Variant:
    """One residual mask and the BOUNDARY compute blocks that run it."""

    mask: ir.Node
    blocks: int
    ops: int  # estimated full-block operations of one evaluation


@dataclasses.dataclass(frozen=True)
class Residuals:
    variants: tuple[Variant, ...]  # variant j + 1 is variants[j]
    block_variant: np.ndarray  # int8 [compute q blocks, compute kv blocks]: 0 whole mask
    mask_ops: int  # estimated full-block operations of the whole mask

    def summary(self) -> list[dict]:
        return [
            {"variant": j + 1, "blocks": v.blocks, "ops": v.ops, "mask": v.mask.describe()}
            for j, v in enumerate(self.variants)
        ]


@dataclasses.dataclass
class _Node:
    """A node of the mask's boolean skeleton: `op` any / all / not / leaf; `ir` what is
    classified (a Predicate of the sub-expression inside a user expr); `expr` the sympy
    sub-expression there (None for IR nodes)."""

    op: str
    ir: ir.Node
    children: list["_Node"]
    expr: sympy.Basic | None = None


def skeleton(mask: ir.Node) -> _Node:
    if isinstance(mask, (ir.AnyOf, ir.AllOf)):
        op = "any" if isinstance(mask, ir.AnyOf) else "all"
        return _Node(op, mask, [skeleton(c) for c in mask.children])
    if isinstance(mask, ir.Not):
        return _Node("not", mask, [skeleton(mask.child)])
    if isinstance(mask, ir.Predicate):
        return _expr_skeleton(mask.expr, mask)
    return _Node("leaf", mask, [])


def _expr_skeleton(e: sympy.Basic, node: ir.Node | None = None) -> _Node:
    own = node if node is not None else ir.Predicate(str(e), e)
    if isinstance(e, (sympy.And, sympy.Or)):
        op = "all" if isinstance(e, sympy.And) else "any"
        return _Node(op, own, [_expr_skeleton(a) for a in e.args], e)
    if isinstance(e, sympy.Not):
        return _Node("not", own, [_expr_skeleton(e.args[0])], e)
    return _Node("leaf", own, [], e)


def _nodes(root: _Node) -> list[_Node]:
    out, stack = [], [root]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(reversed(n.children))
    return out


def analyze(
    mask: ir.Node,
    layout: TokenLayout,
    compute: TileGrid,
    kinds: np.ndarray,
    max_variants: int = MAX_VARIANTS,
) -> Residuals | None:
    """The variants of `mask` on the BOUNDARY compute blocks of `kinds` (its classification
    at `compute`), at most `max_variants`; None when no residual saves MIN_SAVED_OPS
    operations."""
    root = skeleton(mask)
    nodes = _nodes(root)
    if len(nodes) < 2 or len(nodes) > MAX_NODES:
        return None
    boundary = np.flatnonzero(kinds.ravel() == TileKind.BOUNDARY)
    if boundary.size == 0:
        return None
    mask_ops = estimate_ops(mask)
    visited = boundary.size + int(np.count_nonzero(kinds == TileKind.FULL))
    if boundary.size * mask_ops * MAX_SHARE_PER_MASK_OP < MIN_KERNEL_SHARE * visited:
        return None
    index = {id(n): i for i, n in enumerate(nodes)}
    status = np.empty((boundary.size, len(nodes)), np.int8)
    status[:, 0] = _OPEN
    for i, n in enumerate(nodes[1:], 1):
        child = classify_tiles(n.ir, layout, compute).kinds.ravel()[boundary]
        status[:, i] = np.select(
            [child == TileKind.FULL, child == TileKind.EMPTY], [_TRUE, _FALSE], _OPEN
        )
    values = _fold(root, index, status)
    rows, block_of = _unique_rows(values)
    counts = np.bincount(block_of, minlength=len(rows))
    scored = []
    for r, row in enumerate(rows):
        if row[0] != _OPEN:  # proven constant by its parts: left to the whole mask
            continue
        residual = _build(root, index, row)
        ops = estimate_ops(residual)
        if mask_ops - ops >= MIN_SAVED_OPS:
            scored.append((counts[r] * (mask_ops - ops), r, residual, ops))
    scored.sort(key=lambda s: (-s[0], s[1]))
    chosen = scored[:MAX_VARIANTS] + [
        s for s in scored[MAX_VARIANTS:max_variants] if s[0] >= MIN_SAVED_PER_BRANCH * boundary.size
    ]
    if not chosen or sum(s[0] for s in chosen) < MIN_SAVED_SHARE * boundary.size * mask_ops:
        return None
    block_variant = np.zeros(kinds.size, np.int8)
    variants = []
    for j, (_, r, residual, ops) in enumerate(chosen, 1):
        block_variant[boundary[block_of == r]] = j
        variants.append(Variant(residual, int(counts[r]), ops))
    return Residuals(tuple(variants), block_variant.reshape(kinds.shape), mask_ops)


def _unique_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, axis=0, return_inverse=True) for node values (0..3, int8 [blocks,
    nodes]), in the same (lexicographic) order: each row packed into 64-bit words, 2 bits per
    node, the first node highest, and the words sorted. np.unique's row sort compares rows as
    opaque records: 10 s for 712K blocks of 3 nodes at 1.74M tokens, against 0.1 s here."""
    n, k = values.shape
    per_word = 32
    words = []
    for first in range(0, k, per_word):
        chunk = values[:, first : first + per_word].astype(np.uint64)
        shifts = np.uint64(2) * np.arange(
            per_word - 1, per_word - 1 - chunk.shape[1], -1, dtype=np.uint64
        )
        words.append(np.bitwise_or.reduce(chunk << shifts, axis=1))
    order = np.lexsort(words[::-1])  # the last key is the primary one: the first word
    packed = np.stack(words, axis=1)[order]
    starts = np.ones(n, bool)
    starts[1:] = np.any(packed[1:] != packed[:-1], axis=1)
    inverse = np.empty(n, np.int64)
    inverse[order] = np.cumsum(starts) - 1
    return values[order[starts]], inverse


def _fold(root: _Node, index: dict, status: np.ndarray) -> np.ndarray:
    """Per block and node: TRUE / FALSE / OPEN after folding the children's values up the
    skeleton, and UNUSED for nodes under a decided ancestor (so that blocks with one
    residual have one row)."""
    values = status.copy()

    def up(n: _Node) -> np.ndarray:
        i = index[id(n)]
        if not n.children:
            return values[:, i]
        kids = [up(c) for c in n.children]
        own = values[:, i]
        if n.op == "not":
            k = kids[0]
            v = np.where(k == _OPEN, _OPEN, 1 - np.minimum(k, 1))
        elif n.op == "any":
            any_true = np.any([k == _TRUE for k in kids], axis=0)
            all_false = np.all([k == _FALSE for k in kids], axis=0)
            v = np.where(any_true, _TRUE, np.where(all_false, _FALSE, _OPEN))
        else:
            any_false = np.any([k == _FALSE for k in kids], axis=0)
            all_true = np.all([k == _TRUE for k in kids], axis=0)
            v = np.where(any_false, _FALSE, np.where(all_true, _TRUE, _OPEN))
        # The node's own classification may decide what its children leave open.
        v = np.where(own != _OPEN, own, v).astype(np.int8)
        values[:, i] = v
        return v

    up(root)

    def down(n: _Node, live: np.ndarray) -> None:
        i = index[id(n)]
        values[~live, i] = _UNUSED
        for c in n.children:
            down(c, live & (values[:, i] == _OPEN))

    down(root, np.ones(len(values), bool))
    return values


def _build(n: _Node, index: dict, row: np.ndarray) -> ir.Node:
    """The residual IR node of a node (an IR node, or the top of a user expr)."""
    value = row[index[id(n)]]
    if n.expr is not None:  # the top of a user expr: its residual is a predicate again
        e = _build_expr(n, index, row)
        if e in (sympy.true, sympy.false):
            return ir.Always(bool(e))
        return ir.Predicate(str(e), e)
    if value == _TRUE:
        return ir.Always(True)
    if value == _FALSE:
        return ir.Always(False)
    if n.op == "leaf":
        return n.ir
    if n.op == "not":
        return ir.Not(_build(n.children[0], index, row))
    kept = [c for c in n.children if row[index[id(c)]] == _OPEN]
    parts = tuple(_build(c, index, row) for c in kept)
    if len(parts) == 1:
        return parts[0]
    return ir.AnyOf(parts) if n.op == "any" else ir.AllOf(parts)


def _build_expr(n: _Node, index: dict, row: np.ndarray) -> sympy.Basic:
    value = row[index[id(n)]]
    if value == _TRUE:
        return sympy.true
    if value == _FALSE:
        return sympy.false
    if n.op == "leaf":
        return n.expr
    if n.op == "not":
        return sympy.Not(_build_expr(n.children[0], index, row))
    parts = [_build_expr(c, index, row) for c in n.children if row[index[id(c)]] == _OPEN]
    return sympy.And(*parts) if n.op == "all" else sympy.Or(*parts)


def estimate_ops(mask: ir.Node) -> int:
    """Full-block operations a boundary mask evaluates, estimated from its expression: every
    operation whose operands mix query and key coordinates runs on each pair of the block
    (one reading only the query's or only the key's runs on a column or a row, ~1/128 or
    1/8 of that: not counted)."""
    return _mixed_ops(mask.predicate())


def _mixed_ops(e) -> int:
    if not isinstance(e, sympy.Basic) or not e.args:
        return 0
    window = abs_upper_bound(e)
    if window is not None and split_sides(window[0]) is not None:
        return WITHIN_OPS
    if isinstance(e, sympy.And):
        fused = [a for a in e.args if _compares_sides(a)]
        if len(fused) >= 2:  # one coords.fields for them all, then an AND per other part
            rest = [a for a in e.args if a not in fused]
            return FIELDS_OPS + sum(_mixed_ops(a) + 1 for a in rest)
    if isinstance(e, sympy.Or):  # as the code printer writes it
        e = sympy.Or(*simplify_union(e.args), evaluate=False)
    sides = {s.name[-1] for s in e.free_symbols}
    inner = sum(_mixed_ops(a) for a in e.args)
    if sides != {"q", "k"}:
        return inner
    mixed_args = sum(1 for a in e.args if {s.name[-1] for s in a.free_symbols} & {"q", "k"})
    return inner + max(1, mixed_args - 1)


def _compares_sides(e) -> bool:
    """Whether e compares a query-side and a key-side value, as the code printer fuses
    into coords.fields: a - b against a constant (e.g. a <= b), |a - b + s| <= c, or
    (a - b) % d == 0."""
    if not isinstance(e, (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt, sympy.Eq)):
        return False
    lhs, rhs = e.args
    if isinstance(e, sympy.Eq) and rhs == 0 and isinstance(lhs, FloorMod):
        lhs = lhs.args[0]
    elif (window := abs_upper_bound(e)) is not None:
        lhs = window[0]
    else:  # |x| >= c is no window: x inside the Abs mixes the sides, split_sides refuses it
        lhs = lhs - rhs
    return split_sides(lhs) is not None


def relative_work(mask: ir.Node, layout: TokenLayout) -> float | None:
    """The product-analysis work of classifying the mask's parts (analyze) relative to
    classifying the mask itself, from the terms of their inclusion-exclusion sums (the work
    is box pairs x terms, the box pairs the same); None when a part has no such sum (the
    row-set analysis classifies it) or the skeleton is out of analyze's range."""
    nodes = _nodes(skeleton(mask))
    if len(nodes) < 2 or len(nodes) > MAX_NODES:
        return None
    sizes = axis_sizes(layout)
    whole = polynomial(mask, sizes)
    parts = [polynomial(n.ir, sizes) for n in nodes[1:]]
    if whole is None or any(p is None for p in parts):
        return None
    return sum(len(p) for p in parts) / max(1, len(whole))
