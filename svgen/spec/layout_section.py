"""The spec's `layout` and `heads` sections: a token layout (a name, a tiled cube, an axis
order or a curve) and the heads' candidate patterns with their layouts and assignment."""

from __future__ import annotations


from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from svgen.core.curves import CURVE_SCOPES, CURVES, FRAME
from svgen.core.layout import AXES, AxisOrder, Curve, TILED, Tiled, TokenLayout
from svgen.spec.model import Candidate, HeadPatterns, LAYOUTS
from svgen.spec.nodes import Reader, join_path

HEADS_KEYS = ("candidates", "assign")
CANDIDATE_KEYS = ("pattern", "layout")
# The mapping form of `layout:`: exactly one of the first three (`over` goes with `curve`).
LAYOUT_KEYS = (TILED, "order", "curve", "over")
TILED_KEYS = ("frames", "rows", "cols")  # the cube, each at most the geometry's extent


def layout_words(order) -> str:
    if isinstance(order, Tiled):
        return f"tiled {order.frames}x{order.rows}x{order.cols}"
    if isinstance(order, AxisOrder):
        return f"order {order.words()}"
    if isinstance(order, Curve):
        return f"curve {order.kind}" + (f" over {order.over}" if order.over != FRAME else "")
    return str(order)


def read_layout(
    r: Reader, node: Node, path: str, geometry: TokenLayout
) -> str | Tiled | AxisOrder | Curve:
    """A layout: a name of LAYOUTS, {tiled: {frames, rows, cols}} with a cube of positive
    sizes, each at most the geometry's frames, height and width, {order: [a, b, c]}, an
    order of the axes f, h, w (svgen.core.layout.AxisOrder), or {curve: hilbert|morton}
    (svgen.core.curves)."""
    if not isinstance(node, MappingNode):
        if isinstance(node, ScalarNode) and r.scalar(node, path) == TILED:
            raise r.error(
                node, path, "tiled needs its cube: write {tiled: {frames: A, rows: B, cols: C}}"
            )
        return r.choice(node, path, LAYOUTS)
    entries = r.mapping(node, path, LAYOUT_KEYS)
    if "over" in entries and "curve" not in entries:
        raise r.error(
            entries["over"][0],
            join_path(path, "over"),
            "goes with curve: write {curve: hilbert, over: video}",
        )
    if len([key for key in entries if key != "over"]) != 1:
        raise r.error(
            node,
            path,
            "give one of {tiled: {frames: A, rows: B, cols: C}}, {order: [f, h, w]} "
            f"(the axes in any order) and {{curve: hilbert}}, got {r.describe(node)}",
        )
    if "order" in entries:
        return _read_axis_order(r, entries["order"][1], join_path(path, "order"))
    if "curve" in entries:
        kind = r.choice(entries["curve"][1], join_path(path, "curve"), CURVES)
        over = FRAME
        if "over" in entries:
            over = r.choice(entries["over"][1], join_path(path, "over"), CURVE_SCOPES)
        return Curve(kind, over)
    tpath, tnode = join_path(path, TILED), entries[TILED][1]
    cube = r.mapping(tnode, tpath, TILED_KEYS, what="a mapping {frames: A, rows: B, cols: C}")
    r.require(tnode, tpath, cube, TILED_KEYS)
    extents = {"frames": "frames", "rows": "height", "cols": "width"}
    sizes = {
        key: r.integer(
            cube[key][1],
            join_path(tpath, key),
            1,
            getattr(geometry, extents[key]),
            f"geometry.{extents[key]}: a cube fits in the video",
        )
        for key in TILED_KEYS
    }
    return Tiled(**sizes)


def _read_axis_order(r: Reader, node: Node, path: str) -> AxisOrder:
    """[a, b, c]: the axes f (frame), h (row), w (column), each once, outermost first."""
    wanted = "a list of the axes f, h and w, each once, outermost first (such as [w, h, f])"
    if not isinstance(node, SequenceNode):
        raise r.error(node, path, f"must be {wanted}, got {r.describe(node)}")
    if len(node.value) != len(AXES):
        raise r.error(node, path, f"must be {wanted}, got {len(node.value)} items")
    axes = tuple(r.choice(item, f"{path}[{i}]", AXES) for i, item in enumerate(node.value))
    if len(set(axes)) != len(AXES):
        raise r.error(node, path, f"must be {wanted}, got [{', '.join(axes)}]")
    return AxisOrder(axes)


def read_heads(
    r: Reader,
    node: Node,
    path: str,
    patterns: tuple[str, ...],
    layout: str | Tiled,
    heads: int,
    geometry: TokenLayout,
) -> HeadPatterns:
    """The ``heads`` section; ``patterns`` are the defined pattern names, ``layout`` the default."""
    e = r.mapping(node, path, HEADS_KEYS)
    r.require(node, path, e, HEADS_KEYS)

    cpath = join_path(path, "candidates")
    cnode = e["candidates"][1]
    if not isinstance(cnode, SequenceNode) or not cnode.value:
        raise r.error(
            cnode,
            cpath,
            f"must be a non-empty list of candidates "
            f"({{pattern: NAME, layout: LAYOUT}}), got {r.describe(cnode)}",
        )
    candidates: list[Candidate] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(cnode.value):
        ipath = f"{cpath}[{i}]"
        entries = r.mapping(
            item, ipath, CANDIDATE_KEYS, what="a mapping with a 'pattern' and an optional 'layout'"
        )
        r.require(item, ipath, entries, ("pattern",))
        pnode = entries["pattern"][1]
        ppath = join_path(ipath, "pattern")
        pname = r.name(pnode, ppath, "a pattern name")
        if pname not in patterns:
            known = (
                f"known patterns: {', '.join(patterns)}"
                if patterns
                else "no patterns are defined (define them under 'patterns')"
            )
            raise r.error(pnode, ppath, f"unknown pattern '{pname}'; {known}")
        if pname in seen:
            raise r.error(
                pnode,
                ppath,
                f"pattern '{pname}' is already a candidate ({seen[pname]}); "
                f"each pattern may be a candidate only once",
            )
        seen[pname] = ipath
        clayout = layout
        if "layout" in entries:
            clayout = read_layout(r, entries["layout"][1], join_path(ipath, "layout"), geometry)
        candidates.append(Candidate(pname, clayout, r.location(item, ipath)))

    apath = join_path(path, "assign")
    anode = e["assign"][1]
    names = tuple(c.pattern for c in candidates)
    if isinstance(anode, ScalarNode) and r.scalar(anode, apath) == "runtime":
        return HeadPatterns(tuple(candidates), None)
    if not isinstance(anode, SequenceNode):
        raise r.error(
            anode,
            apath,
            f"must be 'runtime' or a list of candidate pattern names, one per "
            f"head, got {r.describe(anode)}",
        )
    if len(anode.value) != heads:
        raise r.error(
            anode,
            apath,
            f"must name one candidate pattern per head: attention.heads is "
            f"{heads}, got {len(anode.value)} {'entry' if len(anode.value) == 1 else 'entries'}",
        )
    assign: list[str] = []
    for i, item in enumerate(anode.value):
        ipath = f"{apath}[{i}]"
        aname = r.name(item, ipath, "a candidate pattern name")
        if aname not in names:
            raise r.error(
                item, ipath, f"'{aname}' is not a candidate; candidates: {', '.join(names)}"
            )
        assign.append(aname)
    return HeadPatterns(tuple(candidates), tuple(assign))
