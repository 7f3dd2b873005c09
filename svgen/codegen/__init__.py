"""Code generation: Plan -> the files of one generated kernel module.

`render(plan, spec_path)` returns {file name: bytes}, deterministic byte for byte: sorted
iteration only, fixed number formats, LF, final newline, no timestamps, absolute paths or
tool versions. Every .py file starts with a three-line header; its checksum covers the body
below it, so `svgen compile --check` can tell a stale file from a hand-edited one.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import io
import pathlib
import textwrap
from collections.abc import Sequence

import jinja2
import numpy as np

from svgen import ir
from svgen.analysis import Plan
from svgen.codegen import pyformat
from svgen.codegen import words as wording
from svgen.codegen.backends import backend_of

# The header's and the selection's words live in modules of their own; svgen.codegen keeps
# their names for the commands and tests that read them here.
from svgen.codegen.header import FORMAT_VERSION, Header, body_checksum, body_of  # noqa: F401
from svgen.codegen.header import module_header, parse_header  # noqa: F401
from svgen.codegen.select_words import policy_text, select_doc_lines  # noqa: F401
from svgen.analysis.mask_code import emit_mask
from svgen.analysis.mask_source import MaskSource
from svgen.codegen.tilemap import render_tile_map
from svgen.core.kinds import TileKind
from svgen.core.tables import block_table_shape, variant_bits
from svgen.spec.quoting import safe_text

_RUNS_PER_LINE = 6


def module_stem(name: str, backend: str = "tpu") -> str:
    """A GPU module sits beside the TPU one of the same spec: <name>_gpu.py."""
    return name if backend == "tpu" else f"{name}_{backend}"


def module_filename(name: str, backend: str = "tpu") -> str:
    return f"{module_stem(name, backend)}.py"


def tables_filename(name: str) -> str:
    return f"{name}_tables.npy"


def variants_filename(name: str) -> str:
    return f"{name}_variants.npy"


def chunks_filename(name: str) -> str:
    return f"{name}_chunks.npy"


def candidate_filename(name: str) -> str:
    return f"{name}_candidate.npy"


def render(plan: Plan, spec_path: str, options: Sequence[str] = ()) -> dict[str, bytes]:
    """The generated files for `plan`; `spec_path` is how the header names the spec, and
    `options` are the `svgen compile` arguments besides it that the header's Regenerate line
    must repeat (an output directory, a target...) to produce these files again."""
    name = module_stem(plan.spec.name, plan.backend)
    backend = backend_of(plan)
    files: dict[str, bytes] = {}
    single = len(plan.patterns) == 1
    patterns = []
    for pattern in plan.patterns:
        prefix = "" if single else f"{pattern.name}_"
        runs = pattern.table.runs
        printed = pattern.mask_functions
        entry = {
            "runs_name": f"{prefix.upper()}STEP_RUNS" if single else f"{prefix.upper()}RUNS",
            "layout_name": f"{prefix.upper()}LAYOUT",
            "mask_name": printed.boundary_name,
            "inline_runs": None,
            "tables_file": None,
            "tables_sha256": None,
        }
        inline_limit = backend.max_inline_runs
        if len(runs) > inline_limit:
            data = _npy_bytes(runs.astype(np.int32))
            filename = tables_filename(name if single else f"{name}_{pattern.name}")
            files[filename] = data
            entry.update(tables_file=filename, tables_sha256=hashlib.sha256(data).hexdigest())
        else:
            entry["inline_runs"] = _format_runs(runs)
        stem = name if single else f"{name}_{pattern.name}"
        entry["source"] = printed.boundary
        entry["query_values"] = [pyformat.string(c) for c in printed.query_coords]
        entry["query_values"] += list(printed.query_functions)
        entry.update(
            _variants_entry(pattern, prefix, single, inline_limit, stem, files, plan.spec.tiling)
        )
        entry["block_tables"] = (
            [] if pattern.budget else _block_tables(pattern, plan.spec.tiling, name, files)
        )
        entry.update(_chunk_entry(plan, len(patterns), stem, files))
        entry["video"] = _video_entry(plan, len(patterns), stem, files)
        patterns.append(entry)
    context = _context(plan, spec_path, patterns)
    context["select"] = _select_entry(plan, name, files)
    context["any_tables_file"] |= bool(context["select"] and context["select"]["any_file"])
    context["any_tables_file"] |= any(
        t["file"]
        for p in patterns
        if p["video"]
        for t in (p["video"]["superset"], *p["video"]["groups"])
    )
    context["any_tables_file"] |= any(p["variants_file"] for p in patterns)
    context["any_tables_file"] |= any(p["block_tables"] for p in patterns)
    context["block_tables"] = list(
        {t["tag"]: t for p in patterns for t in p["block_tables"]}.values()
    )
    body = _environment().get_template(backend.template).render(context)
    header = module_header(spec_path, options, plan.spec.digest, body)
    files[f"{name}.py"] = (header + body).encode()
    return dict(sorted(files.items()))


def block_tables_filename(name: str, tag: str) -> str:
    return f"{name}_blocks_{tag}.npy"


def block_table(node, tiling, grid) -> np.ndarray:
    """A block mask given as data as the kernels read it: uint8 [R, C, rq, ck]
    (svgen.core.tables.block_table_shape), for every compute block (r, c) the data blocks
    its rows and keys fall in, bits[(r * cq) // block + i, (c * ckv) // block + j], zero past
    the mask. A tile's BlockSpec brings its compute blocks' pieces into VMEM, so a BOUNDARY
    block picks its bits from a few data blocks, not from the whole mask (coords.block_bits)."""
    cq, ckv, b = tiling.cq, tiling.ckv, node.block
    rows, cols, rq, ck = block_table_shape(
        b, cq, ckv, grid.num_q_blocks, grid.num_kv_blocks, tiling.block_q, tiling.block_kv
    )
    row_first = np.arange(rows) * cq // b
    col_first = np.arange(cols) * ckv // b
    n_rows, n_cols = node.bits.shape
    padded = np.zeros((row_first[-1] + rq, col_first[-1] + ck), np.uint8)
    padded[:n_rows, :n_cols] = node.bits[: padded.shape[0], : padded.shape[1]]
    r_index = (row_first[:, None] + np.arange(rq))[:, None, :, None]
    c_index = (col_first[:, None] + np.arange(ck))[None, :, None, :]
    return np.ascontiguousarray(padded[r_index, c_index])


def _block_tables(pattern, tiling, name: str, files: dict[str, bytes]) -> list[dict]:
    """The block masks given as data in the pattern's mask, each once: the .npy beside the
    module that holds its table (files, updated) and what the template names and says of it."""
    out: dict[str, dict] = {}
    for node in _block_data_nodes(pattern.mask):
        if node.tag in out:
            continue
        table = block_table(node, tiling, pattern.grid)
        data = _npy_bytes(table)
        filename = block_tables_filename(name, node.tag)
        files[filename] = data
        out[node.tag] = {
            "tag": node.tag,
            "name": f"BLOCKS_{node.tag.upper()}",
            "file": filename,
            "sha256": hashlib.sha256(data).hexdigest(),
            "words": node.describe(),
            "source_sha256": node.digest,
            "file_given": node.shown_file,
            "array": None if node.array is None else safe_text(node.array),
            "head": node.head,
            "shape": " x ".join(map(str, node.bits.shape)),
            "pieces": " x ".join(map(str, table.shape[2:])),
            "cq": tiling.cq,
            "ckv": tiling.ckv,
        }
    return list(out.values())


def _block_data_nodes(mask) -> list:
    """The BlockData nodes of a mask, depth first, left to right."""
    stack, found = [mask], []
    while stack:
        node = stack.pop()
        if isinstance(node, ir.BlockData):
            found.append(node)
        stack.extend(reversed(getattr(node, "children", ())))
        if isinstance(node, ir.Not):
            stack.append(node.child)
    return found


def _variants_entry(
    pattern,
    prefix: str,
    single: bool,
    inline_limit: int,
    stem: str,
    files: dict[str, bytes],
    tiling,
) -> dict:
    """A pattern's residual masks (svgen.analysis.residuals): their functions' names and
    what each is, as the analysis printed them, and its runs' variant words, inline or in a
    .npy beside the module."""
    entry = {"variants_name": None, "inline_variants": None, "variants_file": None}
    entry["variants_sha256"] = None
    entry["residuals"] = []
    found = pattern.residuals
    if found is None:
        return entry
    entry["variants_name"] = "STEP_VARIANTS" if single else f"{prefix.upper()}VARIANTS"
    bits = variant_bits(tiling.compute_blocks)
    entry["variant_bits"] = bits  # written in hex where 4: a digit a block
    runs, words = pattern.table.runs, pattern.table.variants
    if len(runs) > inline_limit:
        data = _npy_bytes(words.astype(np.int32))
        entry["variants_file"] = variants_filename(stem)
        entry["variants_sha256"] = hashlib.sha256(data).hexdigest()
        files[entry["variants_file"]] = data
    else:
        entry["inline_variants"] = _format_variants(runs, words, bits)
    printed = pattern.mask_functions
    names = printed.residual_names
    entry["residual_masks_lines"] = _keyword_lines("residual_masks", names)
    for variant, name, source in zip(found.variants, names, printed.residuals, strict=True):
        entry["residuals"].append(
            {
                "name": name,
                "words": variant.mask.describe(),
                "blocks": wording.grouped(variant.blocks),
                "ops": variant.ops,
                "mask_lines": _mask_lines(source.lines),
                "mask_result": source.result,
                "source": source,
                "query_functions": _query_function_entries(source),
            }
        )
    return entry


def _query_function_entries(source: MaskSource) -> list[dict]:
    """A mask's query functions as the template renders them (before the mask function)."""
    return [
        {
            "name": f.name,
            "doc": f"{f.owner}'s {f.reader}, query side: once per q tile (TokenCoords.once).",
            "lines": _mask_lines(f.lines),
            "result": f.result,
        }
        for f in source.query_functions
    ]


def _keyword_lines(keyword: str, items: list[str]) -> list[str]:
    """`keyword=(items),` as an argument of tables.Pattern(...): one line when it fits, else
    an item a line, as the formatter lays it out."""
    one_line = f"        {keyword}={pyformat.literal_tuple(items)},"
    if len(one_line) <= pyformat.LINE_LENGTH:
        return [one_line]
    return [f"        {keyword}=(", *(f"            {item}," for item in items), "        ),"]


def _format_variants(runs: np.ndarray, words: np.ndarray, bits: int) -> list[str]:
    """Each run's variant word, a line per q tile as the runs: `bits` per compute block (last
    block first; 2 bits in binary, 4 in hex, a digit a block), 0 when every block runs the
    whole mask."""
    lines = []
    for q_tile in dict.fromkeys(runs[:, 0].tolist()):
        cells = [
            f"{_blocks_literal(w) if bits == 2 else _hex_literal(w)},"
            for w in words[runs[:, 0] == q_tile].tolist()
        ]
        lines += [
            " ".join(cells[i : i + 2 * _RUNS_PER_LINE])
            for i in range(0, len(cells), 2 * _RUNS_PER_LINE)
        ]
    return lines


def _chunk_entry(plan: Plan, index: int, stem: str, files: dict[str, bytes]) -> dict:
    """A pattern's chunk runs (runtime.kv_cache): inline, or in a .npy beside the module."""
    entry = {"chunk_runs_name": None, "chunk_inline_runs": None, "chunk_tables_file": None}
    if not plan.chunk_runs:
        return entry
    runs = plan.chunk_runs[index]
    prefix = "" if len(plan.patterns) == 1 else f"{plan.patterns[index].name.upper()}_"
    entry["chunk_runs_name"] = f"{prefix}CHUNK_RUNS"
    entry["num_chunk_runs"] = wording.grouped(len(runs))
    if len(runs) > backend_of(plan).max_inline_runs:
        data = _npy_bytes(runs.astype(np.int32))
        filename = chunks_filename(stem)
        files[filename] = data
        entry.update(
            chunk_tables_file=filename, chunk_tables_sha256=hashlib.sha256(data).hexdigest()
        )
    else:
        entry["chunk_inline_runs"] = _format_chunk_runs(runs)
    return entry


def _video_entry(plan: Plan, index: int, stem: str, files: dict[str, bytes]) -> dict | None:
    """A pattern's per-video frame tables (runtime.per_video_frames): its superset's runs and
    each invariant group's, inline or in .npy files beside the module, and the frame tree."""
    video = plan.video_frames[index] if plan.video_frames else None
    if video is None:
        return None
    prefix = "" if len(plan.patterns) == 1 else f"{plan.patterns[index].name.upper()}_"

    def table(name: str, runs: np.ndarray, suffix: str) -> dict:
        entry = {"name": name, "num_runs": wording.grouped(len(runs)), "inline": None, "file": None}
        if len(runs) > backend_of(plan).max_inline_runs:
            data = _npy_bytes(runs.astype(np.int32))
            entry["file"] = f"{stem}_{suffix}.npy"
            entry["sha256"] = hashlib.sha256(data).hexdigest()
            files[entry["file"]] = data
        else:
            entry["inline"] = _format_runs(runs)
        return entry

    groups = []
    for j, (runs, node) in enumerate(zip(video.group_runs, video.groups)):
        entry = table(f"{prefix}VIDEO_GROUP_{j}_RUNS", runs, f"video_group_{j}")
        entry["words"] = textwrap.wrap(f"Group {j}: {node.describe()}.", width=94)
        groups.append(entry)
    return {
        "superset": table(f"{prefix}VIDEO_RUNS", video.runs, "video"),
        "groups": groups,
        "tree_lines": pyformat.assignment(
            f"{prefix}VIDEO_FRAME_TREE", _tree_literal(video.tree), depth=0
        ),
        "tree_name": f"{prefix}VIDEO_FRAME_TREE",
    }


def _tree_literal(node) -> str:
    """A frame tree (nested tuples of names and integers) as a Python literal."""
    items = [
        pyformat.string(x)
        if isinstance(x, str)
        else str(x)
        if isinstance(x, int)
        else _tree_literal(x)
        for x in node
    ]
    return pyformat.literal_tuple(items)


def _select_entry(plan: Plan, stem: str, files: dict[str, bytes]) -> dict | None:
    """The spec's select policy and, per pattern, its policy and candidate region's runs
    (inline, or in a .npy)."""
    select = plan.spec.select
    if select is None:
        return None
    most = plan.select_max_blocks(0)
    entry = {
        "policy": policy_text(select, most),
        "doc_lines": select_doc_lines(plan),
        "candidates": [],
    }
    single = len(plan.patterns) == 1
    for index, (pattern, runs) in enumerate(zip(plan.patterns, plan.candidate_runs)):
        prefix = "" if single else f"{pattern.name.upper()}_"
        candidate = {
            "name": f"{prefix}SELECT_CANDIDATE_RUNS",
            "pattern": None if single else pattern.name,
            "policy": policy_text(plan.select_policy(index), plan.select_max_blocks(index)),
            "num_runs": wording.grouped(len(runs)),
            "inline_runs": None,
            "file": None,
        }
        if len(runs) > backend_of(plan).max_inline_runs:
            data = _npy_bytes(runs.astype(np.int32))
            candidate["file"] = candidate_filename(stem if single else f"{stem}_{pattern.name}")
            candidate["sha256"] = hashlib.sha256(data).hexdigest()
            files[candidate["file"]] = data
        else:
            candidate["inline_runs"] = _format_runs(runs)
        entry["candidates"].append(candidate)
    entry["any_file"] = any(c["file"] for c in entry["candidates"])
    return entry


# The boundary mask's docstring in every module (and in render_mask_function's text).
BOUNDARY_MASK_DOC = (
    "keep(q, k) on a BOUNDARY block, from coordinates (coords.TokenCoords) of its queries q "
    "and keys k."
)


def render_mask_function(mask, layout, name: str = "boundary_mask") -> str:
    """The source of the boundary-mask function a module of `mask` on `layout` holds (named
    `name`), with the query functions before it, rendered by the module template's own
    macro: what tests run is what modules contain."""
    source = emit_mask(mask, layout, owner=name)
    template = _environment().get_template("common/mask_function.py.j2")
    return template.module.mask_function(
        name,
        BOUNDARY_MASK_DOC,
        _mask_lines(source.lines),
        source.result,
        _query_function_entries(source),
    )


def _templates():
    """The installed `svgen.templates` package; from a checkout that is only on PYTHONPATH
    (not installed, as on a TPU machine the repository was copied to), the top-level
    templates/ folder beside svgen/ that pyproject.toml installs under that name."""
    try:
        return importlib.resources.files("svgen.templates")
    except ModuleNotFoundError:
        return pathlib.Path(__file__).resolve().parents[2] / "templates"


def _environment() -> jinja2.Environment:
    templates = _templates()
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: templates.joinpath(name).read_text()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _format_runs(runs: np.ndarray) -> list[str]:
    """Runs, each q tile's on a line of its own (continued every _RUNS_PER_LINE runs), so a
    reviewer can hold the lines against the tile map's rows. The blocks word in binary, 2
    bits per compute block (last block first), so each block's kind can be read; 0 when the
    tile is not BOUNDARY or has one compute block."""
    lines = []
    for q_tile in dict.fromkeys(runs[:, 0].tolist()):
        rows = runs[runs[:, 0] == q_tile].tolist()
        cells = [f"({q}, {kv}, {n}, {k}, {_blocks_literal(w)})," for q, kv, n, k, w in rows]
        lines += [
            " ".join(cells[i : i + _RUNS_PER_LINE]) for i in range(0, len(cells), _RUNS_PER_LINE)
        ]
    return lines


def _format_chunk_runs(runs: np.ndarray) -> list[str]:
    """Chunk runs, a line per chunk position: (position, q_block, kv_start, length, kind,
    blocks), the blocks word as in _format_runs."""
    lines = []
    for position in np.unique(runs[:, 0]).tolist():
        rows = runs[runs[:, 0] == position].tolist()
        cells = [f"({c}, {q}, {kv}, {n}, {k}, {_blocks_literal(w)})," for c, q, kv, n, k, w in rows]
        lines += [
            " ".join(cells[i : i + _RUNS_PER_LINE]) for i in range(0, len(cells), _RUNS_PER_LINE)
        ]
    return lines


def _blocks_literal(word: int) -> str:
    return "0" if word == 0 else f"0b{word:b}"


def _hex_literal(word: int) -> str:
    return "0" if word == 0 else f"0x{word:x}"


def _layout_args(layout) -> list[str]:
    """TokenLayout's fields by the spec's names, one per line (anchor frames and the cube
    only where they exist, so that modules of the other layouts read as they always did)."""
    args = [
        f"frames={layout.frames}",
        f"height={layout.height}",
        f"width={layout.width}",
        f"text_tokens={layout.text_tokens}",
        f'text_position="{layout.text_position}"',
        f'order="{layout.order}"',
    ]
    if layout.is_temporal_major:
        args.append(f"anchor_frames={layout.anchor_frames}")
    if layout.is_tiled:
        args += [
            f"cube_frames={layout.cube_frames}",
            f"cube_rows={layout.cube_rows}",
            f"cube_cols={layout.cube_cols}",
        ]
    if layout.transposed:  # height and width above are the kernel's: the video's transposed
        args.append("transposed=True")
    if layout.curve:
        args.append(f'curve="{layout.curve}"')
    if layout.curve_over_video:
        args.append(f'curve_over="{layout.curve_over}"')
    return args


def _mask_lines(lines) -> list[str]:
    """The boundary mask's statements, indented into its function, laid out as the formatter
    would (long chains split before their operators)."""
    out = []
    for line in lines:
        if line.startswith("#"):
            out.append(pyformat.INDENT + line)
        else:
            target, value = line.split(" = ", 1)
            out += pyformat.assignment(target, value, depth=1)
    return out


def _runtime_imports(plan: Plan) -> str:
    # libtpu's environment (quiet on a host without a TPU) and the backend that builds
    # `attention`: the TPU kernel's front door, or the GPU kernel (which needs nothing of the
    # TPU one). The table format (svgen.core.tables) the template imports itself.
    names = set(backend_of(plan).runtime_modules)
    if any(s.calls_coords for p in plan.patterns for s in p.mask_functions.sources):
        names.add("coords")  # mask functions call coords.within, coords.fields...
    if plan.spec.runtime.any:
        names.add("segments")
    if plan.video_frames:
        names.add("video_frames")
    if plan.chunk_runs:
        names.add("chunks")
    if plan.spec.select is not None:
        names.add("select")
    return ", ".join(sorted(names))


def _constants(plan: Plan) -> list[tuple[str, str]]:
    spec, layout, grid = plan.spec, plan.layout, plan.grid
    common = [
        ("SEQ_LEN", str(layout.seq_len)),
        ("PADDED_SEQ_LEN", str(grid.padded_seq_len)),
        ("BLOCK_Q", str(grid.block_q)),
        ("BLOCK_KV", str(grid.block_kv)),
    ]
    attention = [
        ("HEADS", str(spec.attention.heads)),
        ("HEAD_DIM", str(spec.attention.head_dim)),
        ("DTYPE", pyformat.string(spec.attention.dtype)),
    ]
    backend = backend_of(plan)
    return (
        common
        + backend.tiling_constants(plan)
        + attention
        + backend.kernel_constants(plan)
        + _chunk_constants(plan)
    )


def _chunk_constants(plan: Plan) -> list[tuple[str, str]]:
    """CHUNK_FRAMES, and a rolling cache's SINK_FRAMES and WINDOW_FRAMES."""
    runtime = plan.spec.runtime
    if not plan.chunk_runs:
        return []
    out = [("CHUNK_FRAMES", str(runtime.chunk_frames))]
    if runtime.rolling:
        out += [
            ("SINK_FRAMES", str(runtime.sink_frames)),
            ("WINDOW_FRAMES", str(runtime.window_frames)),
        ]
    return out


def _context(plan: Plan, spec_path: str, pattern_files: list[dict]) -> dict:
    spec = plan.spec
    patterns = []
    for index, (pattern, files) in enumerate(zip(plan.patterns, pattern_files)):
        mask = files["source"]
        patterns.append(
            dict(
                files,
                index=index,
                name=pattern.name,
                words=pattern.mask.describe(),
                lines=wording.pattern_lines(
                    pattern, [r["name"] for r in files["residuals"]], plan, backend_of(plan)
                ),
                tile_map=render_tile_map(pattern.kinds),
                layout_args=_layout_args(pattern.layout),
                curve_sha256=pattern.layout.curve_digest if pattern.layout.curve else None,
                num_runs=wording.grouped(len(pattern.table.runs)),
                mask_lines=_mask_lines(mask.lines),
                mask_result=mask.result,
                query_functions=_query_function_entries(mask),
                query_coords=_keyword_lines("query_coords", files["query_values"]),
            )
        )
    return {
        "name": spec.name,
        "spec_path": safe_text(spec_path),
        "single": len(plan.patterns) == 1,
        "summary": wording.kernel_lines(plan, backend_of(plan)),
        "heads": wording.heads_words(plan),
        "patterns": patterns,
        "constants": _constants(plan),
        "bounded_softmax": spec.attention.softmax == "bounded",
        "qk_int8": spec.attention.qk == "int8",
        # some head's kernel order is not the user's: attention(..., token_order="kernel")
        "reorders": any(not p.layout.is_identity for p in plan.patterns),
        "pattern_names": pyformat.literal_tuple([pyformat.string(p.name) for p in plan.patterns]),
        "head_pattern_lines": pyformat.assignment(
            "HEAD_PATTERN",
            "None"
            if plan.assign is None
            else pyformat.literal_tuple([str(i) for i in plan.assign]),
            depth=0,
        ),
        "kinds": [(k.name, int(k)) for k in TileKind],
        "boundary_mask_doc": BOUNDARY_MASK_DOC,
        "any_tables_file": any(p["tables_file"] or p["chunk_tables_file"] for p in pattern_files),
        "kv_cache": bool(plan.chunk_runs),
        "rolling": spec.runtime.rolling,
        "runtime_imports": _runtime_imports(plan),
        "runtime_inputs": _runtime_inputs(spec.runtime, bool(plan.video_frames)),
        "runtime_words": wording.runtime_input_lines(spec.runtime),
        **_program_context(plan),
    }


def _program_context(plan: Plan) -> dict:
    """What the module says of code the compiler left out to fit the chip's program budget
    (nothing where nothing was: the module is then what it always was)."""
    if plan.program.is_default or plan.backend != "tpu":
        return {"program_limits": None}
    return {
        "program_limits": plan.program.source(),
        "program_budget": f"{plan.target.name}'s budget of {plan.target.program_bundles:,} bundles",
        "program_words": plan.program.words(),
    }


def _runtime_inputs(runtime, per_video_frames: bool = False) -> str | None:
    """The make_attention argument of a spec's `runtime` section (None: not given).
    per_video_frames: some pattern's mask is anchored at frame 0 (a mask that means the same
    at every segment start needs nothing per video)."""
    if not runtime.any:
        return None
    video = ", per_video_frames=True" if per_video_frames else ""
    return (
        f"segments.RuntimeInputs(segments={runtime.segments}, "
        f"text_lengths={runtime.text_lengths}{video})"
    )
