"""The runs a call's tables are built from on the device, besides the patterns' own: with
runtime.per_video_frames, each pattern's superset and frame groups (svgen.analysis.
video_frames); with runtime.kv_cache, every chunk position's (svgen.analysis.chunks); with
`select`, each pattern's candidate region. Each classified at the spec's tiles, under the
analysis's work budgets."""

from __future__ import annotations

import numpy as np

from svgen import ir
from svgen.analysis import chunks, video_frames
from svgen.analysis.errors import candidate_key, kv_cache_error
from svgen.analysis.kernel_masks import over_kernel_frame
from svgen.analysis.patterns import mask_runs
from svgen.analysis.plan import PatternPlan, VideoFramePlan
from svgen.analysis.run import Settings
from svgen.core.ring import RingCache
from svgen.spec import Spec, Tiling
from svgen.spec.errors import SpecError
from svgen.spec.limits import WorkOverLimit


def plan_video_frames(run) -> None:
    """Pass: runtime.per_video_frames' supersets and frame trees, per pattern."""
    run.video_frames = _video_frames(run.spec, run.patterns, run.progress, run.settings)


def plan_chunks(run) -> None:
    """Pass: runtime.kv_cache's chunk runs, per pattern and chunk position."""
    if run.spec.runtime.kv_cache:
        run.chunk_runs = _chunk_runs(run.spec, run.patterns, run.spec.tiling, run.settings)


def plan_candidates(run) -> None:
    """Pass: a selection's candidate region, per pattern in the pattern's own layout."""
    if run.spec.select is not None:
        run.candidate_runs = tuple(
            _candidate_runs(run.spec, p, run.progress, run.settings) for p in run.patterns
        )


def _video_frames(spec: Spec, patterns, progress, settings: Settings) -> tuple:
    """runtime.per_video_frames: per pattern, its superset and frame tree
    (svgen.analysis.video_frames), or None for a mask that means the same at every segment
    start; () without the key, or when every pattern is such a mask."""
    if not spec.runtime.per_video_frames:
        return ()
    named = len(patterns) > 1
    plans = tuple(_video_frame_plan(spec, p, progress, named, settings) for p in patterns)
    return plans if any(plans) else ()


def _video_frame_plan(
    spec: Spec, pattern, progress, named: bool, settings: Settings
) -> VideoFramePlan | None:
    """A pattern's superset and frame groups, or None for a mask that means the same at every
    segment start."""
    try:
        tree = video_frames.frame_tree(pattern.mask)
    except video_frames.NotPerVideo as refused:
        where = spec.runtime.frames_where
        which = f"pattern {pattern.name!r}: " if named else ""
        message = f"{which}{refused}"
        if where is None:
            raise SpecError(message, file=spec.source, key="runtime.per_video_frames") from None
        raise SpecError(
            message, file=where.file, line=where.line, column=where.column, key=where.key
        ) from None
    if tree.tree == ("group", 0):
        return None

    def runs_of(mask) -> np.ndarray:
        return mask_runs(spec, pattern.name, mask, pattern.layout, progress, settings)

    superset_runs = runs_of(video_frames.superset(pattern.mask, spec.geometry.frames))
    groups = tuple(runs_of(g) for g in tree.groups)
    return VideoFramePlan(superset_runs, groups, tree.tree, tree.groups)


def _chunk_runs(spec: Spec, patterns, tiling: Tiling, settings: Settings) -> tuple:
    """Every pattern's chunk runs (svgen.analysis.chunks), under the analysis's work budgets:
    their classification is the full sequence's at a finer row grain."""
    runtime = spec.runtime
    cf = runtime.chunk_frames
    with settings.work_budgets():
        try:
            if runtime.rolling:
                return tuple(_ring_runs(spec, p, tiling, len(patterns) > 1) for p in patterns)
            return tuple(chunks.chunk_runs(p.mask, p.layout, tiling, cf) for p in patterns)
        except WorkOverLimit as over:
            raise kv_cache_error(
                spec,
                f"classifying every chunk position went over the analysis's work limit "
                f"({over}); use longer chunks or larger compute blocks",
            ) from None


def _ring_runs(spec: Spec, pattern, tiling: Tiling, named: bool):
    """A pattern's chunk runs against the rolling cache, which must hold every frame a
    chunk's mask keeps."""
    runtime = spec.runtime
    ring = RingCache(runtime.chunk_frames, runtime.sink_frames, runtime.window_frames)
    try:
        return chunks.ring_runs(pattern.mask, pattern.layout, tiling, ring)
    except chunks.EvictedFrames as evicted:
        raise kv_cache_error(
            spec,
            f"{f'pattern {pattern.name!r}: ' if named else ''}the chunk at frame "
            f"{evicted.position * ring.chunk_frames} keeps frame {evicted.frame}, which a "
            f"ring of {ring.window_frames} frames (after {ring.sink_frames} sink frames) has "
            f"evicted: window_frames must be at least {evicted.need} for this mask, or the "
            "mask must not reach that far back",
        ) from None


def _candidate_runs(spec: Spec, always: PatternPlan, progress, settings: Settings) -> np.ndarray:
    """The candidate region of the always-kept pattern's heads (select.candidate, or
    select.patterns.<name>.candidate) classified at the spec's tiles, in that pattern's
    layout: its runs (the compute blocks it touches are the ones a call may choose)."""
    select = spec.select.for_pattern(always.name)
    key = candidate_key(spec, always.name)
    mask = ir.lower(spec, select.candidate)
    mask = over_kernel_frame(spec, mask, always.layout, spec.layout, select.where, key)
    return mask_runs(spec, key, mask, always.layout, progress, settings)
