"""The spec's `runtime` section: the run-time inputs a module takes (segments, text lengths,
per-video frames) and its KV-cache chunks, with their checks against the layouts and the
tiling."""

from __future__ import annotations

import math
from typing import Any

from yaml.nodes import Node, ScalarNode

from svgen.spec.limits import MAX_TILE_PAIRS
from svgen.core.layout import FRAME_MAJOR, TokenLayout
from svgen.spec.layout_section import layout_words
from svgen.spec.masks import is_null
from svgen.spec.model import Runtime, Tiling
from svgen.spec.nodes import MISSING, Reader, join_path

RUNTIME_KEYS = ("segments", "text_lengths", "per_video_frames", "kv_cache")
KV_CACHE_KEYS = ("chunk_frames", "sink_frames", "window_frames")


def read_runtime(r: Reader, node: Node, path: str, geometry: TokenLayout) -> Runtime:
    """The `runtime` section: which run-time inputs the module takes (booleans), and the
    KV-cache chunks (`kv_cache: {chunk_frames: C}`)."""
    if is_null(r, node, path):
        return Runtime()
    e = r.mapping(node, path, RUNTIME_KEYS)
    vals: dict[str, Any] = {}
    for key in ("segments", "text_lengths", "per_video_frames"):
        if key not in e:
            continue
        vnode = e[key][1]
        value = r.scalar(vnode, join_path(path, key)) if isinstance(vnode, ScalarNode) else MISSING
        if not isinstance(value, bool):
            raise r.error(
                vnode, join_path(path, key), f"must be true or false, got {r.describe(vnode)}"
            )
        vals[key] = value
    if "per_video_frames" in e:
        key_path = join_path(path, "per_video_frames")
        vals["frames_where"] = r.location(e["per_video_frames"][1], key_path)
    if "kv_cache" in e:
        vals.update(_read_kv_cache(r, e["kv_cache"][1], join_path(path, "kv_cache"), geometry))
    runtime = Runtime(**vals)
    if runtime.per_video_frames and not runtime.segments:
        raise r.error(
            e["per_video_frames"][1],
            join_path(path, "per_video_frames"),
            "needs `segments: true`: frames are numbered per video segment",
        )
    if runtime.text_lengths and geometry.text_tokens == 0:
        raise r.error(
            e["text_lengths"][1],
            join_path(path, "text_lengths"),
            "needs text tokens: the geometry has none (geometry.text_tokens)",
        )
    if runtime.kv_cache and runtime.any:
        key = "segments" if runtime.segments else "text_lengths"
        raise r.error(
            e[key][1],
            join_path(path, key),
            "cannot be combined with kv_cache yet: a chunked call takes no segment ids or "
            "text lengths",
        )
    return runtime


def _read_kv_cache(r: Reader, node: Node, path: str, geometry: TokenLayout) -> dict:
    """kv_cache: {chunk_frames: C, window_frames: W, sink_frames: S}: C divides the
    geometry's frames (the longest video, in chunks of C frames), and the tokens are video
    only (text belongs to cross-attention). W (optional): a rolling cache of S sink frames
    (default 0) and a ring of W >= C frames, S + W at most the video's frames."""
    e = r.mapping(node, path, KV_CACHE_KEYS, what="a mapping {chunk_frames: C}")
    r.require(node, path, e, ("chunk_frames",))
    cpath = join_path(path, "chunk_frames")
    chunk = r.integer(e["chunk_frames"][1], cpath, 1, geometry.frames, "geometry.frames")
    if geometry.frames % chunk:
        raise r.error(
            e["chunk_frames"][1],
            cpath,
            f"must divide geometry.frames ({geometry.frames}): the video is generated in "
            f"chunks of {chunk} frames, got a last chunk of {geometry.frames % chunk}",
        )
    if geometry.text_tokens:
        raise r.error(
            node,
            path,
            "needs a video-only geometry (geometry.text_tokens is "
            f"{geometry.text_tokens}): the chunks and the cache are frames; attend text "
            "in a cross-attention of its own",
        )
    out = {"chunk_frames": chunk, "where": r.location(node, path)}
    if "sink_frames" in e and "window_frames" not in e:
        raise r.error(
            e["sink_frames"][1],
            join_path(path, "sink_frames"),
            "needs window_frames: sink frames belong to a rolling cache (sink_frames plus a "
            "ring of window_frames)",
        )
    if "window_frames" in e:
        spath = join_path(path, "sink_frames")
        sink = 0
        if "sink_frames" in e:
            sink = r.integer(
                e["sink_frames"][1],
                spath,
                0,
                geometry.frames - chunk,
                "geometry.frames - chunk_frames",
            )
        wpath = join_path(path, "window_frames")
        window = r.integer(
            e["window_frames"][1], wpath, 1, geometry.frames - sink, "geometry.frames - sink_frames"
        )
        if window < chunk:
            raise r.error(
                e["window_frames"][1],
                wpath,
                f"must be at least chunk_frames ({chunk}): the ring holds the chunk being "
                f"generated, got {window}",
            )
        out.update(sink_frames=sink, window_frames=window)
    return out


def check_kv_cache_layouts(r: Reader, node: Node, layout, heads) -> None:
    """Chunked calls read the chunk's frames as one run of tokens: frame-major layouts only."""
    layouts = [("layout", layout)]
    if heads is not None:
        layouts += [
            (f"heads.candidates[{i}].layout", c.layout) for i, c in enumerate(heads.candidates)
        ]
    for key, order in layouts:
        if order != FRAME_MAJOR:
            raise r.error(
                node,
                "runtime.kv_cache",
                f"needs frame_major layouts, but {key} is {layout_words(order)}: a chunk of "
                "frames must be one run of tokens",
            )


def check_chunk_grain(
    r: Reader,
    node: Node,
    geometry: TokenLayout,
    tiling: Tiling,
    runtime: Runtime,
    patterns: int,
    tiling_path: str = "tiling",
) -> None:
    """The chunks' tables come from one classification of the sequence in row blocks of
    gcd(compute_q, chunk tokens) (svgen.analysis.chunks): its grid must fit MAX_TILE_PAIRS,
    as the full sequence's does, before any of it is allocated. A rolling cache's come from
    every row against the cache's key pieces (its compute kv blocks, cut at the ring's two
    edges): rows x pieces must fit it too. ``tiling_path``: where ``tiling`` is written (a
    chip's own, `tiling.<chip>`, is named in the message)."""
    which = "" if tiling_path == "tiling" else f"with {tiling_path}: "
    rows = runtime.chunk_frames * geometry.tokens_per_frame
    if runtime.rolling:
        cache = runtime.cache_frames(geometry.frames) * geometry.tokens_per_frame
        need = geometry.seq_len * (-(-cache // tiling.ckv) + 2) * patterns
        if need > MAX_TILE_PAIRS:
            raise r.error(
                node,
                "runtime.kv_cache",
                f"{which}classifying every chunk position of the rolling cache ({cache:,} keys in "
                f"compute blocks of {tiling.ckv}) takes {need:,} row-block pairs, more than "
                f"{MAX_TILE_PAIRS:,} (MAX_TILE_PAIRS); use a larger compute_kv or a smaller "
                "window_frames",
            )
        return
    grain = math.gcd(tiling.cq, rows)
    need = -(-geometry.seq_len // grain) * -(-geometry.seq_len // tiling.ckv) * patterns
    if need > MAX_TILE_PAIRS:
        raise r.error(
            node,
            "runtime.kv_cache",
            f"{which}chunks of {rows:,} tokens start {grain} row(s) apart from the compute_q of "
            f"{tiling.cq} (their gcd): classifying every chunk position takes "
            f"{need:,} block pairs, more than {MAX_TILE_PAIRS:,} (MAX_TILE_PAIRS); choose "
            "chunk_frames or compute_q so that chunk_frames x height x width shares a larger "
            "power of two with compute_q",
        )
