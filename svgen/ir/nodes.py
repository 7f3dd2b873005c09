"""The mask algebra's nodes: what every spec desugars to (see svgen.ir), and `simplify`.

The parts: `facts` (what a node provides and what the analysis may assume of it),
`builtin_nodes` (the built-ins over token coordinates), `predicates` (a user `expr`, and the
built-ins lowered to their predicates), `block_data` (a block mask given as data) and
`algebra` (any_of, all_of, not, and `simplify`). This module names them all in one place.
"""

from __future__ import annotations

from svgen.ir.algebra import AllOf, AnyOf, Not, simplify
from svgen.ir.block_data import BlockBit, BlockData
from svgen.ir.builtin_nodes import (
    Always,
    Band,
    BlockCausal,
    CausalFrames,
    CubeWindow,
    FirstFrame,
    Prefix,
    SpatialWindow,
    TemporalStride,
    Text,
    band_width_from_density,
)
from svgen.ir.facts import Node, NodeFacts, NotTransposable
from svgen.ir.predicates import Neighborhood, Predicate, Radial

__all__ = [
    "AllOf",
    "Always",
    "AnyOf",
    "Band",
    "BlockBit",
    "BlockCausal",
    "BlockData",
    "CausalFrames",
    "CubeWindow",
    "FirstFrame",
    "Neighborhood",
    "Node",
    "NodeFacts",
    "Not",
    "NotTransposable",
    "Predicate",
    "Prefix",
    "Radial",
    "SpatialWindow",
    "TemporalStride",
    "Text",
    "band_width_from_density",
    "simplify",
]
