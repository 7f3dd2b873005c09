"""The front door of the TPU kernel: `make_attention`, which a generated module calls to build
its `attention` (a `TpuAttention`; what every backend shares is svgen.runtime.calls's
`Attention`). The forward kernel is svgen.runtime.forward, the backward
svgen.runtime.backward, the step reader svgen.runtime.steps, the table format
svgen.core.tables.

A generated module supplies only what depends on its spec: per candidate pattern its visited
tiles (runs), its token layout, `boundary_mask(q, k)` over token coordinates and the query
coordinates that mask reads; and the default assignment of heads to patterns. Everything
here is shared, so diffs between generated files show only spec-dependent code.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from svgen.runtime import backward, chunks, permute, quantize, segments
from svgen.runtime import select as select_policy
from svgen.runtime.calls import (
    Attention,
    BackendWords,
    StaticCall,
    check_operands,
    checked_sm_scale,
    layout_mover,
    poison_unknown_patterns,
)
from svgen.runtime.cube import PlaceBoxes, cube_dma, cube_order
from svgen.runtime.forward import flat_attention
from svgen.runtime.forward_call import ForwardCall
from svgen.runtime.softmax import LOG2_E
from svgen.runtime.tpu_call import TableSource
from svgen.core.program import ProgramLimits  # noqa: F401  (generated modules name it)
from svgen.core.straight import straight_words
from svgen.runtime.variant import Branches, PatternCode, Tables, forward_branches
from svgen.core.tables import (
    LANES,
    KernelShape,
    Pattern,
    PieceTables,
    transposed_tables,
    walks_flat,
)


# Residual masks (svgen.analysis.residuals): where the compiler found them, a BOUNDARY block
# runs the part of its pattern's mask that is not decided on it. Chosen by the static model;
# on a TPU v5e the modules that have them compile to the largest programs, which ran 2-5x
# over the model (docs/measured.md, "Kernel size"). False builds every module's kernel
# without them (whole masks, as `analyze(..., residual_masks=False)` would), for
# `bench/kernel_ab.py --runtime kernel.RESIDUAL_MASKS=False` to time the two on the chip.
RESIDUAL_MASKS = True

# Place boxes (svgen.runtime.cube) in the backward kernels too: False moves the backward's
# operands into kernel order and its gradients back instead (the forward still reads boxes),
# for timing the two on the chip.
BOX_BACKWARD = True


class TpuAttention(Attention):
    """`attention(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None,
    token_order="user"[, segment_ids=None][, text_lengths=None][, q_frame_offset=None])` on
    TPU: the forward kernel over the module's piece tables, with its VJP (the backward
    kernels).

    q, k, v are [heads, seq, head_dim] or [batch, heads, seq, head_dim] in the user's token
    order; the output has the shape and dtype of q. `head_pattern` (int [heads], may be
    traced) picks each head's pattern; it defaults to the spec's static assignment. `dtype`:
    the spec's (q, k, v must have it; None accepts any floating dtype).

    token_order="kernel": q, k, v are already in each head's kernel order and o comes back in
    it, so nothing is permuted around the kernel. `to_kernel_order(x, head_pattern=...)` and
    `from_kernel_order(y, ...)` move [..., heads, seq, d] arrays between the orders: a model
    that keeps its activations in kernel order between layers (token-wise layers do not care
    about the order) pays those passes once, not per attention call.

    runtime: the spec's run-time inputs (svgen.runtime.segments); a call that gives none of
    them runs the static tables, exactly as a module without them.
    kv_cache: the spec's KV-cache chunks (svgen.runtime.chunks): a call with q_frame_offset
    attends one chunk of queries against the whole sequence's keys and values.
    select: the spec's selection policy (svgen.runtime.select): every call chooses blocks
    of the candidate region from its q and k (top_k= / top_p= override the spec's amount;
    return_selection=True returns the chosen blocks beside o).

    Besides `Attention`'s attributes: `cube_dma` (svgen.runtime.cube, or None) and
    `permute_kernel` (whether the permute kernel moves the heads between orders).
    """

    words = BackendWords(
        name="TPU",
        interpret="True (or a pltpu.InterpretParams) runs the kernel in Pallas's TPU interpreter, "
        "on\n    the CPU; False compiles it for the TPU.",
        grads="Differentiable in q, k and v (jax.grad: svgen's backward kernels).",
        chunk_grads="jax.grad gives dq of the chunk and\n    dk, dv of the whole cache.",
    )

    def __init__(
        self,
        shape: KernelShape,
        patterns: Sequence[Pattern],
        *,
        slots: int,
        default_head_pattern: Sequence[int] | None,
        dtype: str | None = None,
        runtime: segments.RuntimeInputs = segments.RuntimeInputs(),
        kv_cache: chunks.KvCache | None = None,
        select: "select_policy.Selection | select_policy.HeadSelections | None" = None,
        program: ProgramLimits = ProgramLimits(),
    ):
        # Each pattern's residual masks, where they are in use (RESIDUAL_MASKS, and not left
        # out by the compiler to keep the program under its chip's budget).
        use_residuals = RESIDUAL_MASKS and program.residual_masks
        residuals = [tuple(p.residual_masks) if use_residuals else () for p in patterns]
        self.program = program
        tables = PieceTables.from_runs(
            [p.runs for p in patterns],
            slots,
            shape.compute_blocks,
            walks_flat(len(patterns), shape.tensor_cores),
            [p.run_variants if r else None for p, r in zip(patterns, residuals)],
        )
        super().__init__(
            shape,
            patterns,
            tables=tables,
            default_head_pattern=default_head_pattern,
            dtype=dtype,
            runtime=runtime,
            kv_cache=kv_cache,
            select=select,
        )
        self.slots = slots
        self.codes = [
            PatternCode(
                p.boundary_mask,
                p.layout,
                tuple(p.query_coords),
                r,
                straight_words(p.runs, shape, whole_mask=not r, max_words=program.straight_words),
                block_tables=tuple(p.block_tables),
            )
            for p, r in zip(self.patterns, residuals)
        ]
        # Each layout's box DMA (place boxes or cubes, svgen.runtime.cube), or None. One
        # layout: the kernel's (cube_dma). Several: a call whose heads are each of an identity
        # layout or of one with box DMA runs a kernel call per run of heads of one layout,
        # each reading the user's order (_head_runs).
        self.layout_boxes = tuple(cube_dma((lay,), shape) for lay in self.layouts)
        self.cube_dma = self.layout_boxes[0] if len(self.layouts) == 1 else None
        # Temporal-major heads: one Pallas pass per tensor (svgen.runtime.permute) instead of
        # XLA's reshape + transpose (4-5x the HBM traffic; bench/wrapper_cost.py). Never beside
        # cube DMA, which is for a tiled layout.
        self.permute_kernel = permute.applies(self.layouts)
        # A rolling cache's call: masked blocks map its slots to video keys (svgen.runtime.chunks).
        self.ring_sink = None if kv_cache is None else kv_cache.ring_sink

    def _smoothed(self, k):
        """k as the kernel reads it: with int8 QK^T (attention.qk: int8), minus its mean over
        the keys per head (svgen.runtime.quantize.smooth_keys: the softmax does not change;
        JAX differentiates it, and the backward kernels read this k too)."""
        return quantize.smooth_keys(k) if self.shape.qk_int8 and quantize.SMOOTH_KEYS else k

    # ------------------------------------------------------------------ tables built late
    # Built on the first call that needs them, so that importing a module stays cheap.
    @functools.cache
    def call_tables(self, transposed: bool) -> segments.SegmentTables:
        """The static side of run-time tables."""
        # The dk/dv walk's pieces are as long as its static tables' (its grid's last axis).
        walk_slots = self.dkv_tables().slots if transposed else self.slots
        video = (
            tuple(p.video_frames for p in self.patterns) if self.runtime.per_video_frames else ()
        )
        return segments.SegmentTables.build(
            [p.runs for p in self.patterns],
            tuple(int(i) for i in self.layout_of_pattern),
            self.shape,
            walk_slots,
            transposed,
            video=video,
            layouts=tuple(p.layout for p in self.patterns),
        )

    @functools.cache
    def dkv_tables(self) -> PieceTables:
        """The dk/dv walk's transposed tables (built on the first differentiated call)."""
        return transposed_tables([p.runs for p in self.patterns], self.shape, self.shape.heads)

    @functools.cache
    def chunk_tables(self) -> PieceTables:
        """Every chunk position's tables, built on the first chunked call."""
        return self.kv_cache.tables(self.slots, self.shape.compute_blocks)

    # ------------------------------------------------------------------ a whole sequence
    def _static_call(self, q, k, v, call: StaticCall):
        k = self._smoothed(k)
        batch = q.shape[0] if q.ndim == 4 else None
        ids = self._call_ids(call.segment_ids, call.text_lengths, batch)
        static_pattern, head_pattern, head_layout = self.resolved(call.head_pattern, q.shape[-3])
        lead = q.shape[:-2]
        # In kernel order every tile is a contiguous run already: plain blocks, no box DMA.
        # Box DMA reads and writes the user's array: nothing to move either. Place boxes
        # take static tables only (run-time ids and selections are in kernel order).
        box_dma = None if call.in_kernel_order else self.cube_dma
        static_tables = ids is None and self.select is None
        if isinstance(box_dma, PlaceBoxes) and not static_tables:
            box_dma = None
        runs = None
        if not call.in_kernel_order and box_dma is None and static_tables:
            runs = self._head_runs(static_pattern)
        mover = None
        if not call.in_kernel_order and box_dma is None and runs is None:
            mover = self._order_mover(static_pattern, head_layout, call.interpret)

        def to_kernel(x):
            if box_dma is not None:
                return x.reshape((-1, *box_dma.view, self.shape.head_dim))
            if mover is not None:
                x = mover(x, to_kernel=True)
            return x.reshape((-1,) + x.shape[-2:])

        qk, kk = to_kernel(q), to_kernel(k)
        chosen = self._chosen_blocks(qk, kk, box_dma, call.sm_scale, call.amount, head_pattern, ids)
        out = self._differentiable(
            qk,
            kk,
            to_kernel(v),
            head_pattern,
            static_pattern,
            call.interpret,
            float(call.sm_scale) * LOG2_E,
            float(call.sm_scale),
            box_dma,
            ids,
            chosen,
            runs,
        )
        out = out.reshape(lead + (self.shape.seq_len, self.shape.head_dim))
        out = out if mover is None else mover(out, to_kernel=False)
        return poison_unknown_patterns(out, call.head_pattern, len(self.patterns)), chosen

    def _head_runs(self, static_pattern) -> tuple[tuple[int, int, int], ...] | None:
        """(first head, end, layout) of each run of consecutive heads of one layout, where a
        static assignment gives heads of several layouts, each of them an identity layout or
        one with box DMA (place boxes or cubes), and some of them the latter: one kernel call
        per run then reads the user's order (a flat walk over each run's heads). None: one
        call for every head."""
        if static_pattern is None or len(self.layouts) < 2:
            return None
        layout_of_head = [int(self.layout_of_pattern[p]) for p in static_pattern]
        boxes = [self.layout_boxes[i] for i in layout_of_head]
        if all(b is None for b in boxes):
            return None
        if any(
            b is None and not self.layouts[i].is_identity for b, i in zip(boxes, layout_of_head)
        ):
            return None
        starts = [
            h
            for h in range(len(layout_of_head))
            if h == 0 or layout_of_head[h] != layout_of_head[h - 1]
        ]
        ends = starts[1:] + [len(layout_of_head)]
        return tuple((s, e, layout_of_head[s]) for s, e in zip(starts, ends))

    def _run_calls(self, q, k, v, static_pattern, interpret, q_scale, runs):
        """The forward kernel once per head run (_head_runs), each writing its heads' rows of
        one o (aliased from call to call), q, k, v in the user's order: a run of place boxes
        reads them as boxes, an identity run as they are."""
        rows, heads, d = q.shape[0], len(static_pattern), self.shape.head_dim
        o = None
        for first, end, layout in runs:
            boxes = self.layout_boxes[layout]

            def view(x, boxes=boxes):
                return x if boxes is None else x.reshape((rows, *boxes.view, d))

            pattern = np.asarray(static_pattern[first:end])
            o_run = flat_attention(
                view(q),
                view(k),
                view(v),
                jnp.asarray(pattern, jnp.int32),
                pattern,
                self._forward_call(interpret, q_scale, cubes=boxes, head_run=(first, heads)),
                out=None if o is None else view(o),
            )
            o = o_run.reshape(q.shape)
        return o

    def _run_mover(self, static_pattern, hp, interpret):
        """mover(x, to_kernel) of [rows, seq, d] arrays of a head runs' call (each head's
        layout by the static assignment), for its backward pass."""
        heads = len(static_pattern)
        mover = self._order_mover(
            static_pattern, jnp.asarray(self.layout_of_pattern)[hp], interpret
        )

        def move(x, to_kernel):
            return mover(x.reshape((-1, heads) + x.shape[1:]), to_kernel).reshape(x.shape)

        return move

    def _call_ids(self, segment_ids, text_lengths, batch: int | None):
        """The call's ids per layout (segments.CallIds [batch, layouts, seq]), or None when
        it gives no run-time input."""
        ids = segments.call_ids(self.runtime, segment_ids, text_lengths, batch, self.layouts)
        if ids is not None:
            self.call_tables(False).check_smem(batch or 1, self.shape.heads)
        return ids

    def _chosen_blocks(self, q, k, box_dma, sm_scale, amount, head_pattern, ids):
        """The call's selection (svgen.runtime.select.Selected), or None without a policy:
        scored from q, k in kernel order (cube DMA's 5-D user view moved into it), each head
        among its pattern's blocks (with run-time ids, those whose queries and keys may share
        a segment)."""
        if self.select is None:
            return None
        if box_dma is not None:
            q, k = (cube_order(x, self.layouts[0], True, box_dma.view) for x in (q, k))
        self.select.check_smem(q.shape[0], ids is not None)
        rows = None if ids is None else self._selection_ids(head_pattern, ids)
        return self.select.choose(q, k, float(sm_scale), amount, head_pattern, rows)

    def _selection_ids(self, hp, ids):
        """A selection's view of the call's ids: (query, key) int32 [rows, seq], each row's
        in its head's kernel order."""
        return tuple(x[:, 0, :] for x in self._id_rows(hp, ids))

    def _order_mover(self, static_pattern, head_layout, interpret):
        """The permute kernel where it applies, else XLA; never cube DMA, which is a way of
        reading the user's order, not an order. None where the orders are the same."""
        return layout_mover(
            self.layouts,
            self.layout_of_pattern,
            static_pattern,
            head_layout,
            interpret,
            self.permute_kernel,
        )

    def _forward(
        self, q, k, v, hp, static_pattern, interpret, q_scale, cubes, ids, chosen, runs, **out
    ):
        """The forward kernel in kernel order (cube DMA: the user's 4-D view; head runs: one
        call per run, _run_calls); `out`: its extra outputs (with_lse, with_modes)."""
        if runs is not None:  # (never with extra outputs: see _differentiable)
            return self._run_calls(q, k, v, static_pattern, interpret, q_scale, runs)
        if self._calls_per_pattern(ids, chosen, out):
            return self._pattern_calls(
                q, k, v, hp, static_pattern, interpret, q_scale, cubes, **out
            )
        own = {}  # the call's own tables (and ids), where it brings them
        if chosen is not None:
            rows = None if ids is None else self._selection_ids(hp, ids)
            selection = self.select.forward_tables(chosen.blocks, hp, rows)
            own["source"] = TableSource("selection", selection)
        elif ids is not None:
            own["source"] = TableSource("segments", self.call_tables(False).tables(ids, hp))
        if ids is not None:  # run-time segments, or a selection across them
            own["ids"] = tuple(self._id_rows(hp, ids))
        call = self._forward_call(interpret, q_scale, cubes=cubes, **own, **out)
        return flat_attention(q, k, v, hp, static_pattern, call)

    def _forward_call(self, interpret, q_scale: float, **options) -> ForwardCall:
        """A forward kernel call over this module's tables, codes and shape (options: the
        other fields of forward_call.ForwardCall, or those three replaced)."""
        fields = dict(tables=self.tables, patterns=tuple(self.codes), shape=self.shape)
        return ForwardCall(interpret=interpret, q_scale=q_scale, **{**fields, **options})

    def _calls_per_pattern(self, ids, chosen, out) -> bool:
        """One forward kernel call per pattern (ProgramLimits.pattern_calls): where the
        compiler asked for it and the call walks the module's own tables flat (no run-time
        ids, no selection, no softmax modes asked for)."""
        return (
            self.program.pattern_calls
            and self.tables.flat
            and ids is None
            and chosen is None
            and not out.get("with_modes", False)
        )

    def _pattern_calls(
        self, q, k, v, hp, static_pattern, interpret, q_scale, cubes, with_lse=False, **unused
    ):
        """The forward kernel once per pattern, each call walking the heads that chose it with
        that pattern's code only and writing their rows of one o (aliased from call to call);
        the lse of each row is taken from its head's call. A pattern no head chose (static
        assignment) is not called; a traced assignment calls every pattern, a call with no
        heads walking no steps (its grid is dynamic)."""
        o = lse = None
        heads = int(hp.shape[0])
        row_pattern = jnp.tile(hp, q.shape[0] // heads)[:, None, None]  # rows: batch x heads
        for index, code in enumerate(self.codes):
            if static_pattern is not None and index not in static_pattern:
                continue
            call = self._forward_call(
                interpret,
                q_scale,
                patterns=(code,),
                source=TableSource(only_pattern=index),
                cubes=cubes,
                with_lse=with_lse,
            )
            result = flat_attention(q, k, v, hp, static_pattern, call, out=o)
            o, lse_p = result if with_lse else (result, None)
            if with_lse:
                lse = lse_p if lse is None else jnp.where(row_pattern == index, lse_p, lse)
        return (o, lse) if with_lse else o

    def _id_rows(self, hp, ids):
        return segments.kernel_id_rows(ids, jnp.asarray(self.layout_of_pattern)[hp])

    def _backward_sources(self, hp, ids, chosen) -> dict:
        """Where the backward walks' tables come from, as backward.BackwardCall's dq_source,
        dkv_source and ids: a selection's or run-time segments' own; {}: the module's."""
        if chosen is not None:
            # The selection is a constant of the gradient: the backward walks visit the same
            # blocks (the dq kernel's tables unused when dq is fused; XLA drops them).
            slots = self.dkv_tables().slots
            rows = None if ids is None else self._selection_ids(hp, ids)
            tables = self.select.backward_tables(chosen.blocks, hp, slots, rows)
            kind = "selection"
        elif ids is not None:
            # Both walks' tables: the dq kernel's (unused when dq is fused into the dk/dv
            # walk; XLA drops what nothing reads) and the dk/dv kernel's.
            self.call_tables(True).check_smem(ids.query.shape[0], self.shape.heads)
            tables = tuple(self.call_tables(t).tables(ids, hp) for t in (False, True))
            kind = "segments"
        else:
            return {}
        sources = dict(
            dq_source=TableSource(kind, tables[0]), dkv_source=TableSource(kind, tables[1])
        )
        return sources if ids is None else dict(sources, ids=tuple(self._id_rows(hp, ids)))

    def _backward_call(
        self, shape, dkv_tables, sm_scale: float, interpret, **options
    ) -> backward.BackwardCall:
        """The backward kernels' call over this module's tables and codes (options: the
        other fields of backward.BackwardCall)."""
        codes = tuple(self.codes)
        return backward.BackwardCall(
            self.tables, dkv_tables, codes, shape, sm_scale, interpret, **options
        )

    def _differentiable(
        self,
        q,
        k,
        v,
        head_pattern,
        static_pattern,
        interpret,
        q_scale,
        sm_scale,
        cubes,
        ids,
        chosen,
        runs=None,
    ):
        """The forward kernel with its VJP: the backward kernels of svgen.runtime.backward
        (head_pattern, the ids and the selection are not differentiated). ids: run-time
        segments (segments.CallIds [batch, layouts, seq]) or None. runs: head runs in the
        user's order (_head_runs), forward only: under a gradient the tokens are moved."""
        layout = self.layouts[0]
        forward = functools.partial(
            self._forward,
            static_pattern=static_pattern,
            interpret=interpret,
            q_scale=q_scale,
            cubes=cubes,
            runs=runs,
        )

        def run(q, k, v, hp, ids, chosen):
            return forward(q, k, v, hp, ids=ids, chosen=chosen)

        def forward_rule(q, k, v, hp, ids, chosen):
            if runs is None:
                o, lse = forward(q, k, v, hp, ids=ids, chosen=chosen, with_lse=True)
                return o, (q, k, v, hp, ids, chosen, o, lse)
            # Head runs under a gradient: the backward kernels read kernel order, so the
            # forward runs there too, one call over the moved operands, which the backward
            # then reads as they are (head runs would leave it moving q, k, v and o itself).
            move = self._run_mover(static_pattern, hp, interpret)
            q, k, v = (move(x, True) for x in (q, k, v))
            o, lse = forward(q, k, v, hp, ids=ids, chosen=chosen, runs=None, with_lse=True)
            return move(o, False), (q, k, v, hp, ids, chosen, o, lse)

        def backward_rule(residuals, do):
            q, k, v, hp, ids, chosen, o, lse = residuals  # head runs: in kernel order
            move = None if runs is None else self._run_mover(static_pattern, hp, interpret)
            if move is not None:
                do = move(do, True)
            # Place boxes: the backward kernels read boxes too; cubes: they run in kernel order.
            boxes = cubes if isinstance(cubes, PlaceBoxes) and BOX_BACKWARD else None
            if cubes is not None and boxes is None:
                q, k, v, o, do = (cube_order(x, layout, True, cubes.view) for x in (q, k, v, o, do))
                if isinstance(cubes, PlaceBoxes):
                    lse = cubes.lse_to_kernel_order(lse)
            q_scaled = (q.astype(jnp.float32) * q_scale).astype(q.dtype)
            call = self._backward_call(
                self.shape,
                self.dkv_tables(),
                sm_scale,
                interpret,
                boxes=boxes,
                pattern_calls=self.program.pattern_calls,
                **self._backward_sources(hp, ids, chosen),
            )
            dq, dk, dv = backward.backward(q_scaled, k, v, o, lse, do, hp, static_pattern, call)
            if cubes is not None and boxes is None:
                dq, dk, dv = (cube_order(x, layout, False, cubes.view) for x in (dq, dk, dv))
            if move is not None:
                dq, dk, dv = (move(x, False) for x in (dq, dk, dv))
            no_ids = None if ids is None else jax.tree.map(_no_cotangent, ids)
            not_chosen = None if chosen is None else jax.tree.map(_no_cotangent, chosen)
            return dq, dk, dv, _no_cotangent(hp), no_ids, not_chosen

        core = jax.custom_vjp(run)
        core.defvjp(forward_rule, backward_rule)
        return core(q, k, v, head_pattern, ids, chosen)

    # ------------------------------------------------------------------ a KV-cache chunk
    def _chunk_source(self, table, position, hp, defined, rows) -> TableSource:
        """A chunk's tables over `table` (the forward's or the transposed), with each row's
        first query token in the video, defined flag and ring shifts."""
        kv_cache = self.kv_cache
        heads = int(hp.shape[0])
        call, exact = kv_cache.call_tables(table, position, hp, rows // heads)
        scalars = [position * kv_cache.rows, defined.astype(jnp.int32)]
        scalars += kv_cache.ring_scalars(position)
        per_row = [jnp.broadcast_to(x, (rows,)).astype(jnp.int32) for x in scalars]
        return TableSource("chunk", call, jnp.concatenate(per_row), exact)

    def _chunk_call(self, q, k, v, head_pattern, position, defined, interpret, sm_scale):
        """A chunked call in kernel order: q [rows, chunk tokens, d] (rows = batch * heads),
        position int32 [] (the chunk of every row) or [rows], defined bool [rows]. jax.vmap
        folds its axis into the rows (each element may have its own position); the VJP runs
        the fused dk/dv walk over the chunk positions' transposed tables."""
        q_scale = float(sm_scale) * LOG2_E
        k = self._smoothed(k)

        def forward(q, k, v, hp, position, defined, with_lse=False):
            source = self._chunk_source(self.chunk_tables(), position, hp, defined, q.shape[0])
            call = self._forward_call(
                interpret,
                q_scale,
                shape=self.chunk_shape,
                source=source,
                ring_sink=self.ring_sink,
                with_lse=with_lse,
            )
            return flat_attention(q, k, v, hp, None, call)

        def forward_rule(q, k, v, hp, position, defined):
            o, lse = forward(q, k, v, hp, position, defined, with_lse=True)
            return o, (q, k, v, hp, position, defined, o, lse)

        def backward_rule(residuals, do):
            q, k, v, hp, position, defined, o, lse = residuals
            q_scaled = (q.astype(jnp.float32) * q_scale).astype(q.dtype)
            dkv = self.kv_cache.transposed_tables(self.chunk_shape)
            call = self._backward_call(
                self.chunk_shape,
                dkv,
                float(sm_scale),
                interpret,
                dkv_source=self._chunk_source(dkv, position, hp, defined, q.shape[0]),
                ring_sink=self.ring_sink,
            )
            dq, dk, dv = backward.backward(q_scaled, k, v, o, lse, do, hp, None, call)
            return dq, dk, dv, _no_cotangent(hp), _no_cotangent(position), _no_cotangent(defined)

        core = jax.custom_vjp(chunks.rows_folded(forward))
        core.defvjp(forward_rule, backward_rule)
        return core(q, k, v, head_pattern, position, defined)

    # ------------------------------------------------------------------ the kernel's shape
    def forward_branches(self, tables: Tables = "static") -> Branches:
        """The branches of this module's forward kernel in a call whose tables come from
        `tables` (svgen.runtime.variant): what the cost model reads in its schedule."""
        shape = self.chunk_shape if tables == "chunk" else self.shape
        return forward_branches(shape, tuple(self.codes), tables, self.tables.variants is not None)

    def call_tables_source(self, runtime_inputs: bool = True) -> Tables:
        """Where the tables of this module's whole-sequence call come from when it is given
        every run-time input it takes (runtime_inputs=False: none): a selection's, run-time
        segments', or static."""
        if self.select is not None:
            return "selection"
        return "segments" if runtime_inputs and self.runtime.any else "static"

    # ------------------------------------------------------------------ diagnostics
    def softmax_modes(self, q, k, v, *, head_pattern=None, interpret=False, sm_scale=None):
        """int32 [..., heads, q tiles]: for a call attention(q, k, v, head_pattern=...,
        sm_scale=...) (no run-time inputs), 1 where the q tile ran with the bounded max, 0
        where it fell back to the online softmax (spec `attention.softmax: bounded`; q tiles
        in each head's kernel order). A diagnostic: it runs the kernel once more."""
        if not self.shape.bounded_softmax:
            raise ValueError(
                "softmax_modes: this module was compiled without `attention.softmax: bounded` "
                "in its spec; every q tile runs the online softmax"
            )
        check_operands(q, k, v, self.shape, self.dtype)
        sm_scale = checked_sm_scale(sm_scale, self.shape.head_dim)
        static_pattern, head_pattern, head_layout = self.resolved(head_pattern, q.shape[-3])
        mover = self._order_mover(static_pattern, head_layout, interpret)

        def to_kernel(x):
            x = x if mover is None else mover(x, to_kernel=True)
            return x.reshape((-1,) + x.shape[-2:])

        call = self._forward_call(interpret, float(sm_scale) * LOG2_E, with_modes=True)
        _, modes = flat_attention(
            *(to_kernel(x) for x in (q, k, v)), head_pattern, static_pattern, call
        )
        return modes[:, 0, ::LANES].reshape(q.shape[:-2] + (-1,))


#: What a generated module calls to build its `attention`, with keyword arguments.
make_attention = TpuAttention


def _no_cotangent(x):
    """The cotangent of an integer input (head_pattern, run-time ids): none."""
    return np.zeros(x.shape, jax.dtypes.float0)
