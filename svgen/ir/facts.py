"""What every mask node provides (`Node`) and what the analysis may assume of it (`NodeFacts`),
with the exchange of rows and columns a transposed frame makes."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import sympy

from svgen.spec.expr import SYMBOLS
from svgen.core.layout import Coordinates

_S = SYMBOLS


class NodeFacts:
    """What the analysis may assume of a mask node, declared with its semantics instead of
    in isinstance chains across the compiler. Every built-in node inherits this; a primitive
    overrides the facts that hold for it. The defaults are the safe answers: a node that
    declares nothing is analyzed the general way (row sets, no per-axis form), is taken to
    depend on the query's frame and on the segment's start, attends no anchor frames and may
    keep pairs with text tokens."""

    def anchor_frames(self) -> int:
        """The most leading frames a first_frame in the node attends (0: none); a
        temporal-major layout keeps that many frames first."""
        return 0

    def frame_invariant(self) -> bool:
        """For video queries, the allowed keys never depend on the query's frame."""
        return False

    def shift_invariant(self) -> bool:
        """The node means the same at every segment start under per-video frame numbering
        (svgen.analysis.video_frames): it reads frames only as f_q - f_k of two video tokens,
        or none at all."""
        return False

    def excludes_text(self) -> bool:
        """The node keeps no pair with a text token."""
        return False

    def axis_term(self) -> tuple[str, frozenset] | None:
        """The node as one conjunction of per-axis constraints (svgen.analysis.axis_terms):
        (its token classes: "video_pair", "any_query_video_key" or "text_involved", its
        constraints as (axis, kind, parameter) triples), or None when it is not of that
        kind."""
        return None

    def transposed(self) -> "Node":
        """The node over the transposed frame (rows and columns exchanged): what a kernel
        whose layout walks a frame column by column runs (svgen.core.layout, `transposed`).
        By default the node itself where it reads no row or column, else NotTransposable: a
        node that reads them says how they exchange."""
        if reads_rows_or_cols(self.predicate()):
            raise NotTransposable(self.describe())
        return self


class NotTransposable(ValueError):
    """A mask node with no form over a transposed frame (its words in the message)."""


# The row and column symbols of both sides, each with the one it exchanges with.
_ROW_COL_SWAP = {"h_q": "w_q", "w_q": "h_q", "h_k": "w_k", "w_k": "h_k"}


def reads_rows_or_cols(expr) -> bool:
    return any(s.name in _ROW_COL_SWAP for s in expr.free_symbols)


def swap_rows_cols(expr):
    return expr.xreplace({_S[a]: _S[b] for a, b in _ROW_COL_SWAP.items()})


class Node(Protocol):
    """What every mask node provides; `svgen.spec.primitives` lists the node of each spec key
    (`Always` is the only node no spec writes: simplification's constants)."""

    def evaluate(self, q: Coordinates, k: Coordinates) -> np.ndarray: ...

    def predicate(self) -> sympy.Basic: ...

    def describe(self) -> str: ...
