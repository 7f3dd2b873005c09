"""The algebra over nodes: any_of, all_of, not, and `simplify` (flatten nested unions and
intersections, drop duplicates and constants)."""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy

from svgen.ir.builtin_nodes import Always
from svgen.ir.facts import Node, NodeFacts
from svgen.ir.predicates import Predicate


class _Combination(NodeFacts):
    """any_of / all_of: facts that hold when they hold for every child."""

    children: tuple

    def anchor_frames(self) -> int:
        return max(c.anchor_frames() for c in self.children)

    def frame_invariant(self) -> bool:
        return all(c.frame_invariant() for c in self.children)

    def shift_invariant(self) -> bool:
        return all(c.shift_invariant() for c in self.children)


@dataclasses.dataclass(frozen=True)
class AnyOf(_Combination):
    children: tuple["Node", ...]

    def evaluate(self, q, k):
        return np.logical_or.reduce([c.evaluate(q, k) for c in self.children])

    def predicate(self):
        return sympy.Or(*(c.predicate() for c in self.children))

    def describe(self):
        return "any of: " + "; ".join(c.describe() for c in self.children)

    def transposed(self):
        return AnyOf(tuple(c.transposed() for c in self.children))

    def excludes_text(self) -> bool:
        return all(c.excludes_text() for c in self.children)


@dataclasses.dataclass(frozen=True)
class AllOf(_Combination):
    children: tuple["Node", ...]

    def evaluate(self, q, k):
        return np.logical_and.reduce([c.evaluate(q, k) for c in self.children])

    def predicate(self):
        return sympy.And(*(c.predicate() for c in self.children))

    def describe(self):
        return "all of: " + "; ".join(c.describe() for c in self.children)

    def transposed(self):
        return AllOf(tuple(c.transposed() for c in self.children))

    def excludes_text(self) -> bool:
        return any(c.excludes_text() for c in self.children)


@dataclasses.dataclass(frozen=True)
class Not(NodeFacts):
    child: "Node"

    def evaluate(self, q, k):
        return ~self.child.evaluate(q, k)

    def predicate(self):
        return sympy.Not(self.child.predicate())

    def describe(self):
        return f"not ({self.child.describe()})"

    def transposed(self):
        return Not(self.child.transposed())

    def anchor_frames(self) -> int:
        return self.child.anchor_frames()

    def frame_invariant(self) -> bool:
        return self.child.frame_invariant()

    def shift_invariant(self) -> bool:
        return self.child.shift_invariant()


def simplify(node: Node) -> Node:
    if isinstance(node, Not):
        child = simplify(node.child)
        if isinstance(child, Not):
            return child.child
        if isinstance(child, Always):
            return Always(not child.value)
        return Not(child)
    if isinstance(node, (AnyOf, AllOf)):
        kind = type(node)
        absorbing = isinstance(node, AnyOf)  # True absorbs a union, False an intersection
        flat: list[Node] = []
        for child in map(simplify, node.children):
            parts = child.children if isinstance(child, kind) else (child,)
            for part in parts:
                if isinstance(part, Always):
                    if part.value == absorbing:
                        return Always(absorbing)
                    continue
                if part not in flat:
                    flat.append(part)
        if not flat:
            return Always(not absorbing)
        return flat[0] if len(flat) == 1 else kind(tuple(flat))
    if isinstance(node, Predicate) and node.expr in (sympy.true, sympy.false):
        return Always(bool(node.expr))
    return node
