"""Run-time segments and text lengths: what a spec's `runtime:` section adds to a call.

A module compiled with `runtime: {segments: true}` takes `segment_ids` (int32 [seq] or
[batch, seq], in the user's token order): keep(q, k) additionally requires the same id. With
`runtime: {text_lengths: true}` it takes `text_lengths` (int32 [] or [batch]): text token t
(counted from the first text token) is real when t < length; the others are padding.

Both become one pair of per-token ids in each head's kernel order, for queries and for keys:
  * a token's segment id (0 everywhere when the call gives none);
  * a padding token, or one whose given id is negative, gets -1 as a query and -2 as a key:
    it attends nothing and nothing attends it, so a padded query row comes out as zeros
    (the kernels' rule for a row with no allowed key) and its gradients are zero.
Coordinates stay the spec's: a pattern sees the same frame, row and column numbers whatever
the segments are; segments only remove pairs.

Tables: per call, per batch element and per pattern, the compile-time visits are refined by
the ids' per-block ranges (svgen.runtime.refine) and compacted at the static maximum
(`StaticVisits.max_pieces`, the pattern's static step count), all in jnp under jit; the
kernels walk them per head (never the flat walk: its step tables would be per batch element
too), with per-row (batch * heads) first-piece and piece-count tables in SMEM and a grid as
long as the longest row's pieces.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from svgen.runtime import video_frames
from svgen.core.layout import TokenLayout
from svgen.runtime.refine import (
    StaticVisits,
    block_segment_ranges,
    block_segments,
    refine,
    segment_words,
)
from svgen.core.tables import (
    SMEM_BUDGET,
    KernelShape,
    runtime_table_bytes,
    transposed_runs,
    transposed_shape,
)

# Ids of padding tokens (and of tokens given a negative id): never equal, so never kept.
QUERY_PADDING_ID = -1
KEY_PADDING_ID = -2


@dataclasses.dataclass(frozen=True)
class RuntimeInputs:
    """What a spec's `runtime:` section declares (all False: a fully static module)."""

    segments: bool = False
    text_lengths: bool = False
    # Each video segment numbers its frames from its own first frame (svgen.runtime.video_frames).
    per_video_frames: bool = False

    @property
    def any(self) -> bool:
        return self.segments or self.text_lengths

    def arguments(self) -> tuple[str, ...]:
        """The keyword arguments of `attention` these inputs add."""
        return ("segment_ids",) * self.segments + ("text_lengths",) * self.text_lengths


class CallIds(NamedTuple):
    """One call's ids in each layout's kernel order, int32 [batch, layouts, seq] (a pytree).
    With per-video frames also each token's segment start (text tokens too) and the frame
    shift the kernels subtract (svgen.runtime.video_frames); None otherwise."""

    query: jax.Array
    key: jax.Array
    start: jax.Array | None = None
    shift: jax.Array | None = None


class CallTables(NamedTuple):
    """One call's SMEM tables (per-head walk): per row (batch * heads) its first piece and
    piece count, the pieces of every batch element one after another, and the grid's
    middle size (the most pieces of any row; traced)."""

    row_first_piece: jax.Array  # int32 [batch * heads]
    row_num_pieces: jax.Array  # int32 [batch * heads]
    entries: jax.Array  # int32 [batch * pieces per element]
    lengths: jax.Array | None
    blocks: jax.Array | None
    steps: jax.Array  # int32 []
    # A selection across segments: per piece, its chosen word (svgen.runtime.refine.refine),
    # the last scalar operand; None otherwise.
    chosen: jax.Array | None = None

    def scalar_operands(self, head_pattern) -> tuple[jax.Array, ...]:
        """The kernels' scalar-prefetch operands in their order (svgen.runtime.steps):
        head_pattern, per-row first piece and count, entries[, lengths][, blocks][,
        chosen]."""
        pieces = (self.entries, self.lengths, self.blocks, self.chosen)
        pieces = tuple(t for t in pieces if t is not None)
        return (head_pattern, self.row_first_piece, self.row_num_pieces) + pieces


def check_call_inputs(
    inputs: RuntimeInputs, segment_ids, text_lengths, batch: int | None, layout: TokenLayout
):
    """Shapes and dtypes of a call's run-time inputs (ValueError / TypeError with what was
    expected); concrete text lengths are also checked against the spec's text tokens.
    batch: the leading dimension of q (None: q has none)."""
    seq = layout.seq_len
    check_declared(inputs, segment_ids, text_lengths)
    if segment_ids is not None:
        _check_int32("segment_ids", segment_ids, ((seq,),) + (((batch, seq),) if batch else ()))
    if text_lengths is not None:
        _check_int32("text_lengths", text_lengths, ((),) + (((batch,),) if batch else ()))
        if not isinstance(text_lengths, jax.core.Tracer):
            values = np.asarray(text_lengths)
            if values.size and (values.min() < 0 or values.max() > layout.text_tokens):
                raise ValueError(
                    f"text_lengths must lie in 0 .. {layout.text_tokens} (the spec's text "
                    f"tokens), got values {int(values.min())} .. {int(values.max())}"
                )


def check_declared(inputs: RuntimeInputs, segment_ids, text_lengths) -> None:
    """Refuse a run-time input the module's spec does not declare (TypeError saying what to
    add), whatever its value: the module has no path that would use it."""
    for name, value, key, declared in (
        ("segment_ids", segment_ids, "segments", inputs.segments),
        ("text_lengths", text_lengths, "text_lengths", inputs.text_lengths),
    ):
        if value is not None and not declared:
            raise TypeError(
                f"{name}: this module was compiled without `runtime: {{{key}: true}}` in its "
                "spec; add it and run svgen compile again"
            )


def _check_int32(name: str, x, shapes: tuple[tuple[int, ...], ...]) -> None:
    dtype = getattr(x, "dtype", None)
    shape = tuple(getattr(x, "shape", ()))
    if dtype is None or np.dtype(dtype) != np.int32:
        raise TypeError(f"{name} must be int32, got {dtype or type(x).__name__}")
    if shape not in shapes:
        want = " or ".join(f"[{', '.join(map(str, s))}]" for s in shapes)
        raise ValueError(f"{name} must have shape {want}, got [{', '.join(map(str, shape))}]")


def call_ids(
    inputs: RuntimeInputs, segment_ids, text_lengths, batch: int | None, layouts
) -> CallIds | None:
    """A call's ids in each layout's kernel order, CallIds [batch, layouts, seq], after
    `check_call_inputs`; None when the call gives no run-time input (the static path).
    batch: q's leading dimension (None: q has none)."""
    check_call_inputs(inputs, segment_ids, text_lengths, batch, layouts[0])
    if segment_ids is None and text_lengths is None:
        return None
    query, key = user_order_ids(segment_ids, text_lengths, batch or 1, layouts[0])
    start = shift = None
    if inputs.per_video_frames:
        if segment_ids is not None and not isinstance(segment_ids, jax.core.Tracer):
            video_frames.check_whole_frames(segment_ids, layouts[0])
        start, shift = video_frames.segment_starts(query, layouts[0])

    def ordered(x):
        return None if x is None else layout_order_ids(x, layouts)

    return CallIds(ordered(query), ordered(key), ordered(start), ordered(shift))


def declared_signature(
    attention, inputs: RuntimeInputs, kv_cache: bool = False, select_rule: str | None = None
) -> None:
    """Let help(attention) show only the run-time inputs its module declares (kv_cache: the
    chunked calls' q_frame_offset, svgen.runtime.chunks; select_rule: the selection policy's
    top_k or top_p and return_selection, svgen.runtime.select)."""
    signature = inspect.signature(attention)
    declared = set(inputs.arguments()) | ({"q_frame_offset"} if kv_cache else set())
    declared |= {select_rule, "return_selection"} if select_rule else set()
    every = {"segment_ids", "text_lengths", "q_frame_offset", "top_k", "top_p", "return_selection"}
    undeclared = every - declared
    attention.__signature__ = signature.replace(
        parameters=[p for p in signature.parameters.values() if p.name not in undeclared]
    )


def packed_segment_ids(layout: TokenLayout, videos) -> np.ndarray:
    """Segment ids (int32 [seq], the user's order) of a packed sequence: video i takes the
    next `frames` frames and the next `slots` text slots, of which the first `real` are its
    prompt; it gets id i there, every other token (unused frames, a prompt's padding slots)
    is padding (-1). videos: (frames, real, slots) per video, in order."""
    ids = np.full(layout.seq_len, -1, np.int32)
    frame = slot = 0
    for video, (frames, real, slots) in enumerate(videos):
        if frame + frames > layout.frames or slot + slots > layout.text_tokens or real > slots:
            raise ValueError(
                f"video {video} ({frames} frames, {real} of {slots} text slots) does not fit "
                f"the {layout.frames} frames and {layout.text_tokens} text tokens left after "
                "the videos before it"
            )
        start = layout.video_start + frame * layout.tokens_per_frame
        ids[start : start + frames * layout.tokens_per_frame] = video
        ids[layout.text_start + slot : layout.text_start + slot + real] = video
        frame, slot = frame + frames, slot + slots
    return ids


def user_order_ids(segment_ids, text_lengths, batch: int, layout: TokenLayout):
    """(query ids, key ids), int32 [batch, seq] in the user's order (see the docstring).
    Traced text lengths outside 0 .. text tokens are clamped (never read out of bounds)."""
    seq = layout.seq_len
    ids = jnp.zeros((batch, seq), jnp.int32)
    if segment_ids is not None:
        ids = jnp.broadcast_to(jnp.asarray(segment_ids, jnp.int32), (batch, seq))
    padding = ids < 0
    if text_lengths is not None:
        lengths = jnp.clip(jnp.asarray(text_lengths, jnp.int32), 0, layout.text_tokens)
        lengths = jnp.broadcast_to(lengths, (batch,))
        text = np.arange(seq) - layout.text_start  # the token's place among the text
        is_text = (text >= 0) & (text < layout.text_tokens)
        padding = padding | (jnp.asarray(is_text) & (jnp.asarray(text) >= lengths[:, None]))
    return (
        jnp.where(padding, QUERY_PADDING_ID, ids),
        jnp.where(padding, KEY_PADDING_ID, ids),
    )


def layout_order_ids(ids, layouts: Sequence[TokenLayout]) -> jax.Array:
    """ids [batch, seq] (user order) -> [batch, layouts, seq], in each layout's kernel order."""
    return jnp.stack([lay.to_kernel(ids[..., None], jnp)[..., 0] for lay in layouts], axis=1)


def head_rows(ids, head_layout) -> jax.Array:
    """ids [batch, layouts, seq] -> the kernels' [batch * heads, 1, seq] (head_layout: int32
    [heads], each head's layout): lane-major rows, read as [1, tile] blocks."""
    per_head = ids[:, head_layout, :]
    return per_head.reshape(-1, 1, ids.shape[-1])


def kernel_id_rows(ids: CallIds, head_layout) -> tuple[jax.Array, jax.Array]:
    """The kernels' (query, key) id operands: [batch * heads, 1, seq], or with per-video
    frames [batch * heads, 2, seq], the frame shifts in row 1 (one DMA per side: a [2, tile]
    block takes the sublanes a [1, tile] one does)."""
    rows = [head_rows(x, head_layout) for x in (ids.query, ids.key)]
    if ids.shift is None:
        return rows[0], rows[1]
    shift = head_rows(ids.shift, head_layout)
    return tuple(jnp.concatenate([r, shift], axis=1) for r in rows)


def block_shifts(id_refs, rows, cols):
    """In a SEGMENT_BOUNDARY block: the frame shifts of its rows ([r, 1]) and columns
    ([1, c]) from the second row of the [2, tile] id blocks (per-video frames), or None when
    the id blocks hold ids only."""
    if id_refs[0].shape[0] != 2:
        return None
    return jnp.transpose(id_refs[0][1:2, rows]), id_refs[1][1:2, cols]


def same_segment(id_refs, rows, cols):
    """bool [r, c]: which pairs of a SEGMENT_BOUNDARY block share a segment (the walk's row
    ids against its column ids, row 0 of the id blocks)."""
    return jnp.transpose(id_refs[0][0:1, rows]) == id_refs[1][0:1, cols]


@dataclasses.dataclass(frozen=True, eq=False)
class SegmentTables:
    """The static side of per-call tables: each pattern's visits (forward, or the dk/dv
    kernel's transposed ones), the layout the pattern's ids are read in, and the sizes."""

    visits: tuple[StaticVisits, ...]
    layout_index: tuple[int, ...]  # per pattern: its layout among the module's layouts
    shape: KernelShape  # the walk's shape (transposed for dk/dv)
    slots: int
    transposed: bool
    # per pattern, with per-video frames: its VideoKinds (visits are then its superset's)
    video: tuple = ()

    @classmethod
    def build(
        cls,
        runs_per_pattern,
        layout_index,
        shape: KernelShape,
        slots: int,
        transposed: bool,
        video=(),
        layouts=(),
    ) -> "SegmentTables":
        """video: per pattern its video_frames.VideoFrames or None (per-video frames; then
        `layouts` gives each pattern's layout), else ()."""
        walk_shape = transposed_shape(shape) if transposed else shape
        rq, rk = walk_shape.q_blocks_per_tile, walk_shape.kv_blocks_per_tile

        def walk_runs(runs):
            return transposed_runs(runs, shape) if transposed else runs

        if video:
            runs_per_pattern = [r if v is None else v.runs for r, v in zip(runs_per_pattern, video)]
        visits = tuple(StaticVisits.from_runs(walk_runs(r), rq, rk) for r in runs_per_pattern)
        kinds = ()
        if video:
            kinds = tuple(
                None if v is None else _video_kinds(v, vis, lay, walk_shape, transposed, walk_runs)
                for v, vis, lay in zip(video, visits, layouts)
            )
        return cls(visits, tuple(layout_index), walk_shape, slots, transposed, kinds)

    @functools.cached_property
    def first_piece(self) -> np.ndarray:
        """Where each pattern's pieces start within one batch element's tables."""
        sizes = np.array([v.max_pieces for v in self.visits], np.int64)
        return (np.cumsum(sizes) - sizes).astype(np.int32)

    @property
    def pieces_per_element(self) -> int:
        return int(sum(v.max_pieces for v in self.visits))

    def smem_bytes(self, batch: int, heads: int) -> int:
        """SMEM of the call's tables (svgen.core.tables.runtime_table_bytes)."""
        pieces = [v.max_pieces for v in self.visits]
        return runtime_table_bytes(pieces, self.slots, self.shape.compute_blocks, batch, heads)

    def check_smem(self, batch: int, heads: int) -> None:
        need = self.smem_bytes(batch, heads)
        if need > SMEM_BUDGET:
            raise ValueError(
                f"the run-time tables of {batch} batch elements x {heads} heads need "
                f"{need:,} bytes of SMEM, over {SMEM_BUDGET:,}: call with fewer batch "
                f"elements at a time (each element has its own tables)"
            )

    def tables(self, ids: CallIds, head_pattern) -> CallTables:
        """The call's tables from its ids [batch, layouts, seq] (query and key ids in each
        layout's order), for int32 head_pattern [heads]."""
        batch = ids.query.shape[0]
        # The walk's rows are keys in the transposed (dk/dv) walk.
        row_ids, col_ids = (ids.key, ids.query) if self.transposed else (ids.query, ids.key)
        # Each token's segment start (per-video frames; unread without them).
        starts = ids.start if ids.start is not None else jnp.zeros_like(row_ids)
        video = self.video or (None,) * len(self.visits)
        per_pattern = [
            jax.vmap(functools.partial(self._pattern_pieces, visits, kinds))(
                row_ids[:, lay], col_ids[:, lay], starts[:, lay]
            )
            for visits, kinds, lay in zip(self.visits, video, self.layout_index)
        ]

        def joined(field: str):
            parts = [getattr(p, field) for p in per_pattern]
            return None if parts[0] is None else jnp.concatenate(parts, axis=1).reshape(-1)

        counts = jnp.stack([p.num_pieces for p in per_pattern], axis=1)  # [batch, patterns]
        element_first = jnp.arange(batch, dtype=jnp.int32)[:, None] * self.pieces_per_element
        row_first = element_first + jnp.asarray(self.first_piece)[head_pattern][None, :]
        row_count = counts[:, head_pattern]
        return CallTables(
            row_first.reshape(-1).astype(jnp.int32),
            row_count.reshape(-1).astype(jnp.int32),
            joined("entries"),
            joined("lengths"),
            joined("blocks"),
            jnp.max(row_count).astype(jnp.int32),
        )

    def _pattern_pieces(self, visits: StaticVisits, video, row_ids, col_ids, starts):
        words = self.pattern_words(visits, video, row_ids, col_ids, starts)
        return refine(visits, words, self.slots)

    def pattern_words(self, visits: StaticVisits, video, row_ids, col_ids, starts):
        """int32 [V]: one batch element's refined word of each of a pattern's visits, from the
        ids of the walk's rows and columns (and with per-video frames, `video` its VideoKinds,
        `starts` each token's segment start: rows and columns are the same tokens)."""
        shape = self.shape
        num_rows = visits.num_q_tiles * shape.q_blocks_per_tile
        num_cols = -(-shape.seq_len // shape.block_kv) * shape.kv_blocks_per_tile
        # Bits as well as ranges: exact EMPTY for up to 32 ids in any order (padding ids are
        # negative and never pair, so they set no bit).
        ranges = block_segments(row_ids, col_ids, shape.cq, shape.ckv, num_rows, num_cols)
        frame_kinds = start_lo = None
        if video is not None:  # the mask at the segment starts each block's pairs can have
            row_s = block_segment_ranges(starts, shape.cq, num_rows)
            col_s = block_segment_ranges(starts, shape.ckv, num_cols)
            rq, rk = shape.q_blocks_per_tile, shape.kv_blocks_per_tile
            rows = visits.q_tile[:, None] * rq + np.arange(rq)
            cols = visits.kv_tile[:, None] * rk + np.arange(rk)
            # A pair's tokens share its segment's start: both sides' ranges hold it.
            start_lo = jnp.maximum(row_s[0][rows][:, :, None], col_s[0][cols][:, None, :])
            start_hi = jnp.minimum(row_s[1][rows][:, :, None], col_s[1][cols][:, None, :])
            frame_kinds = video.kinds(visits, start_lo, start_hi)
        return segment_words(visits, *ranges, frame_kinds, start_lo)


def _video_kinds(video, visits, layout, walk_shape: KernelShape, transposed: bool, walk_runs):
    """A pattern's video_frames.VideoKinds for one walk (rows are keys when transposed)."""
    num_rows = visits.num_q_tiles * walk_shape.q_blocks_per_tile
    num_cols = -(-walk_shape.seq_len // walk_shape.block_kv) * walk_shape.kv_blocks_per_tile
    rows = video_frames.FrameBlocks.of(layout, walk_shape.cq, num_rows)
    cols = video_frames.FrameBlocks.of(layout, walk_shape.ckv, num_cols)
    groups = [walk_runs(r) for r in video.group_runs]
    return video_frames.VideoKinds.build(visits, groups, video.tree, rows, cols, not transposed)
