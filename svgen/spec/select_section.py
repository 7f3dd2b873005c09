"""The spec's `select` section: a per-call selection policy (the candidate mask the call chooses
blocks of, top_k or top_p, sampled rows, per-pattern policies with heads), and what it does
not combine with yet."""

from __future__ import annotations

from dataclasses import replace

from yaml.nodes import Node, ScalarNode

from svgen.spec.masks import MaskReader
from svgen.spec.model import HeadPatterns, Runtime, PatternSelect, Select
from svgen.spec.nodes import MISSING, Reader, join_path

SELECT_KEYS = ("candidate", "top_k", "top_p", "sampled_rows", "patterns")
#: The most query rows a select policy may sample per compute block row.
MAX_SAMPLED_ROWS = 64
TOP_K_KEYS = ("k", "min", "max")
TOP_P_KEYS = ("p", "min", "max")
#: The most blocks a select policy may keep per compute block row (the packed tables' side).
MAX_SELECT_BLOCKS = 32768


def read_select(
    r: Reader, node: Node, path: str, masks: "MaskReader", heads: HeadPatterns | None
) -> Select:
    """select: {candidate: <mask>, top_k: {k, min, max} | top_p: {p, min, max},
    sampled_rows, patterns: {<pattern>: {candidate, top_k | top_p}}} (patterns: with heads)."""
    e = r.mapping(node, path, SELECT_KEYS)
    r.require(node, path, e, ("candidate",))
    rules = [key for key in ("top_k", "top_p") if key in e]
    if len(rules) != 1:
        at = e[rules[1]][0] if rules else node
        raise r.error(at, path, "give exactly one of top_k and top_p")
    rule = rules[0]
    candidate = masks.read_mask(e["candidate"][1], join_path(path, "candidate"))
    default, least, most = _read_amounts(r, e[rule][1], join_path(path, rule), rule)
    sampled = 0
    if "sampled_rows" in e:
        limit = f"MAX_SAMPLED_ROWS, {MAX_SAMPLED_ROWS}"
        sampled = r.integer(
            e["sampled_rows"][1], join_path(path, "sampled_rows"), 1, MAX_SAMPLED_ROWS, limit
        )
    select = Select(candidate, rule, default, least, most, r.location(node, path), sampled)
    if "patterns" in e:
        select = replace(
            select,
            patterns=_read_pattern_selects(
                r, e["patterns"], join_path(path, "patterns"), masks, heads, select
            ),
        )
    return select


def _read_pattern_selects(
    r: Reader,
    entry: tuple[Node, Node],
    path: str,
    masks: "MaskReader",
    heads: HeadPatterns | None,
    select: Select,
) -> tuple[PatternSelect, ...]:
    """select.patterns: {<pattern>: {candidate: <mask>, <the section's rule>: {...}}}: per
    pattern of heads.candidates, what its heads choose from and how many; what an entry
    leaves out is the section's (a rule's block is taken whole: k or p, min and max)."""
    knode, node = entry
    if heads is None:
        raise r.error(
            knode,
            path,
            "needs heads: (patterns per head); with one mask for every head, give the "
            "candidate and amounts in select itself",
        )
    names = tuple(c.pattern for c in heads.candidates)
    given = r.mapping(
        node,
        path,
        names,
        what="a mapping {<pattern>: {candidate, " + select.rule + "}}",
        allowed_note=f"the patterns of heads.candidates are: {', '.join(names)}",
    )
    if not given:
        raise r.error(node, path, "is empty: name at least one pattern of heads.candidates")
    other = "top_p" if select.rule == "top_k" else "top_k"
    out = []
    for name in names:  # heads.candidates' order: the generated module's
        if name not in given:
            continue
        epath = join_path(path, name)
        e = r.mapping(given[name][1], epath, ("candidate", "top_k", "top_p"))
        if other in e:
            raise r.error(
                e[other][0],
                join_path(epath, other),
                f"the rule is every head's (the call takes one {select.rule}= argument): "
                f"give {select.rule} here, as select does",
            )
        if not e:
            raise r.error(given[name][1], epath, f"is empty: give candidate or {select.rule}")
        candidate = select.candidate
        if "candidate" in e:
            candidate = masks.read_mask(e["candidate"][1], join_path(epath, "candidate"))
        amounts = (select.default, select.min_blocks, select.max_blocks)
        if select.rule in e:
            rpath = join_path(epath, select.rule)
            amounts = _read_amounts(r, e[select.rule][1], rpath, select.rule)
        out.append(PatternSelect(name, candidate, *amounts, r.location(given[name][1], epath)))
    return tuple(out)


def _read_amounts(r: Reader, node: Node, path: str, rule: str) -> tuple[float, int, int | None]:
    """top_k: {k, min, max} / top_p: {p, min, max} -> (k or p, min, max). Without `max`
    (None) the candidate bounds the selection (the analysis resolves it), so `k` and `min`
    are measured against MAX_SELECT_BLOCKS instead."""
    amount_key = "k" if rule == "top_k" else "p"
    v = r.mapping(node, path, TOP_K_KEYS if rule == "top_k" else TOP_P_KEYS)
    r.require(node, path, v, (amount_key,))
    most, bound = None, (MAX_SELECT_BLOCKS, f"MAX_SELECT_BLOCKS, {MAX_SELECT_BLOCKS}")
    if "max" in v:
        most = r.integer(v["max"][1], join_path(path, "max"), 1, *bound)
        bound = (most, f"{path}.max")
    least = 0
    if "min" in v:
        least = r.integer(v["min"][1], join_path(path, "min"), 0, *bound)
    anode, apath = v[amount_key][1], join_path(path, amount_key)
    if rule == "top_k":
        return float(r.integer(anode, apath, 0, *bound)), least, most
    value = r.scalar(anode, apath) if isinstance(anode, ScalarNode) else MISSING
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not 0.0 <= float(value) <= 1.0:
        raise r.error(anode, apath, f"must be a number in 0 .. 1, got {r.describe(anode)}")
    return float(value), least, most


def check_select(r: Reader, node: Node, heads, runtime: Runtime) -> None:
    """What a select policy does not combine with yet. With `heads:` each head chooses
    among its own pattern's blocks in its own layout (svgen.runtime.select.HeadSelections);
    with segments and text lengths a chosen block keeps the keys of its queries' segment."""
    for key, given, why in (
        ("kv_cache", runtime.kv_cache, "a chunked call chooses no blocks"),
        (
            "per_video_frames",
            runtime.per_video_frames,
            "its per-video tables have no chosen blocks",
        ),
    ):
        if given:
            raise r.error(
                node,
                "select",
                f"cannot be combined with runtime.{key} yet ({why}); segments and "
                "text_lengths are taken",
            )
