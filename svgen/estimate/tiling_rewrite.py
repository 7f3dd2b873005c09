"""`svgen tune --apply`: a spec's text with a candidate's tiling written in, comments, key
order and flow style kept (a round-trip YAML parser)."""

from __future__ import annotations

from svgen.spec.errors import SpecError
from svgen.estimate.tune_rows import Candidate


def rewrite_tiling(
    text: str, c: Candidate, source: str = "<string>", chip: str | None = None
) -> tuple[str, list[str]]:
    """The spec text with the candidate's tiling, through a round-trip YAML parser (comments,
    key order and flow style kept), and what changed, in words. Keys the file has are set;
    missing ones are added only when they matter (compute blocks other than the whole tile,
    an align mode other than exact).

    `chip` (a TPU target's name): the candidate's sizes go under `tiling.<chip>` (that chip's
    own tiling; a flow mapping of the keys that matter when the spec has none yet, and
    `tiling:` itself when missing), its align at the plain `tiling.align` (every chip's:
    align changes the mask); the changes name them `<chip>.block_q`, ... and `align`.

    A `tiling` mapping (or `tiling.<chip>`) that is a YAML anchor or alias (`tiling: &t
    {...}` with `gpu: *t`) is refused: the rewrite would change every key sharing it (the
    GPU's tiles would get compute blocks). Anchored scalars inside it are fine: a new value
    replaces the alias."""
    import io

    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.util import load_yaml_guess_indent

    _, sequence, offset = load_yaml_guess_indent(text)
    rt = YAML()
    rt.preserve_quotes = True
    rt.width = 4096
    rt.indent(mapping=2, sequence=sequence or 4, offset=offset if offset is not None else 2)
    data = rt.load(text)
    wanted = {
        "block_q": c.block_q,
        "block_kv": c.block_kv,
        "compute_q": c.compute_q,
        "compute_kv": c.compute_kv,
        "align": c.align,
    }
    needed = c.tiling()
    tiling = data.get("tiling")
    _refuse_anchor(tiling, data, "tiling", source)
    if not isinstance(tiling, dict):
        tiling = CommentedMap()
        tiling.fa.set_flow_style()
        data["tiling"] = tiling
    changes = []
    sizes, prefix = tiling, ""
    if chip is not None:
        sizes, prefix = tiling.get(chip), f"{chip}."
        _refuse_anchor(sizes, tiling, f"tiling.{chip}", source)
        if not isinstance(sizes, dict):
            sizes = CommentedMap()
            sizes.fa.set_flow_style()
            tiling[chip] = sizes
    for key, value in wanted.items():
        where, shown = (tiling, key) if key == "align" else (sizes, prefix + key)
        if key in where:
            if where[key] != value:
                changes.append(f"{shown}: {where[key]} -> {value}")
                where[key] = value
        elif key in needed:
            changes.append(f"{shown}: (not given) -> {value}")
            where[key] = value
    out = io.StringIO()
    rt.dump(data, out)
    return out.getvalue(), changes


def _refuse_anchor(mapping, parent, path: str, source: str) -> None:
    """A SpecError when ``mapping`` (``parent``'s value at the last key of ``path``) is a
    YAML anchor: rewriting it would change every key that shares it."""
    from ruamel.yaml.comments import CommentedMap

    if isinstance(mapping, CommentedMap) and mapping.anchor.value is not None:
        line, column = parent.lc.key(path.rpartition(".")[2])
        raise SpecError(
            f"--apply does not rewrite a tiling written with a YAML anchor or alias "
            f"(&{mapping.anchor.value}): it would change every key that shares it; write "
            f"{path}'s keys out in full, then run again",
            file=source,
            line=line + 1,
            column=column + 1,
            key=path,
        )
