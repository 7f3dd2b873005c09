"""The plan in words: one wording of a kernel and its patterns, for the generated module's
docstring and for `svgen inspect` (which prints the same lines; `--json` has the numbers).

A reviewer reading a module and a user running `inspect` see the same sentences, so a fact
is worded, and kept true, in one place.
"""

from __future__ import annotations

import numpy as np

from svgen.analysis import Plan
from svgen.analysis.mask_functions import residual_mask_name
from svgen.analysis.plan import pattern_shape
from svgen.core.boxes import cube_fits, place_box_places
from svgen.core.kinds import TileKind
from svgen.core.straight import straight_words, word_glyphs, word_steps


def grouped(n: int) -> str:
    """An integer with thousands separators, as every count in the words is written."""
    return f"{n:,}"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def residual_names(pattern, prefix: str) -> list[str]:
    """The module's functions for every residual mask of a pattern (none without them;
    prefix: the pattern's name and "_" in a module of several patterns), named as the
    analysis printed them (svgen.analysis.mask_functions)."""
    found = pattern.residuals
    count = 0 if found is None else len(found.variants)
    return [residual_mask_name(prefix, j) for j in range(1, count + 1)]


def kernel_lines(plan: Plan, backend) -> list[str]:
    """Geometry, attention, then what `backend` (the plan's svgen.codegen.backends.Backend)
    says of its kernel (grid, tables, target, and what its run-time calls add)."""
    # The video's own sizes (a pattern's layout may hold the transposed frame's).
    spec, layout, grid = plan.spec, plan.spec.geometry, plan.grid
    text_where = f", {spec.geometry.text_position}" if layout.text_tokens else ""
    summary = [
        f"Geometry: {layout.frames} frames x {layout.height} x {layout.width} = "
        f"{grouped(layout.video_tokens)} video tokens, {grouped(layout.text_tokens)} text tokens"
        f"{text_where}; seq_len {grouped(layout.seq_len)} (padded to {grouped(grid.padded_seq_len)})",
        f"Attention: {spec.attention.heads} heads x head_dim {spec.attention.head_dim}, "
        f"{spec.attention.dtype}",
    ]
    return summary + backend.kernel_words(plan)


def heads_words(plan: Plan) -> str:
    """How each head gets its pattern."""
    if len(plan.patterns) == 1:
        return "every head uses the one pattern"
    if plan.assign is None:
        return "chosen at run time: attention(..., head_pattern=profile(q, k, v, key=...))"
    return "static: " + _head_ranges([plan.patterns[i].name for i in plan.assign])


def _head_ranges(names: list[str]) -> str:
    """Per-head pattern names grouped into runs of heads: '0-3 spatial, 4 temporal'."""
    groups: list[list] = []
    for head, name in enumerate(names):
        if groups and groups[-1][2] == name:
            groups[-1][1] = head
        else:
            groups.append([head, head, name])
    return ", ".join(f"{a} {name}" if a == b else f"{a}-{b} {name}" for a, b, name in groups)


def _chunk_lines(plan: Plan) -> list[str]:
    """A KV-cache module's per-chunk calls (none for another module)."""
    if not plan.chunk_runs:
        return []
    runtime = plan.spec.runtime
    steps = ", ".join(grouped(n) for n in plan.chunk_steps())
    lines = [
        f"KV-cache chunks of {runtime.chunk_frames} frame(s): grid steps per head of each "
        f"chunk position's call: {steps}"
    ]
    if runtime.rolling:
        lines.append(
            f"Rolling cache: {runtime.sink_frames} sink frame(s) and a ring of "
            f"{runtime.window_frames} frame(s)"
        )
    return lines


def _select_lines(plan: Plan) -> list[str]:
    """A selection module's grid bound (none for another module; its policy is worded in
    the docstring's own paragraph and in `inspect --json`)."""
    if plan.spec.select is None:
        return []
    return [f"Selection: at most {grouped(plan.select_steps())} grid steps per head, per call"]


def _tiling_from(plan: Plan) -> str:
    """Where the tiling in effect is written, for a spec that names a chip's own
    (`tiling.<chip>`); nothing for a spec that names none."""
    spec = plan.spec
    if spec.tiling_chip is not None:
        return f" (tiling.{spec.tiling_chip})"
    if spec.tilings:
        return f" (the plain tiling: no tiling.{plan.target.name})"
    return ""


def tpu_kernel_words(plan: Plan) -> list[str]:
    """The TPU kernel's docstring lines (svgen.codegen.backends): the grid and SMEM tables,
    the target and VMEM, the softmax, and what its run-time calls add (KV-cache chunks, a
    selection policy)."""
    lines = [
        f"Kernel: {_grid_steps_words(plan)}, pieces of up to "
        f"{plan.tables.slots} kv tile(s); tables {grouped(plan.table_bytes)} bytes of SMEM "
        f"(scalar prefetch)",
        f"Target: {plan.target.name}{_tiling_from(plan)}; VMEM {_mib(plan.kernel.vmem.total)} "
        f"(scoped limit "
        f"{_mib(plan.kernel.vmem.limit())})",
    ]
    if plan.spec.attention.softmax == "bounded":
        lines.append(
            "Softmax: bounded max per q tile where every row's |q| * max |k| is within "
            "svgen.runtime.softmax.BOUND_LIMIT, else online (attention.softmax_modes "
            "tells which)"
        )
    if plan.spec.attention.qk == "int8":
        lines.append(
            "QK^T: int8 (attention.qk): k smoothed by its mean over the keys, q and k quantized "
            "per compute block (svgen.runtime.quantize), int32 products rescaled; P·V in "
            f"{plan.spec.attention.dtype}; jax.grad runs the {plan.spec.attention.dtype} "
            "backward"
        )
    return lines + _box_lines(plan) + _chunk_lines(plan) + _select_lines(plan)


def _box_lines(plan: Plan) -> list[str]:
    """Where a call in the user's order reads the tokens in place (svgen.core.boxes,
    svgen.runtime.cube): every non-identity layout of the assigned patterns (of every
    candidate where heads are assigned at run time) with tiles that are boxes of the user's
    arrays, one layout (box DMA) or several (head runs). Nothing where tokens are moved."""
    if plan.spec.select is not None or plan.spec.runtime.kv_cache:
        return []
    if plan.spec.attention.qk == "int8":  # quantized in kernel order: svgen.runtime.cube
        return []
    used = plan.patterns if plan.assign is None else [plan.patterns[i] for i in plan.assign]
    layouts = [lay for lay in dict.fromkeys(p.layout for p in used) if not lay.is_identity]
    boxes = [_box_words(plan, lay) for lay in layouts]
    if not boxes or None in boxes:
        return []
    calls = " (calls without run-time inputs)" if plan.spec.runtime.any else ""
    if len({p.layout for p in used}) == 1:  # one layout: box DMA
        backward = "its backward too" if layouts[0].is_temporal_major else "its backward moves them"
        return [
            f"Tokens: each tile is read and written where it lies in the user's arrays "
            f"({boxes[0]}): a call in the user's order moves none{calls}; {backward}"
        ]
    return [
        f"Tokens: with a static assignment, one kernel call per run of heads of one layout, "
        f"each reading its heads where they lie (frame-major tiles; {'; '.join(boxes)}): a "
        f"forward call in the user's order moves none{calls}; under a gradient they are moved"
    ]


def _box_words(plan: Plan, lay) -> str | None:
    """How a layout's tiles are boxes at the plan's tiling, or None where they are not."""
    grid, compute = plan.patterns[0].grid, plan.patterns[0].compute_grid
    blocks = (grid.block_q // compute.block_q) * (grid.block_kv // compute.block_kv)
    bounded = plan.spec.attention.softmax == "bounded"
    places = place_box_places(lay, grid.block_q, grid.block_kv, blocks, bounded)
    if places is not None:
        kv = "" if places[0] == places[1] else f" (kv tiles {places[1]})"
        return f"place boxes of {lay.frames} frames x {places[0]} places{kv}"
    if cube_fits(lay, grid.block_q, grid.block_kv):
        return "cube boxes of {} frame(s) x {} row(s) x {} column(s)".format(*lay.cube)
    return None


def gpu_kernel_words(plan: Plan) -> list[str]:
    """The GPU kernel's docstring lines (svgen.codegen.backends): its launch (one program
    per q tile, which is also how its chunks and selections run) and its CSR tables."""
    gpu, tables, grid = plan.kernel.tiling, plan.tables, plan.grid
    lines = [
        f"Kernel: GPU (Pallas Triton) for {plan.target.description}: one program per q tile "
        f"and head, {grouped(tables.num_q_tiles)} q tiles of {gpu.block_q} x kv tiles of "
        f"{gpu.block_kv}, {gpu.num_warps} warps, {gpu.num_stages} stages; CSR tables "
        f"{grouped(tables.nbytes)} bytes",
    ]
    if (grid.block_q, grid.block_kv) != (gpu.block_q, gpu.block_kv):
        lines.append(
            f"Classified at {grid.block_q} x {grid.block_kv} tiles (the GPU tiles' grid would "
            f"exceed MAX_TILE_PAIRS); each GPU tile has the kind of the tile it lies in"
        )
    return lines


def _grid_steps_words(plan: Plan) -> str:
    if not plan.tables.flat:
        return f"{grouped(plan.grid_steps)} grid steps per head"
    steps = ", ".join(
        f"{p.name} {grouped(plan.pattern_grid_steps(i))}" for i, p in enumerate(plan.patterns)
    )
    return f"grid steps per head by pattern: {steps} (each head walks its own pattern's)"


def _residual_lines(pattern, names: list[str]) -> list[str]:
    """The docstring's account of a pattern's residual masks (svgen.analysis.residuals),
    `names` their functions in the module."""
    found = pattern.residuals
    if found is None:
        return []
    boundary = int(np.count_nonzero(pattern.compute_kinds == TileKind.BOUNDARY))
    chosen = sum(v.blocks for v in found.variants)
    lines = [
        f"Residual masks: {grouped(chosen)} of {grouped(boundary)} BOUNDARY compute blocks run one "
        f"of {len(found.variants)} (the rest the whole mask, ~{found.mask_ops} full-block "
        f"operations):"
    ]
    for j, (v, name) in enumerate(zip(found.variants, names), 1):
        ops = f"~{v.ops} operation" + ("" if v.ops == 1 else "s")
        lines.append(f"    {j}. {name}, {grouped(v.blocks)} blocks, {ops}")
    return lines


def pattern_lines(pattern, residual_names: list[str], plan: Plan, backend) -> list[str]:
    """Docstring lines of one pattern: counts, density, residual masks (named by
    `residual_names`), straight-line BOUNDARY tiles, visited fraction (what `backend`, the
    plan's svgen.codegen.backends.Backend, does per visited tile)."""
    layout, grid, c = pattern.layout, pattern.grid, pattern.classification
    counts = pattern.tile_counts()
    if c.density_is_exact:
        density = f"{grouped(c.kept_pairs)} of {grouped(pattern.total_pairs)} (density {pattern.density:.6f})"
    else:
        # Bounds only, and said so: a lower bound printed as "the density" misleads.
        density = (
            f"between {grouped(c.kept_pairs)} and {grouped(c.kept_pairs_upper)} of "
            f"{grouped(pattern.total_pairs)} (density bounds {pattern.density:.6f} to "
            f"{c.kept_pairs_upper / pattern.total_pairs:.6f}: a user predicate was not "
            f"evaluated everywhere)"
        )
    order = layout.order
    if layout.is_temporal_major:
        order += f", the first {layout.anchor_frames} frame(s) kept first as anchors"
    if layout.is_tiled:
        order += ", cubes of {} frame(s) x {} row(s) x {} column(s)".format(*layout.cube)
    if layout.curve:
        walk = "the whole video" if layout.curve_over_video else "each frame's places"
        order += f", {walk} along a {layout.curve} curve (sha256 {layout.curve_digest[:12]})"
    if layout.transposed:
        order += (
            f", of the transposed frame ({layout.height} x {layout.width}: the mask below "
            "reads the video's columns as rows and its rows as columns)"
        )
    lines = [
        f"Layout: {order}",
        f"Tiles: {grid.block_q} x {grid.block_kv}, {grid.num_q_blocks} x {grid.num_kv_blocks} = "
        f"{grouped(pattern.kinds.size)}: {grouped(counts['full'])} FULL, {grouped(counts['boundary'])} "
        f"BOUNDARY, {grouped(counts['empty'])} EMPTY",
    ]
    cgrid = pattern.compute_grid
    if (cgrid.block_q, cgrid.block_kv) != (grid.block_q, grid.block_kv):
        blocks = pattern.compute_block_counts()
        lines.append(
            f"Compute blocks: {cgrid.block_q} x {cgrid.block_kv}, {cgrid.num_q_blocks} x "
            f"{cgrid.num_kv_blocks} = {grouped(pattern.compute_kinds.size)}: "
            f"{grouped(blocks['full'])} FULL, {grouped(blocks['boundary'])} BOUNDARY, "
            f"{grouped(blocks['empty'])} EMPTY"
        )
    lines += [
        f"Kept pairs{' (aligned mask)' if pattern.budget else ''}: {density}",
        *_budget_lines(pattern.budget),
        *_residual_lines(pattern, residual_names),
        *_straight_lines(pattern, plan),
        f"Visited fraction: {pattern.visited_fraction:.4f} of tiles "
        f"({grouped(pattern.table.visited_steps)} {backend.visits} per head)",
    ]
    if c.unproven_tiles:
        lines.append(
            f"Unproven: {grouped(c.unproven_tiles)} BOUNDARY tiles could not be proven "
            f"EMPTY or FULL (user predicate); they stay exact through the mask"
        )
    return lines


def _straight_lines(pattern, plan: Plan) -> list[str]:
    """The blocks words whose BOUNDARY tiles the TPU kernel runs straight-line on static
    tables (svgen.core.straight; none on GPU, none for a selection, which always runs its
    own tables)."""
    if not plan.kernel.straight_bodies or plan.spec.select is not None:
        return []
    shape = pattern_shape(plan.spec, pattern)
    words = straight_words(pattern.table.runs, shape, whole_mask=pattern.residuals is None)
    if not words:
        return []
    steps, total = word_steps(pattern.table.runs, words)
    cells = ", ".join(
        f"{word_glyphs(w.word, shape.q_blocks_per_tile, shape.kv_blocks_per_tile)} {grouped(n)}"
        for w, n in zip(words, steps)
    )
    return [
        f"Straight-line BOUNDARY tiles: {grouped(sum(steps))} of {grouped(total)} BOUNDARY "
        f"steps per head run the body of their blocks word (rows of compute blocks; steps): "
        f"{cells}"
    ]


def _budget_lines(budget) -> list[str]:
    """What `tiling.align` changed, exactly (none for an exact pattern)."""
    if budget is None:
        return []
    lines = [
        f"Aligned ({budget.mode}): BOUNDARY compute blocks rounded to FULL or EMPTY; this kernel "
        f"is exact for the aligned mask",
        f"Pair budget: exact density {budget.exact_density:.6f}, aligned {budget.density:.6f}; "
        f"{grouped(budget.pairs_added)} pairs added, {grouped(budget.pairs_dropped)} dropped; recall "
        f"{budget.recall:.6f}, precision {budget.precision:.6f}; {grouped(budget.rows_emptied)} "
        f"query rows emptied (they output zeros)",
    ]
    return lines


def runtime_input_lines(runtime) -> list[str]:
    """What a call takes besides q, k and v (the spec's `runtime` section: segments, per-video
    frames, text lengths, a KV-cache chunk's offset), a line each, as the module's docstring
    and `svgen inspect` say it."""
    words = []
    if runtime.segments:
        words.append("segment_ids: int32 [seq_len] or [batch, seq_len], only pairs of one id")
    if runtime.per_video_frames:
        words.append(
            "per-video frames: a video segment (whole frames) counts its frames from its own first"
        )
    if runtime.text_lengths:
        words.append("text_lengths: int32 [] or [batch], the real text tokens (the rest: padding)")
    if runtime.rolling:
        words.append(
            f"q_frame_offset: int32 [], a chunk of {runtime.chunk_frames} frames' queries against "
            f"a rolling KV cache of {runtime.sink_frames} sink frames and a ring of "
            f"{runtime.window_frames} (frame a >= {runtime.sink_frames} in slot "
            f"{runtime.sink_frames} + (a - {runtime.sink_frames}) mod {runtime.window_frames})"
        )
    elif runtime.kv_cache:
        words.append(
            f"q_frame_offset: int32 [], a chunk of {runtime.chunk_frames} frames' queries against "
            "the KV cache of the whole video"
        )
    return words
