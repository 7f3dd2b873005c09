"""KV-cache chunks at call time: a module compiled with `runtime: {kv_cache: {chunk_frames:
C}}` also takes `attention(q_chunk, k_cache, v_cache, q_frame_offset=f)`.

  q_chunk   [.., heads, C * height * width, d]: the queries of frames f .. f + C - 1;
  k_cache, v_cache [.., heads, seq_len, d]: the keys and values of the whole video, frame
            by frame (a contiguous cache: frame t at rows t * height * width ..). Only frames
            before f + C are read where the mask keeps them; the later ones are never
            attended (they must only be finite: a zero-initialized cache is).
  q_frame_offset  int32 [] (may be traced): f, a multiple of C in 0 .. frames - C.

The mask is evaluated in the video's absolute coordinates (the query of chunk row r is token
f * height * width + r), with block-causality over the chunks added by the compiler, so chunk
by chunk the rows come out exactly as the full-sequence call computes them.

Tables: the compiler classified every chunk position's own tiles (svgen.analysis.chunks);
they sit in one SMEM table, position-major (table pattern = position * patterns + pattern).
With one pattern and one position for the call, the kernel gets that position's slice of
the table and a grid exactly as long (kernel.EXACT_GRID: no per-row table read); otherwise
it walks per-row first-piece and count tables (the run-time tables' walk of
svgen.runtime.segments, a grid as long as the longest row). Either way a chunk takes its
own grid steps and its own q and o bytes; per row, the chunk's first token (read once per q
tile) shifts the decoded query positions. jax.vmap folds into the rows (`rows_folded`), so
each batch element may have its own position. The gradient walks the transposed tables of
every position the same way (svgen.runtime.backward, the fused dk/dv walk).
"""

from __future__ import annotations

import dataclasses
import functools
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from svgen.core.ring import RingCache, slot_to_video
from svgen.runtime.segments import CallTables
from svgen.core.tables import KernelShape, PieceTables, as_runs, transposed_tables


@dataclasses.dataclass(frozen=True, eq=False)
class KvCache:
    """What a module's `runtime.kv_cache` compiled: the chunk's frames, the tokens of one
    frame and of the video, per pattern its chunk runs (position, q_block, kv_start, length,
    kind, blocks), and for a rolling cache its sink and ring frames (window_frames 0: a
    contiguous cache of the whole video)."""

    chunk_frames: int
    frame_tokens: int
    frames: int
    runs: tuple  # per pattern: int [n, 6]
    sink_frames: int = 0
    window_frames: int = 0

    @property
    def positions(self) -> int:
        return self.frames // self.chunk_frames

    @property
    def rolling(self) -> bool:
        return self.window_frames > 0

    @functools.cached_property
    def ring(self) -> RingCache | None:
        """A rolling cache's geometry (svgen.core.ring); None for a contiguous cache."""
        if not self.rolling:
            return None
        return RingCache(self.chunk_frames, self.sink_frames, self.window_frames)

    @property
    def cache_frames(self) -> int:
        """Frames the cache holds: the whole video, or the sink and the ring."""
        return self.frames if self.ring is None else self.ring.cache_frames

    @property
    def cache_tokens(self) -> int:
        return self.cache_frames * self.frame_tokens

    @property
    def ring_sink(self) -> int | None:
        """The token where a rolling cache's sink ends (what a masked block's slot map
        needs as a constant); None for a contiguous cache."""
        return None if self.ring is None else self.sink_frames * self.frame_tokens

    def ring_shifts(self, position, xp=np):
        """A rolling cache at a chunk position (int or traced int32): (wrap, before, after)
        in tokens (svgen.core.ring). See `ring_frames`."""
        if xp is np:
            return self.ring.shifts(position, self.frame_tokens)
        return self.ring.shifts(position, self.frame_tokens, xp, _lax_divmod)

    def ring_scalars(self, position) -> list:
        """The per-row scalars a chunked call adds for its cache: a rolling cache's traced
        (wrap, before, after), read by `slot_keys`; none for a contiguous cache."""
        return [] if self.ring is None else list(self.ring_shifts(position, jnp))

    def call_shape(self, shape: KernelShape) -> KernelShape:
        """The kernel shape of a chunked call: the video's, or with a rolling cache the
        cache's length as the kv side (its padding keys are the cache's; padded to whole
        tiles of both sizes, both powers of two, for the backward's zero padding)."""
        if self.ring is None:
            return shape
        tile = max(shape.block_q, shape.block_kv)
        return dataclasses.replace(
            shape,
            seq_len=self.cache_tokens,
            padded_seq_len=-(-self.cache_tokens // tile) * tile,
        )

    @property
    def rows(self) -> int:
        """Tokens of one chunk (the q and o rows of a chunked call)."""
        return self.chunk_frames * self.frame_tokens

    def runs_at(self, position: int, pattern: int) -> np.ndarray:
        runs = np.asarray(self.runs[pattern])
        return as_runs(runs[runs[:, 0] == position, 1:])

    def tables(self, slots: int, compute_blocks: int) -> PieceTables:
        return _piece_tables(self, slots, compute_blocks)

    def transposed_tables(self, shape: KernelShape) -> PieceTables:
        """The dk/dv walk's tables of every chunk position (position-major, as `tables`):
        per kv tile, the chunk's q tiles that visit it (one zero-fill step for a kv tile that
        none does), at the smallest piece size that fits SMEM."""
        return _transposed_tables(self, shape)

    def call_tables(
        self, tables: PieceTables, position, head_pattern, batch: int
    ) -> tuple[CallTables, bool]:
        """(the call's per-row tables, exact): every row (batch element, head) walks its
        head's pattern's pieces at its position (int32 [] for all rows, or [batch * heads]).
        With one pattern and one position for all, the position's pieces alone, from piece
        0 (a slice of the table at the longest position's length): the kernel then walks a
        grid exactly as long as they are and reads no per-row table (exact:
        kernel.EXACT_GRID)."""
        patterns = len(self.runs)
        index = position * patterns + jnp.tile(head_pattern, batch)  # [batch * heads]
        first = jnp.asarray(tables.first_piece)[index].astype(jnp.int32)
        count = jnp.asarray(tables.num_pieces)[index].astype(jnp.int32)
        exact = patterns == 1 and jnp.ndim(position) == 0
        pieces = [tables.entries, tables.lengths, tables.blocks]
        if exact:
            longest = int(tables.max_pieces)
            pieces = [
                None
                if t is None
                else lax.dynamic_slice(jnp.asarray(_padded(t, longest)), (first[0],), (longest,))
                for t in pieces
            ]
            first = jnp.zeros_like(first)
        else:
            pieces = [None if t is None else jnp.asarray(t) for t in pieces]
        return CallTables(first, count, *pieces, jnp.max(count)), exact


def slot_keys(k_pos, sink: int, scalars, rows: int, row):
    """Video key positions of a rolling cache's slot positions k_pos in a masked block: its
    per-row scalars (`ring_scalars`, after the rows' first tokens and defined flags or table
    patterns, 2 * rows) read from SMEM, then the slot map. The TPU forward, the dk/dv walk
    and the GPU kernel evaluate the mask at these."""
    wrap, before, after = (scalars[i * rows + row] for i in (2, 3, 4))
    return slot_to_video(k_pos, sink, wrap, before, after, jnp)


def ring_frames(cache: "KvCache", position: int) -> np.ndarray:
    """The video frame each cache slot holds at a chunk position (int [cache_frames]): the
    slot map at frame grain (the tests' and the examples' statement of the convention)."""
    wrap, before, after = (int(x) // cache.frame_tokens for x in cache.ring_shifts(position))
    return slot_to_video(np.arange(cache.cache_frames), cache.sink_frames, wrap, before, after)


def _padded(table: np.ndarray, extra: int) -> np.ndarray:
    """The table with `extra` copies of its last piece after it: a slice from any piece start
    stays inside (lax.dynamic_slice would move a start that runs past the end)."""
    return np.concatenate([table, np.repeat(table[-1:], extra)])


@functools.lru_cache(maxsize=8)
def _transposed_tables(cache: KvCache, shape: KernelShape) -> PieceTables:
    runs = [cache.runs_at(c, p) for c in range(cache.positions) for p in range(len(cache.runs))]
    return transposed_tables(runs, shape, shape.heads, q_len=cache.rows)


@functools.lru_cache(maxsize=8)
def _piece_tables(cache: KvCache, slots: int, compute_blocks: int) -> PieceTables:
    runs = [cache.runs_at(c, p) for c in range(cache.positions) for p in range(len(cache.runs))]
    return PieceTables.from_runs(runs, slots, compute_blocks, False)


def check_chunk_operands(q, k, v, cache: KvCache, seq_len: int, head_dim: int) -> None:
    """Shapes of a chunked call (dtypes are checked as for any call)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape"):
            raise TypeError(f"{name} must be an array (jax or numpy), got {type(x).__name__}")
    if q.ndim not in (3, 4) or tuple(q.shape[-2:]) != (cache.rows, head_dim):
        raise ValueError(
            f"q must be [heads, {cache.rows}, {head_dim}] or [batch, heads, {cache.rows}, "
            f"{head_dim}] with q_frame_offset: one chunk of {cache.chunk_frames} frames x "
            f"{cache.frame_tokens} tokens, got [{', '.join(map(str, q.shape))}]"
        )
    keys = cache.cache_tokens if cache.rolling else seq_len
    want = tuple(q.shape[:-2]) + (keys, head_dim)
    what = (
        f"the rolling cache, [{', '.join(map(str, want))}] (q's leading dimensions, "
        f"{cache.sink_frames} sink + {cache.window_frames} ring frames = {keys} tokens)"
        if cache.rolling
        else f"the cache of the whole video, [{', '.join(map(str, want))}] (q's leading "
        f"dimensions, {keys} tokens)"
    )
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != want:
            raise ValueError(f"{name} must be {what}, got [{', '.join(map(str, x.shape))}]")


def chunk_position(q_frame_offset, cache: KvCache):
    """(position int32 [], valid): the chunk's position among the video's chunks; valid is
    None for a concrete offset (checked here: ValueError) and a traced bool otherwise (the
    position is then clamped into range, and the kernel writes NaN rows where the offset was
    not a chunk start)."""
    dtype = getattr(q_frame_offset, "dtype", None)
    if isinstance(q_frame_offset, (bool, np.bool_)) or (
        dtype is not None and not jnp.issubdtype(dtype, jnp.integer)
    ):
        raise TypeError(
            f"q_frame_offset must be an integer, got {dtype or type(q_frame_offset).__name__}"
        )
    if dtype is None and not isinstance(q_frame_offset, (int, np.integer)):
        raise TypeError(f"q_frame_offset must be an integer, got {type(q_frame_offset).__name__}")
    if getattr(q_frame_offset, "shape", ()) != ():
        raise ValueError(f"q_frame_offset must be a scalar, got shape {q_frame_offset.shape}")
    last = cache.frames - cache.chunk_frames
    if not isinstance(q_frame_offset, jax.core.Tracer):
        value = int(q_frame_offset)
        if value < 0 or value > last or value % cache.chunk_frames:
            raise ValueError(
                f"q_frame_offset must be a multiple of {cache.chunk_frames} (the spec's "
                f"chunk_frames) in 0 .. {last}, got {value}"
            )
        return jnp.int32(value // cache.chunk_frames), None
    offset = jnp.asarray(q_frame_offset).astype(jnp.int32)
    # lax.div of a non-negative value: what lowers for TPU from any host (not jnp's //).
    position = lax.div(jnp.clip(offset, 0, last), jnp.int32(cache.chunk_frames))
    return position, offset == position * cache.chunk_frames


def defined_rows(requested, valid, patterns: int, rows: int):
    """bool [rows] (batch * heads): whether each row's output is defined. A traced offset
    that is no chunk start (valid False) or a traced head_pattern value that is no pattern
    gives NaN rows, never another chunk's or another pattern's; concrete ones raised."""
    defined = jnp.ones((), bool) if valid is None else valid
    if isinstance(requested, jax.core.Tracer):
        per_head = (requested >= 0) & (requested < patterns)
        return jnp.tile(per_head & defined, rows // requested.shape[0])
    return jnp.broadcast_to(defined, (rows,))


def rows_folded(kernel_call):
    """`kernel_call(q, k, v, head_pattern, position, defined)` (q [rows, chunk, d], position
    int32 [] or [rows], defined bool [rows]) under jax.vmap: the mapped axis folds into the
    rows, so a batch of calls is one kernel call and each element keeps its own position."""

    @jax.custom_batching.custom_vmap
    def folded(q, k, v, hp, position, defined):
        return kernel_call(q, k, v, hp, position, defined)

    @folded.def_vmap
    def mapped(axis_size, in_batched, q, k, v, hp, position, defined):
        if in_batched[3]:
            raise NotImplementedError(
                "head_pattern mapped by jax.vmap in a chunked call: give every batch element "
                "the same head_pattern"
            )

        def leading(x, batched):
            return x if batched else jnp.broadcast_to(x, (axis_size,) + x.shape)

        q, k, v = (
            leading(x, b).reshape((-1,) + x.shape[-2:]) for x, b in zip((q, k, v), in_batched)
        )
        rows = q.shape[0] // axis_size
        if in_batched[4]:  # per element (and, under nested maps, per row already)
            position = position.reshape(-1) if position.ndim == 2 else jnp.repeat(position, rows)
        elif position.ndim == 1:
            position = jnp.tile(position, axis_size)
        defined = leading(defined, in_batched[5]).reshape(-1)
        out = folded(q, k, v, hp, position, defined)
        return out.reshape((axis_size, rows) + out.shape[1:]), True

    return folded


def _lax_divmod(a, b):
    """Quotient and remainder of non-negative traced ints: lax.div / lax.rem lower for TPU
    from any host (jnp's // and % do not)."""
    return lax.div(a, b), lax.rem(a, b)
