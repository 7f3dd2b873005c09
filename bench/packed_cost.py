"""What a packed batch costs: several videos with their own prompts in one 720p sequence.

    .venv/bin/python bench/packed_cost.py [--no-cache] [--per-video]

The spec (SPEC below) is Wan 2.1 720p's geometry (21 x 45 x 80 latent) with 512 text slots,
a spatial head (`spatial_window: {frames: 1}` and text) at the shipped spatial spec's tiles
(2048 x 4096 of 1024 x 1024 compute blocks), and `runtime: {segments: true}`. Each packing
splits the 21 frames into videos and the text slots into one prompt per video (real tokens,
then padding: negative ids). Per packing, with the refinement the generated module runs per
call (svgen.runtime.segments, on the CPU here; the same jnp program runs on the device):

  * grid steps per head of the call's tables, next to the static tables' and to the union of
    the per-video visited tiles (a tile is visited by a video when one of its compute blocks
    is statically non-EMPTY and holds that video's queries and keys; plus one zero-fill step
    per q tile that none visits): the two must be equal;
  * the call's SEGMENT_BOUNDARY blocks (those that compare ids);
  * the kernel's modelled time over the spec's 10 heads with those tables (``svgen cost``'s
    model and per-path bundles of the kernel that reads run-time tables, v6e, AOT-compiled
    on this host once and cached), next to the static tables' time.

``--per-video``: the head also attends its video's first frame (`first_frame: {frames: 1}`)
with `per_video_frames: true`, so each video anchors at its own first frame
(svgen.runtime.video_frames). The union of the per-video visited tiles is then computed at
frame level (a compute block is visited by a video when one of its video frames in the rows
and one in the columns are within one frame of each other or the column's is the video's
first, or either side holds the video's prompt and the other any of its tokens); the call's
steps must be at least that union, and the table says how many more. "static steps" is then
the superset's (every start) maximum.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from svgen import codegen  # noqa: E402
from svgen.estimate import cost, measure  # noqa: E402
from svgen.analysis import analyze  # noqa: E402
from svgen.runtime import segments  # noqa: E402
from svgen.runtime.refine import SEGMENT_BOUNDARY  # noqa: E402
from svgen.core.tables import BITS_PER_BLOCK, KIND_MASK, PieceTables  # noqa: E402
from svgen.spec import parse_spec  # noqa: E402

SPEC = """
svgen: 1
name: packed_720p
geometry: {frames: 21, height: 45, width: 80, text_tokens: 512, text_position: last}
attention: {heads: 10, head_dim: 128, dtype: bfloat16}
mask:
  any_of:
    - spatial_window: {frames: 1}
    - text: {}
tiling: {block_q: 2048, block_kv: 4096, compute_q: 1024, compute_kv: 1024}
runtime: {segments: true}
"""
# The same head with a first-frame anchor per video.
SPEC_PER_VIDEO = SPEC.replace(
    "    - text: {}\n", "    - first_frame: {frames: 1}\n    - text: {}\n"
).replace("runtime: {segments: true}", "runtime: {segments: true, per_video_frames: true}")
# (frames, real prompt tokens, prompt slots) per packed video.
PACKINGS = {
    "one video, full prompt": [(21, 512, 512)],
    "one video, 77-token prompt": [(21, 77, 512)],
    "2 videos (11 + 10 frames)": [(11, 200, 256), (10, 64, 256)],
    "3 videos (7 + 8 + 6 frames)": [(7, 120, 170), (8, 170, 171), (6, 40, 171)],
}


def refined_tables(module, ids: np.ndarray):
    """(PieceTables of the call, the refined words per static visit) for one element."""
    pattern = module._PATTERNS[0]
    walk = segments.SegmentTables.build(
        [pattern.runs],
        (0,),
        module.SHAPE,
        module.SLOTS_PER_PIECE,
        False,
        video=(pattern.video_frames,) if module.attention.runtime.per_video_frames else (),
        layouts=(pattern.layout,),
    )
    runtime = module.attention.runtime
    call = segments.call_ids(runtime, jnp.asarray(ids)[None], None, 1, [pattern.layout])
    t = walk.tables(call, jnp.zeros(1, jnp.int32))
    n = int(t.row_num_pieces[0])
    tables = PieceTables(
        np.zeros(1, np.int32),
        np.array([n], np.int32),
        np.asarray(t.entries)[:n],
        None if t.lengths is None else np.asarray(t.lengths)[:n],
        None if t.blocks is None else np.asarray(t.blocks)[:n],
        module.SLOTS_PER_PIECE,
    )
    return tables


def segment_blocks(tables: PieceTables, compute_blocks: int) -> int:
    """SEGMENT_BOUNDARY compute blocks over the call's steps (one head)."""
    lengths = np.ones(len(tables.entries)) if tables.lengths is None else tables.lengths
    if tables.blocks is None:
        return int(lengths[(tables.entries & KIND_MASK) == SEGMENT_BOUNDARY].sum())
    words = tables.blocks.astype(np.int64) & ((1 << (8 * tables.blocks.itemsize)) - 1)
    shifts = BITS_PER_BLOCK * np.arange(compute_blocks)
    per_piece = (((words[:, None] >> shifts) & KIND_MASK) == SEGMENT_BOUNDARY).sum(1)
    return int((per_piece * lengths).sum())


def union_of_videos(plan, ids: np.ndarray) -> int:
    """Steps of the union of the per-video visited tiles (block level, see the docstring)."""
    p = plan.patterns[0]
    shape = plan.layout
    grid, compute = p.grid, p.compute_grid
    kinds = p.compute_kinds  # [compute rows, compute cols], kernel order = user order here
    rq, rk = grid.block_q // compute.block_q, grid.block_kv // compute.block_kv
    seq = shape.seq_len
    rows = np.arange(kinds.shape[0])
    cols = np.arange(kinds.shape[1])
    visited = np.zeros((grid.num_q_blocks, grid.num_kv_blocks), bool)
    for video in np.unique(ids[ids >= 0]):
        member = ids == video
        per_row = np.add.reduceat(
            np.pad(member, (0, kinds.shape[0] * compute.block_q - seq)).astype(int),
            np.arange(0, kinds.shape[0] * compute.block_q, compute.block_q),
        )
        per_col = np.add.reduceat(
            np.pad(member, (0, kinds.shape[1] * compute.block_kv - seq)).astype(int),
            np.arange(0, kinds.shape[1] * compute.block_kv, compute.block_kv),
        )
        hit = (kinds != 0) & (per_row[rows][:, None] > 0) & (per_col[cols][None, :] > 0)
        r, c = np.nonzero(hit)
        visited[r // rq, c // rk] = True
    return int(visited.sum() + (~visited.any(axis=1)).sum())


def union_per_video(plan, ids: np.ndarray) -> int:
    """Steps of the union of the per-video visited tiles under per-video frames, at frame
    level (see the docstring): spatial_window {frames: 1}, the video's first frame, text."""
    layout, p = plan.layout, plan.patterns[0]
    grid, compute = p.grid, p.compute_grid
    rq, rk = grid.block_q // compute.block_q, grid.block_kv // compute.block_kv
    seq, frames = layout.seq_len, layout.frames
    position = np.arange(seq) - layout.video_start
    is_video = (position >= 0) & (position < layout.video_tokens)
    frame = np.where(is_video, position // layout.tokens_per_frame, -1)
    near = np.abs(np.arange(frames)[:, None] - np.arange(frames)[None, :]) <= 1

    def per_block(values: np.ndarray, block: int, blocks: int) -> np.ndarray:
        padded = np.zeros((blocks * block,) + values.shape[1:], bool)
        padded[:seq] = values
        return padded.reshape((blocks, block) + values.shape[1:]).any(axis=1)

    visited = np.zeros((grid.num_q_blocks, grid.num_kv_blocks), bool)
    rows_n, cols_n = grid.num_q_blocks * rq, grid.num_kv_blocks * rk
    for video in np.unique(ids[ids >= 0]):
        member = ids == video
        in_frame = (member & is_video)[:, None] & (frame[:, None] == np.arange(frames))
        first = int(frame[member & is_video].min())
        anchor = np.zeros((frames, frames), bool)
        anchor[:, first] = True
        text = member & ~is_video
        row_f, col_f = (
            per_block(in_frame, compute.block_q, rows_n),
            per_block(in_frame, compute.block_kv, cols_n),
        )
        row_any, col_any = (
            per_block(member, compute.block_q, rows_n),
            per_block(member, compute.block_kv, cols_n),
        )
        row_t, col_t = (
            per_block(text, compute.block_q, rows_n),
            per_block(text, compute.block_kv, cols_n),
        )
        hit = (row_f.astype(int) @ (near | anchor).astype(int) @ col_f.T.astype(int)) > 0
        hit |= (row_t[:, None] & col_any[None, :]) | (row_any[:, None] & col_t[None, :])
        r, c = np.nonzero(hit)
        visited[r // rq, c // rk] = True
    return int(visited.sum() + (~visited.any(axis=1)).sum())


def import_module(path: pathlib.Path):
    module_spec = importlib.util.spec_from_file_location("_packed_cost_module", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cache", action="store_true")
    parser.add_argument("--per-video", action="store_true", help="first frame per video")
    args = parser.parse_args()
    text = SPEC_PER_VIDEO if args.per_video else SPEC
    spec = parse_spec(text, source="bench/packed_cost.py")
    plan = analyze(spec)
    with tempfile.TemporaryDirectory(prefix="svgen_packed_") as tmp:
        for filename, data in codegen.render(plan, "bench/packed_cost.py").items():
            (pathlib.Path(tmp) / filename).write_bytes(data)
        module = import_module(pathlib.Path(tmp) / codegen.module_filename(spec.name))
        print("  compiling the kernel that reads run-time tables (v6e) ...", file=sys.stderr)
        paths = measure.measure_paths(module, "v6e", use_cache=not args.no_cache)
    heads = [0] * spec.attention.heads
    clock = plan.target.clock_ghz
    padding = cost.padding_tile(plan)
    static_cycles, static_steps, _ = cost.model_cycles(paths, plan.tables, heads, padding)
    static = int(plan.tables.num_pieces[0])
    if args.per_video:  # a call's maximum: the superset's steps
        superset = segments.SegmentTables.build(
            [plan.video_frames[0].runs], (0,), module.SHAPE, 1, False
        ).visits[0]
        static = superset.max_pieces
    head = "spatial head" + (" with a first-frame anchor per video" if args.per_video else "")
    print(
        f"Packed batches on Wan 2.1 720p + 512 text slots, {head}, 2048 x 4096 tiles of "
        f"1024 x 1024 blocks, {len(heads)} heads, v6e static model at {clock} GHz\n"
    )
    print(
        "| packing | steps / head | union of per-video tiles | static steps | "
        "SEGMENT_BOUNDARY blocks / head | modelled ms | static tables ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, packing in PACKINGS.items():
        ids = segments.packed_segment_ids(plan.layout, packing)
        tables = refined_tables(module, ids)
        steps = int(tables.lengths.sum()) if tables.lengths is not None else len(tables.entries)
        union = union_per_video(plan, ids) if args.per_video else union_of_videos(plan, ids)
        cycles, _, _ = cost.model_cycles(paths, tables, heads, padding)
        print(
            f"| {name} | {steps} | {union} | {static} "
            f"| {segment_blocks(tables, module.SHAPE.compute_blocks)} "
            f"| {cycles / (clock * 1e6):.2f} | {static_cycles / (clock * 1e6):.2f} |"
        )
        assert steps >= union if args.per_video else steps == union, (name, steps, union)


if __name__ == "__main__":
    main()
