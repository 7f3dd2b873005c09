"""The public front door of the TPU kernel: `make_attention`, which a generated module calls
to build its `attention` (the forward kernel is svgen.runtime.forward, the backward
svgen.runtime.backward, the step reader svgen.runtime.steps, the table format
svgen.runtime.tables).

A generated module supplies only what depends on its spec: per candidate pattern its visited
tiles (runs), its token layout, `boundary_mask(q, k)` over token coordinates and the query
coordinates that mask reads; and the default assignment of heads to patterns. Everything here is shared, so diffs between generated files show only
spec-dependent code.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from svgen.runtime import backward, chunks, permute, segments
from svgen.runtime import select as select_policy
from svgen.runtime.calls import (
    attention_doc,
    check_dtypes,
    check_operands,
    check_order_operand,
    check_token_order,
    checked_sm_scale,
    layout_mover,
    poison_unknown_patterns,
    resolve_head_pattern,
)
from svgen.runtime.cube import cube_dma, cube_order
from svgen.runtime.forward import PatternCode, flat_attention
from svgen.runtime.layout import TokenLayout
from svgen.runtime.softmax import LOG2_E
from svgen.runtime.tables import (  # noqa: F401  (what generated modules name: kernel.KernelShape, kernel.Pattern)
    LANES,
    KernelShape,
    Pattern,
    PieceTables,
    transposed_tables,
    walks_flat,
)


def make_attention(
    *,
    shape: KernelShape,
    patterns: Sequence[Pattern],
    slots: int,
    default_head_pattern: Sequence[int] | None,
    dtype: str | None = None,
    runtime: segments.RuntimeInputs = segments.RuntimeInputs(),
    kv_cache: chunks.KvCache | None = None,
    select: "select_policy.Selection | None" = None,
):
    """The public `attention(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None,
    token_order="user"[, segment_ids=None][, text_lengths=None][, q_frame_offset=None])`.

    q, k, v are [heads, seq, head_dim] or [batch, heads, seq, head_dim] in the user's token
    order; the output has the shape and dtype of q. `head_pattern` (int [heads], may be traced)
    picks each head's pattern; it defaults to the spec's static assignment. `dtype`: the spec's
    (q, k, v must have it; None accepts any floating dtype).

    token_order="kernel": q, k, v are already in each head's kernel order and o comes back in
    it, so nothing is permuted around the kernel. `attention.to_kernel_order(x,
    head_pattern=...)` and `attention.from_kernel_order(y, ...)` move [..., heads, seq, d]
    arrays between the orders: a model that keeps its activations in kernel order between
    layers (token-wise layers do not care about the order) pays those passes once, not per
    attention call.

    runtime: the spec's run-time inputs (svgen.runtime.segments); a call that gives none of
    them runs the static tables, exactly as a module without them.
    kv_cache: the spec's KV-cache chunks (svgen.runtime.chunks): a call with q_frame_offset
    attends one chunk of queries against the whole sequence's keys and values.
    select: the spec's selection policy (svgen.runtime.select): every call chooses blocks
    of the candidate region from its q and k (top_k= / top_p= override the spec's amount).
    """
    tables = PieceTables.from_runs(
        [p.runs for p in patterns],
        slots,
        shape.compute_blocks,
        walks_flat(len(patterns), shape.tensor_cores),
        [p.run_variants if p.residual_masks else None for p in patterns],
    )
    layouts: list[TokenLayout] = []
    for p in patterns:
        if p.layout not in layouts:
            layouts.append(p.layout)
    # NumPy here: importing a generated module must not start a JAX backend.
    layout_of_pattern = np.asarray([layouts.index(p.layout) for p in patterns], np.int32)
    codes = [
        PatternCode(p.boundary_mask, p.layout, tuple(p.query_coords), tuple(p.residual_masks))
        for p in patterns
    ]
    cubes = cube_dma(layouts, shape)
    # Temporal-major heads: one Pallas pass per tensor (svgen.runtime.permute) instead of
    # XLA's reshape + transpose (4-5x the HBM traffic; bench/wrapper_cost.py). Never beside
    # cube DMA, which is for a tiled layout.
    permute_kernel = permute.applies(layouts)

    layout_index = tuple(int(i) for i in layout_of_pattern)

    @functools.cache
    def call_tables(transposed: bool) -> segments.SegmentTables:
        """The static side of run-time tables, built on the first call that needs them."""
        runs = [p.runs for p in patterns]
        # The dk/dv walk's pieces are as long as its static tables' (its grid's last axis).
        walk_slots = dkv_tables().slots if transposed else slots
        video = tuple(p.video_frames for p in patterns) if runtime.per_video_frames else ()
        return segments.SegmentTables.build(
            runs,
            layout_index,
            shape,
            walk_slots,
            transposed,
            video=video,
            layouts=tuple(p.layout for p in patterns),
        )

    @functools.cache
    def dkv_tables() -> PieceTables:
        """Built on the first differentiated call, so that importing a module stays cheap."""
        return transposed_tables([p.runs for p in patterns], shape, shape.heads)

    def differentiable(
        q, k, v, head_pattern, static_pattern, interpret, q_scale, sm_scale, cubes, ids, chosen
    ):
        """The kernel in kernel order (cube DMA: the user's 4-D view), with its VJP: the
        backward kernels of svgen.runtime.backward (head_pattern is not differentiated).
        ids: run-time segments (segments.CallIds [batch, layouts, seq]) or None."""

        def id_rows(hp, ids):
            return segments.kernel_id_rows(ids, jnp.asarray(layout_of_pattern)[hp])

        def forward_call(hp, ids):
            if ids is None:
                return None
            return (call_tables(False).tables(ids, hp), *id_rows(hp, ids))

        def backward_calls(hp, ids):
            if ids is None:
                return None
            # Both walks' tables: the dq kernel's (unused when dq is fused into the dk/dv
            # walk; XLA drops what nothing reads) and the dk/dv kernel's.
            call_tables(True).check_smem(ids.query.shape[0], shape.heads)
            tables_of = (call_tables(t).tables(ids, hp) for t in (False, True))
            return (*tables_of, *id_rows(hp, ids))

        def selection_call(chosen):
            return None if chosen is None else select.forward_walk.tables(chosen.blocks)

        def run(q, k, v, hp, ids, chosen):
            return flat_attention(
                q,
                k,
                v,
                hp,
                static_pattern,
                tables,
                codes,
                shape=shape,
                interpret=interpret,
                q_scale=q_scale,
                cubes=cubes,
                call=forward_call(hp, ids),
                selection=selection_call(chosen),
            )

        def forward(q, k, v, hp, ids, chosen):
            o, lse = flat_attention(
                q,
                k,
                v,
                hp,
                static_pattern,
                tables,
                codes,
                shape=shape,
                interpret=interpret,
                q_scale=q_scale,
                with_lse=True,
                cubes=cubes,
                call=forward_call(hp, ids),
                selection=selection_call(chosen),
            )
            return o, (q, k, v, hp, ids, chosen, o, lse)

        def backward_rule(residuals, do):
            q, k, v, hp, ids, chosen, o, lse = residuals
            if cubes is not None:  # the backward kernels read tiles in cube order
                q, k, v, o, do = (
                    cube_order(x, layouts[0], to_kernel=True) for x in (q, k, v, o, do)
                )
            q_scaled = (q.astype(jnp.float32) * q_scale).astype(q.dtype)
            dq, dk, dv = backward.backward(
                q_scaled,
                k,
                v,
                o,
                lse,
                do,
                hp,
                static_pattern,
                forward_tables=tables,
                dkv_tables=dkv_tables(),
                patterns=codes,
                shape=shape,
                sm_scale=sm_scale,
                interpret=interpret,
                calls=backward_calls(hp, ids) if chosen is None else selection_calls(chosen),
            )
            if cubes is not None:
                dq, dk, dv = (cube_order(x, layouts[0], to_kernel=False) for x in (dq, dk, dv))
            no_ids = None if ids is None else jax.tree.map(_no_cotangent, ids)
            not_chosen = None if chosen is None else jax.tree.map(_no_cotangent, chosen)
            return dq, dk, dv, _no_cotangent(hp), no_ids, not_chosen

        def selection_calls(chosen):
            # The selection is a constant of the gradient: the backward walks visit the same
            # blocks (the dq kernel's tables unused when dq is fused; XLA drops them).
            walk = select.transposed_walk(dkv_tables().slots)
            return select.dq_walk.tables(chosen.blocks), walk.tables(chosen.blocks)

        core = jax.custom_vjp(run)
        core.defvjp(forward, backward_rule)
        return core(q, k, v, head_pattern, ids, chosen)

    def resolved(head_pattern, heads: int):
        static_pattern, head_pattern = resolve_head_pattern(
            head_pattern, default_head_pattern, heads, shape.heads, len(patterns)
        )
        return static_pattern, head_pattern, jnp.asarray(layout_of_pattern)[head_pattern]

    def call_ids(segment_ids, text_lengths, batch: int | None):
        """The call's ids per layout (segments.CallIds [batch, layouts, seq]), or None when
        it gives no run-time input."""
        ids = segments.call_ids(runtime, segment_ids, text_lengths, batch, layouts)
        if ids is not None:
            call_tables(False).check_smem(batch or 1, shape.heads)
        return ids

    # A rolling cache's call: the kv side is the cache, and masked blocks map its slots to
    # video keys (svgen.runtime.chunks).
    chunk_shape = shape if kv_cache is None else kv_cache.call_shape(shape)
    ring_sink = None if kv_cache is None else kv_cache.ring_sink

    @functools.cache
    def chunk_tables() -> PieceTables:
        """Every chunk position's tables, built on the first chunked call."""
        return kv_cache.tables(slots, shape.compute_blocks)

    def chunk_core(q, k, v, head_pattern, position, defined, interpret, q_scale, sm_scale):
        """A chunked call in kernel order: q [rows, chunk tokens, d] (rows = batch * heads),
        position int32 [] (the chunk of every row) or [rows], defined bool [rows]. jax.vmap
        folds its axis into the rows (each element may have its own position); the VJP runs
        the fused dk/dv walk over the chunk positions' transposed tables."""
        heads = int(head_pattern.shape[0])

        def chunk_operands(table, position, hp, defined, rows):
            call, exact = kv_cache.call_tables(table, position, hp, rows // heads)
            scalars = [position * kv_cache.rows, defined.astype(jnp.int32)]
            scalars += kv_cache.ring_scalars(position)
            per_row = [jnp.broadcast_to(x, (rows,)).astype(jnp.int32) for x in scalars]
            return call, jnp.concatenate(per_row), exact

        def forward(q, k, v, hp, position, defined, with_lse=False):
            chunk = chunk_operands(chunk_tables(), position, hp, defined, q.shape[0])
            return flat_attention(
                q,
                k,
                v,
                hp,
                None,
                tables,
                codes,
                shape=chunk_shape,
                interpret=interpret,
                q_scale=q_scale,
                with_lse=with_lse,
                chunk=chunk,
                ring_sink=ring_sink,
            )

        batchable = chunks.rows_folded(forward)

        def forward_rule(q, k, v, hp, position, defined):
            o, lse = forward(q, k, v, hp, position, defined, with_lse=True)
            return o, (q, k, v, hp, position, defined, o, lse)

        def backward_rule(residuals, do):
            q, k, v, hp, position, defined, o, lse = residuals
            q_scaled = (q.astype(jnp.float32) * q_scale).astype(q.dtype)
            dkv = kv_cache.transposed_tables(chunk_shape)
            dq, dk, dv = backward.backward(
                q_scaled,
                k,
                v,
                o,
                lse,
                do,
                hp,
                None,
                forward_tables=tables,
                dkv_tables=dkv,
                patterns=codes,
                shape=chunk_shape,
                sm_scale=sm_scale,
                interpret=interpret,
                chunk=chunk_operands(dkv, position, hp, defined, q.shape[0]),
                ring_sink=ring_sink,
            )
            return dq, dk, dv, _no_cotangent(hp), _no_cotangent(position), _no_cotangent(defined)

        core = jax.custom_vjp(batchable)
        core.defvjp(forward_rule, backward_rule)
        return core(q, k, v, head_pattern, position, defined)

    def chunked(q, k, v, q_frame_offset, head_pattern, interpret, sm_scale, token_order):
        if kv_cache is None:
            raise TypeError(
                "q_frame_offset: this module was compiled without `runtime: {kv_cache: "
                "{chunk_frames: C}}` in its spec; add it and run svgen compile again"
            )
        check_dtypes(q, k, v, dtype)
        chunks.check_chunk_operands(q, k, v, kv_cache, shape.seq_len, shape.head_dim)
        check_token_order(token_order)  # frame-major only: the user's order is the kernel's
        sm_scale = checked_sm_scale(sm_scale, shape.head_dim)
        position, valid = chunks.chunk_position(q_frame_offset, kv_cache)
        requested = head_pattern
        static_pattern, head_pattern, _ = resolved(head_pattern, q.shape[-3])
        flat = [x.reshape((-1,) + x.shape[-2:]) for x in (q, k, v)]
        defined = chunks.defined_rows(requested, valid, len(patterns), flat[0].shape[0])
        out = chunk_core(
            *flat,
            head_pattern,
            position,
            defined,
            interpret,
            float(sm_scale) * LOG2_E,
            float(sm_scale),
        )
        return out.reshape(q.shape)

    def attention(
        q,
        k,
        v,
        *,
        head_pattern=None,
        interpret=False,
        sm_scale=None,
        token_order="user",
        segment_ids=None,
        text_lengths=None,
        q_frame_offset=None,
        top_k=None,
        top_p=None,
    ):
        amount = select_policy.call_amount(select, top_k, top_p)
        if q_frame_offset is not None:
            return chunked(q, k, v, q_frame_offset, head_pattern, interpret, sm_scale, token_order)
        check_operands(q, k, v, shape, dtype)
        check_token_order(token_order)
        sm_scale = checked_sm_scale(sm_scale, shape.head_dim)
        ids = call_ids(segment_ids, text_lengths, q.shape[0] if q.ndim == 4 else None)
        requested = head_pattern
        static_pattern, head_pattern, head_layout = resolved(head_pattern, q.shape[-3])
        lead = q.shape[:-2]
        in_kernel_order = token_order == "kernel"
        # In kernel order every tile is a contiguous run already: plain blocks, no cube DMA.
        # Cube DMA reads and writes the user's array: nothing to move either.
        box_dma = None if in_kernel_order else cubes
        mover = None
        if not in_kernel_order and box_dma is None:
            mover = layout_mover(
                layouts, layout_of_pattern, static_pattern, head_layout, interpret, permute_kernel
            )

        def to_kernel(x):
            if box_dma is not None:
                return x.reshape((-1, *box_dma.view, shape.head_dim))
            if mover is not None:
                x = mover(x, to_kernel=True)
            return x.reshape((-1,) + x.shape[-2:])

        qk, kk = to_kernel(q), to_kernel(k)
        out = differentiable(
            qk,
            kk,
            to_kernel(v),
            head_pattern,
            static_pattern,
            interpret,
            float(sm_scale) * LOG2_E,
            float(sm_scale),
            box_dma,
            ids,
            chosen_blocks(qk, kk, box_dma, sm_scale, amount),
        )
        out = out.reshape(lead + (shape.seq_len, shape.head_dim))
        out = out if mover is None else mover(out, to_kernel=False)
        return poison_unknown_patterns(out, requested, len(patterns))

    def softmax_modes(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None):
        """int32 [..., heads, q tiles]: for a call attention(q, k, v, head_pattern=...,
        sm_scale=...) (no run-time inputs), 1 where the q tile ran with the bounded max, 0
        where it fell back to the online softmax (spec `attention.softmax: bounded`; q tiles
        in each head's kernel order). A diagnostic: it runs the kernel once more."""
        check_operands(q, k, v, shape, dtype)
        sm_scale = checked_sm_scale(sm_scale, shape.head_dim)
        static_pattern, head_pattern, head_layout = resolved(head_pattern, q.shape[-3])
        mover = layout_mover(
            layouts, layout_of_pattern, static_pattern, head_layout, interpret, permute_kernel
        )

        def to_kernel(x):
            x = x if mover is None else mover(x, to_kernel=True)
            return x.reshape((-1,) + x.shape[-2:])

        _, modes = flat_attention(
            *(to_kernel(x) for x in (q, k, v)),
            head_pattern,
            static_pattern,
            tables,
            codes,
            shape=shape,
            interpret=interpret,
            q_scale=float(sm_scale) * LOG2_E,
            with_modes=True,
        )
        return modes[:, 0, ::LANES].reshape(q.shape[:-2] + (-1,))

    def chosen_blocks(q, k, box_dma, sm_scale, amount):
        """The call's selection (svgen.runtime.select.Selected), or None without a policy:
        scored from q, k in kernel order (cube DMA's 5-D user view moved into it)."""
        if select is None:
            return None
        if box_dma is not None:
            q, k = (cube_order(x, layouts[0], to_kernel=True) for x in (q, k))
        select.check_smem(q.shape[0])
        return select.select(q, k, float(sm_scale), amount)

    def order_mover(x, head_pattern, interpret):
        """The mover of [..., heads, seq, d] arrays between the user's and the kernel order
        (the permute kernel where it applies, else XLA; never cube DMA, which is a way of
        reading the user's order, not an order), or None where the orders are the same."""
        check_order_operand(x, shape)
        static_pattern, _, head_layout = resolved(head_pattern, x.shape[-3])
        return layout_mover(
            layouts, layout_of_pattern, static_pattern, head_layout, interpret, permute_kernel
        )

    def to_kernel_order(x, *, head_pattern=None, interpret=False):
        """x [..., heads, seq, d] in the user's token order -> each head's kernel order."""
        mover = order_mover(x, head_pattern, interpret)
        return x if mover is None else mover(x, to_kernel=True)

    def from_kernel_order(y, *, head_pattern=None, interpret=False):
        """The inverse of to_kernel_order."""
        mover = order_mover(y, head_pattern, interpret)
        return y if mover is None else mover(y, to_kernel=False)

    attention.__doc__ = attention_doc(
        shape,
        dtype,
        [p.name for p in patterns],
        default_head_pattern,
        backend="TPU",
        runtime=runtime,
        text_tokens=layouts[0].text_tokens,
        kv_cache=kv_cache,
        select=select,
    )
    segments.declared_signature(
        attention, runtime, kv_cache is not None, None if select is None else select.policy.rule
    )
    attention.to_kernel_order = to_kernel_order
    if shape.bounded_softmax:
        attention.softmax_modes = softmax_modes
    attention.from_kernel_order = from_kernel_order
    attention.tables = tables
    attention.runtime = runtime
    attention.kv_cache = kv_cache
    attention.select = select
    attention.cube_dma = cubes
    attention.permute_kernel = permute_kernel
    return attention


def _no_cotangent(x):
    """The cotangent of an integer input (head_pattern, run-time ids): none."""
    return np.zeros(x.shape, jax.dtypes.float0)
