"""The mask algebra: a few hashable nodes that every spec desugars to.

Each node knows three things about itself:
  * `evaluate(q, k)`: the brute-force oracle, keep(q, k) on NumPy coordinate arrays, written
    straight from the documented semantics (tests check everything else against it);
  * `predicate()`: the same predicate as a sympy boolean over the coordinate symbols of
    `svgen.spec.expr`; code generation prints it as the boundary-tile mask;
  * `describe()`: the pattern in words, for the generated docstring;
and, through `NodeFacts`, what the analysis may assume of it (its anchor frames, whether it
depends on the query's frame or on a segment's start, whether it keeps text pairs, its
per-axis form), with safe defaults for a node that declares none.
Tile classification of nodes lives in `svgen.analysis`, which finds each node's row sets
through the primitive registry, `svgen.spec.primitives`.

`lower(spec)` resolves named patterns (a networkx dependency graph: unknown names and cycles
are errors naming the chain), desugars spec terms to nodes and simplifies the result. Which
spec key becomes which node, with which parameters, is declared in that registry.

The parts: `nodes` (every node by name, and `simplify`: `facts` says what a node provides,
`builtin_nodes` holds the built-ins over token coordinates, `predicates` the user `expr` and the
built-ins lowered to predicates, `block_data` a block mask given as data, `algebra` any_of,
all_of, not and `simplify`), `evaluate` (the predicate oracle), `lower` (spec terms to nodes)
and `recognize` (built-ins found inside user predicates).
"""

from __future__ import annotations

from svgen.ir.evaluate import (
    evaluate_sympy,
)
from svgen.ir.nodes import (
    AllOf,
    Always,
    AnyOf,
    Band,
    BlockBit,
    BlockCausal,
    BlockData,
    CausalFrames,
    CubeWindow,
    FirstFrame,
    Neighborhood,
    Node,
    NodeFacts,
    Not,
    NotTransposable,
    Predicate,
    Prefix,
    Radial,
    SpatialWindow,
    TemporalStride,
    Text,
    band_width_from_density,
    simplify,
)
from svgen.ir.recognize import (
    MAX_TABULATED_FRAMES,
    recognize_builtins,
    recognize_window,
)
from svgen.ir.lower import (
    lower,
)

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
    "MAX_TABULATED_FRAMES",
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
    "evaluate_sympy",
    "lower",
    "recognize_builtins",
    "recognize_window",
    "simplify",
]
