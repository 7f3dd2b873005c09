"""The entry points: `parse_spec` (YAML text -> Spec) and `load_spec` (a file), with the
bounded YAML loader every spec goes through.
"""

from __future__ import annotations

import dataclasses
import os

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from svgen.spec.errors import SpecError
from svgen.spec.limits import (
    MAX_NAME_LEN,
    MAX_PATTERNS,
    MAX_SPEC_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
)
from svgen.core.layout import (
    FRAME_MAJOR,
)
from svgen.spec.canonical import spec_digest
from svgen.spec.masks import MaskReader, is_null
from svgen.spec.model import (
    DEFAULT_BLOCK,
    MaskTerm,
    NAME_PATTERN,
    NAME_RE,
    Runtime,
    SPEC_VERSION,
    Spec,
    TPU_CHIPS,
    Tiling,
)
from svgen.spec.nodes import MISSING, Reader, abbreviate, key_text, show_int
from svgen.spec.sections import (
    TOP_KEYS,
    check_chunk_grain,
    check_kv_cache_layouts,
    check_select,
    check_tile_grid,
    read_attention,
    read_geometry,
    read_gpu,
    read_heads,
    read_layout,
    read_runtime,
    read_select,
    read_tilings,
)

# ----------------------------------------------------------------------------- entry points


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, composing nodes only, refusing what would blow up later.

    PyYAML's composer recurses once per nesting level, so the depth is checked before each
    level is entered. Aliases make shared nodes, cheap to compose but walked once per use
    by everything after: each node's expanded size (how many nodes it stands for once every
    alias is written out) is computed from its children's, each shared node once, and
    refused past MAX_YAML_NODES before anything walks it. The key path of the node being
    composed is kept for the messages.
    """

    def __init__(self, text: str, source: str):
        super().__init__(text)
        self.source = source
        self._path: list[str] = []
        self._expanded: dict[int, int] = {}  # id(node) -> nodes once aliases are expanded

    def _error(self, mark, message: str) -> SpecError:
        return SpecError(
            message,
            file=self.source,
            line=mark.line + 1,
            column=mark.column + 1,
            key=_short_path(self._path) or None,
        )

    def compose_node(self, parent, index):
        self._path.append(_segment(parent, index))
        try:
            if self.check_event(yaml.AliasEvent):
                return self._alias(parent, index)
            if len(self._path) > MAX_YAML_DEPTH:
                raise self._error(
                    self.peek_event().start_mark,
                    f"YAML nested more than {MAX_YAML_DEPTH} deep (MAX_YAML_DEPTH)",
                )
            self._refuse_tags()
            node = super().compose_node(parent, index)
            self._count(node)
            return node
        finally:
            self._path.pop()

    def _refuse_tags(self) -> None:
        """A spec is plain data: a YAML tag (`!custom`, `!!str`) gives a value that only some
        readers accept (svgen tune re-reads the text with yaml.safe_load), so none is read."""
        event = self.peek_event()
        tag = getattr(event, "tag", None)
        if tag is not None:
            tag = tag.replace("tag:yaml.org,2002:", "!!", 1)  # as the spec writes it
            raise self._error(
                event.start_mark,
                f"YAML tags are not part of a spec (it is plain data): remove {abbreviate(tag)}",
            )

    def _alias(self, parent, index) -> Node:
        mark = self.peek_event().start_mark
        node = super().compose_node(parent, index)
        if id(node) not in self._expanded:  # still being composed: it contains itself
            raise self._error(mark, "a YAML alias refers to a node that contains it")
        return node

    def _count(self, node: Node) -> None:
        size = 1
        if isinstance(node, SequenceNode):
            size += sum(self._expanded[id(item)] for item in node.value)
        elif isinstance(node, MappingNode):
            size += sum(self._expanded[id(k)] + self._expanded[id(v)] for k, v in node.value)
        if size > MAX_YAML_NODES:
            raise self._error(
                node.start_mark,
                f"this value is more than {MAX_YAML_NODES:,} YAML "
                f"nodes, aliases expanded (MAX_YAML_NODES)",
            )
        self._expanded[id(node)] = size


def _segment(parent, index) -> str:
    """The key-path part of the node PyYAML composes as child ``index`` of ``parent``."""
    if isinstance(index, int):
        return f"[{index}]"
    if isinstance(index, ScalarNode):  # a mapping value; its key node
        return (
            index.value if len(index.value) <= MAX_NAME_LEN else index.value[:MAX_NAME_LEN] + "..."
        )
    return ""  # the document, or a mapping key (its path is the mapping's)


def _short_path(parts: list[str]) -> str:
    """``mask.any_of[0].not``; past 8 parts, the first 4 and last 3 around ``...``."""
    names = [p if p.startswith("[") else f".{p}" for p in parts if p]
    if len(names) > 8:
        names = names[:4] + ["..."] + names[-3:]
    return "".join(names).lstrip(".")


def _compose(text: str, source: str) -> Node | None:
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(
            f"the spec is {len(text):,} characters long, more than the "
            f"{MAX_SPEC_BYTES:,} of MAX_SPEC_BYTES",
            file=source,
        )
    loader = None
    try:
        # The reader refuses control characters (even in a comment) while the loader is
        # built: inside the try, so that they are a located error, not a traceback.
        loader = _BoundedLoader(text, source)
        return loader.get_single_node()
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise SpecError(
            f"YAML syntax error: special character U+{exc.character:04X} is not allowed in "
            f"YAML, not even in a comment (in a double-quoted string, write it as an escape)",
            file=source,
            line=line,
            column=column,
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or "invalid YAML"
        message = f"YAML syntax error: {problem}"
        if exc.context:
            message += f" ({exc.context})"
        if mark is None:
            raise SpecError(message, file=source) from None
        raise SpecError(message, file=source, line=mark.line + 1, column=mark.column + 1) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"YAML syntax error: {exc}", file=source) from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_spec(text: str, *, source: str = "<string>", chip: str | None = None) -> Spec:
    """Parse and validate a spec from YAML text; ``source`` names it in errors. ``chip`` (a
    name of TPU_CHIPS): `tiling` is that chip's own tiling (`tiling.<chip>`) where the spec
    names it, else the plain keys'; None: the plain keys'. Every chip's tiling is checked
    whichever is chosen, so that a spec read for one chip reads for every other."""
    if chip is not None and chip not in TPU_CHIPS:
        raise ValueError(f"unknown chip {chip!r}; one of {', '.join(TPU_CHIPS)}")
    source = str(source)
    root = _compose(text, source)
    if root is None:
        raise SpecError(
            f"the spec is empty; expected a mapping with keys {', '.join(TOP_KEYS)}", file=source
        )
    r = Reader(text, source)
    top = r.mapping(root, "", TOP_KEYS, what="a mapping at the top level")

    _check_version(r, root, top)
    r.require(root, "", top, ("name", "geometry", "attention"))
    if "mask" in top and "heads" in top:
        raise r.error(
            top["heads"][0],
            "heads",
            "give either mask (one pattern for every head) or heads (patterns per head), not both",
        )
    if "mask" not in top and "heads" not in top:
        raise r.error(root, None, "missing required key 'mask' (or 'heads')")

    name = r.unreserved(
        top["name"][1],
        "name",
        r.name(top["name"][1], "name", "a spec name"),
        "a spec name becomes the generated module's file name",
    )
    geometry = read_geometry(r, top["geometry"][1], "geometry")
    attention = read_attention(r, top["attention"][1], "attention")
    layout = FRAME_MAJOR
    if "layout" in top:
        layout = read_layout(r, top["layout"][1], "layout", geometry)
    masks = MaskReader(r)
    mask = masks.read_mask(top["mask"][1], "mask") if "mask" in top else None

    patterns = _read_patterns(r, top, masks)
    patterns.sort(key=lambda item: item[0])
    masks.check_expanded(mask, patterns)

    heads = None
    if "heads" in top:
        heads = read_heads(
            r,
            top["heads"][1],
            "heads",
            tuple(n for n, _ in patterns),
            layout,
            attention.heads,
            geometry,
        )

    plain, chip_tilings = Tiling(DEFAULT_BLOCK, DEFAULT_BLOCK), ()
    if "tiling" in top:
        plain, chip_tilings = read_tilings(r, top["tiling"][1], "tiling")
    # (where it is written, its node, the tiling): the plain keys', then each chip's own.
    tilings = [("tiling", (top.get("tiling") or top["geometry"])[1], plain)]
    for named, chip_tiling in chip_tilings:
        tilings.append((f"tiling.{named}", _chip_node(top["tiling"][1], named), chip_tiling))
    patterns_count = len(heads.candidates) if heads is not None else 1
    for path, node, each in tilings:
        check_tile_grid(r, node, path, geometry, each, patterns_count)

    gpu = read_gpu(r, top["gpu"][1], "gpu") if "gpu" in top else None
    runtime = _read_runtime(r, top, geometry, tilings, layout, heads)

    select = None
    if "select" in top:
        select = read_select(r, top["select"][1], "select", masks, heads)
        masks.check_expanded(select.candidate, patterns)
        for own in select.patterns:
            masks.check_expanded(own.candidate, patterns)
        check_select(r, top["select"][0], heads, runtime)

    spec = Spec(
        name=name,
        geometry=geometry,
        attention=attention,
        layout=layout,
        mask=mask,
        patterns=tuple(patterns),
        heads=heads,
        tiling=dict(chip_tilings).get(chip, plain),
        source=source,
        digest="",  # computed from the spec itself, the one route (svgen.spec.canonical)
        gpu=gpu,
        runtime=runtime,
        select=select,
        tilings=chip_tilings,
        tiling_chip=chip if chip in dict(chip_tilings) else None,
        plain_tiling=plain if chip in dict(chip_tilings) else None,
        tiling_given="tiling" in top,
    )
    return dataclasses.replace(spec, digest=spec_digest(spec))


def _chip_node(node: MappingNode, chip: str) -> Node:
    """The value node of ``chip``'s key in the `tiling` mapping ``node``."""
    return next(v for k, v in node.value if k.value == chip)


def _check_version(r: Reader, root, top: dict) -> None:
    """`svgen: 1` is there, and is the one spec format version this svgen reads."""
    if "svgen" not in top:
        raise r.error(
            root, None, "missing required key 'svgen' (the spec format version; write 'svgen: 1')"
        )
    vnode = top["svgen"][1]
    version = r.scalar(vnode, "svgen") if isinstance(vnode, ScalarNode) else MISSING
    if isinstance(version, bool) or version != SPEC_VERSION or not isinstance(version, int):
        got = (
            show_int(version)
            if isinstance(version, int) and not isinstance(version, bool)
            else r.describe(vnode)
        )
        raise r.error(
            vnode,
            "svgen",
            f"must be {SPEC_VERSION} (the only spec format version this svgen "
            f"understands), got {got}",
        )


def _read_patterns(r: Reader, top: dict, masks: MaskReader) -> list[tuple[str, MaskTerm]]:
    """The named patterns, in file order (names checked: plain, unreserved, not repeated)."""
    patterns: list[tuple[str, MaskTerm]] = []
    if "patterns" in top and not is_null(r, top["patterns"][1], "patterns"):
        pnode = top["patterns"][1]
        if not isinstance(pnode, MappingNode):
            raise r.error(
                pnode,
                "patterns",
                f"must be a mapping from pattern names to masks, got {r.describe(pnode)}",
            )
        seen: dict[str, Node] = {}
        for knode, vnode in pnode.value:
            if not isinstance(knode, ScalarNode):
                raise r.error(
                    knode, "patterns", f"pattern names must be plain names, got {r.describe(knode)}"
                )
            pname = knode.value
            ppath = f"patterns.{key_text(pname)}"
            if pname in seen:
                first = seen[pname].start_mark.line + 1
                raise r.error(
                    knode, ppath, f"duplicate key '{pname}' (first given on line {first})"
                )
            if not NAME_RE.match(pname) or len(pname) > MAX_NAME_LEN:
                raise r.error(
                    knode,
                    ppath,
                    f"pattern name must match {NAME_PATTERN} and be at most "
                    f"{MAX_NAME_LEN} characters, got {abbreviate(pname)}",
                )
            r.unreserved(knode, ppath, pname, "pattern names become names in the generated module")
            if len(patterns) == MAX_PATTERNS:
                raise r.error(knode, ppath, f"more than {MAX_PATTERNS} patterns (MAX_PATTERNS)")
            seen[pname] = knode
            patterns.append((pname, masks.read_mask(vnode, ppath)))
    return patterns


def _read_runtime(r: Reader, top: dict, geometry, tilings, layout, heads) -> Runtime:
    """The run-time inputs, with the KV-cache checks that need the layout, heads and every
    tiling (``tilings``: (where it is written, its node, the tiling), the plain keys' first)."""
    runtime = Runtime()
    if "runtime" in top:
        runtime = read_runtime(r, top["runtime"][1], "runtime", geometry)
        if runtime.kv_cache:
            check_kv_cache_layouts(r, top["runtime"][1], layout, heads)
            for path, _, tiling in tilings:
                check_chunk_grain(
                    r, top["runtime"][1], geometry, tiling, runtime,
                    len(heads.candidates) if heads is not None else 1, path,
                )  # fmt: skip
            tiling = tilings[0][2]  # align is the plain keys' (every chip's)
            if tiling.aligned:
                raise r.error(
                    top["runtime"][1],
                    "runtime.kv_cache",
                    f"needs tiling.align: exact (got {tiling.align}): the chunks' tiles are "
                    "not the full sequence's, so they would round other blocks",
                )
    return runtime


def load_spec(path: str | os.PathLike, chip: str | None = None) -> Spec:
    """Read and parse the spec file at ``path``; ``chip``: whose tiling (parse_spec)."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as fh:
            raw = fh.read(MAX_SPEC_BYTES + 1)  # never more: the file may be endless
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise SpecError(f"cannot read the spec file: {reason}", file=source) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            f"the spec file is larger than the {MAX_SPEC_BYTES:,} bytes of MAX_SPEC_BYTES",
            file=source,
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"the spec file is not valid UTF-8 (byte {exc.start})", file=source
        ) from None
    return parse_spec(text, source=source, chip=chip)
