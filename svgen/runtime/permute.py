"""Temporal-major permutations as one Pallas TPU kernel: two HBM passes per tensor.

A temporal-major head sees its tokens in kernel order: text and the anchor frames where the
user has them, then the other T' frames temporal-major (place p, frame f at
main_start + p*T' + f - anchors; svgen.runtime.layout). XLA does that reshape + transpose
in about 8 passes over the tensor (a major-dimension transpose in two copies, the anchor
frames' slice and concatenation; `bench/wrapper_cost.py`). Here every element is read once
and written once:

  * per (row, block of k places): T' DMAs bring frame f's run of k places into VMEM
    [T', k, d], which is transposed in VMEM to [k*T', d] (place-major: what the kernel order
    holds there) and written back by one DMA; the reverse direction reads the contiguous
    k*T' rows and writes the T' runs. The last block may hold fewer places (S % k);
  * text tokens and anchor frames keep their place: one HBM-to-HBM DMA each, per row;
  * rows whose head uses an identity layout (frame-major) are one HBM-to-HBM DMA of the
    whole row (the head -> layout code is scalar-prefetched: traced assignments work).

The transpose runs in f32 (bf16 rows are packed two to a sublane). On v6e (T' = 20, k = 128,
bf16) it costs ~620-700 bundles per block against ~1,400 cycles of DMA for the block's
1.3 MB at 1.64 TB/s: the kernel is bound by HBM, not by the transpose.

`to_kernel` / `from_kernel` carry each other as their VJP (a permutation's transpose is its
inverse), so gradients flow through them.

Status: not used by the generated wrappers yet. Wired into `make_attention`, eager calls in
Pallas's TPU interpreter (`pltpu.InterpretParams`) hung now and then (3 runs of about 10:
three of these calls, then the attention kernel, in one eager `attention`); jitted calls and
the discharge interpreter (`interpret=True`) did not. Until that is understood the wrapper
keeps XLA's permutation; this kernel is tested on its own (tests/test_permute.py) and
compiles for v6e at full size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime.layout import TokenLayout

#: Places per block: a block is PLACES x T' rows (1.3 MB in bf16 at T' = 20, d = 128).
PLACES = 128


def applies(layouts: list[TokenLayout]) -> bool:
    """Whether the heads' layouts are what this kernel permutes: identity layouts and at most
    one temporal-major layout that is not the identity."""
    moved = [lay for lay in layouts if not lay.is_identity]
    return len(moved) == 1 and moved[0].is_temporal_major


def _moved(layouts: list[TokenLayout]) -> TokenLayout:
    (lay,) = [lay for lay in layouts if not lay.is_identity]
    return lay


def permute(x, layouts: list[TokenLayout], head_layout, *, to_kernel: bool, interpret=False):
    """x [rows, seq, d] (rows = batch * heads, head = row % heads) from the user's order to
    each head's kernel order (or back); head_layout int32 [heads] indexes `layouts`."""
    lay = _moved(layouts)
    moved = jnp.asarray([not lay_.is_identity for lay_ in layouts], jnp.int32)[head_layout]
    return _permute(x, moved, lay, to_kernel, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _permute(x, moved, lay: TokenLayout, to_kernel: bool, interpret):
    return _call(x, moved, lay, to_kernel, interpret)


def _permute_fwd(x, moved, lay, to_kernel, interpret):
    return _call(x, moved, lay, to_kernel, interpret), moved


def _permute_bwd(lay, to_kernel, interpret, moved, g):
    # The transpose of a permutation is its inverse; `moved` (int) gets no cotangent.
    return _call(g, moved, lay, not to_kernel, interpret), None


_permute.defvjp(_permute_fwd, _permute_bwd)


def _call(x, moved, lay: TokenLayout, to_kernel: bool, interpret):
    rows, seq, d = x.shape
    heads = moved.shape[0]
    places, frames = lay.tokens_per_frame, lay.main_frames
    k = min(PLACES, places)
    blocks = -(-places // k)
    kernel = functools.partial(
        _kernel, lay=lay, heads=heads, k=k, blocks=blocks, to_kernel=to_kernel, seq=seq
    )
    any_space = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(rows, blocks),
            in_specs=[any_space],
            out_specs=any_space,
            scratch_shapes=[
                pltpu.VMEM((frames, k, d), x.dtype),
                pltpu.VMEM((k * frames, d), x.dtype),
                pltpu.SemaphoreType.DMA((2,)),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        # What XLA's cost analysis reports for the call: every element read once and written
        # once (the DMAs above, by construction).
        cost_estimate=pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=2 * x.nbytes),
        interpret=interpret,
        name="svgen_permute_" + ("to_kernel" if to_kernel else "from_kernel"),
    )(moved, x)


def _identity_ranges(lay: TokenLayout) -> list[tuple[int, int]]:
    """(start, length) of the positions equal in both orders: text, anchor frames."""
    ranges = []
    if lay.text_tokens:
        ranges.append((lay.text_start, lay.text_tokens))
    if lay.anchor_frames:
        ranges.append((lay.video_start, lay.anchor_frames * lay.tokens_per_frame))
    return ranges


def _kernel(moved_ref, x_hbm, o_hbm, runs, rows, sem, *, lay, heads, k, blocks, to_kernel, seq):
    r, j = pl.program_id(0), pl.program_id(1)
    is_moved = moved_ref[jax.lax.rem(r, heads)] != 0

    def copy(start: int, length: int):
        c = pltpu.make_async_copy(
            x_hbm.at[r, pl.ds(start, length)], o_hbm.at[r, pl.ds(start, length)], sem.at[1]
        )
        c.start()
        c.wait()

    @pl.when(jnp.logical_not(is_moved) & (j == 0))
    def _():
        copy(0, seq)

    @pl.when(is_moved & (j == 0))
    def _():
        for start, length in _identity_ranges(lay):
            copy(start, length)

    block = functools.partial(_block, r, j, x_hbm, o_hbm, runs, rows, sem, lay, k)
    last = lay.tokens_per_frame - (blocks - 1) * k
    if last == k:
        pl.when(is_moved)(functools.partial(block, k, to_kernel))
        return
    pl.when(is_moved & (j < blocks - 1))(functools.partial(block, k, to_kernel))
    pl.when(is_moved & (j == blocks - 1))(functools.partial(block, last, to_kernel))


def _block(r, j, x_hbm, o_hbm, runs, rows, sem, lay: TokenLayout, k: int, size: int, to_kernel):
    """Block j of row r, `size` places (k but for the last): T' runs of `size` places, one per
    main frame, in the user's order; size * T' rows, place-major, in the kernel's."""
    frames, d = lay.main_frames, runs.shape[-1]
    place = j * k
    first_frame = lay.video_start + lay.anchor_frames * lay.tokens_per_frame
    run_refs = [
        x_hbm.at[r, pl.ds(first_frame + f * lay.tokens_per_frame + place, size)]
        if to_kernel
        else o_hbm.at[r, pl.ds(first_frame + f * lay.tokens_per_frame + place, size)]
        for f in range(frames)
    ]
    block_ref = (o_hbm if to_kernel else x_hbm).at[
        r, pl.ds(lay.main_start + place * frames, size * frames)
    ]
    if to_kernel:
        copies = [
            pltpu.make_async_copy(src, runs.at[f, pl.ds(0, size)], sem.at[0])
            for f, src in enumerate(run_refs)
        ]
        for c in copies:
            c.start()
        for c in copies:
            c.wait()
        value = runs[:, pl.ds(0, size), :].astype(jnp.float32)
        rows[pl.ds(0, size * frames), :] = (
            jnp.swapaxes(value, 0, 1).reshape(size * frames, d).astype(rows.dtype)
        )
        out = pltpu.make_async_copy(rows.at[pl.ds(0, size * frames)], block_ref, sem.at[0])
        out.start()
        out.wait()
        return
    read = pltpu.make_async_copy(block_ref, rows.at[pl.ds(0, size * frames)], sem.at[0])
    read.start()
    read.wait()
    value = rows[pl.ds(0, size * frames), :].astype(jnp.float32)
    runs[:, pl.ds(0, size), :] = jnp.swapaxes(value.reshape(size, frames, d), 0, 1).astype(
        runs.dtype
    )
    copies = [
        pltpu.make_async_copy(runs.at[f, pl.ds(0, size)], dst, sem.at[0])
        for f, dst in enumerate(run_refs)
    ]
    for c in copies:
        c.start()
    for c in copies:
        c.wait()
