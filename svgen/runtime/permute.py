"""Temporal-major permutations as one Pallas TPU kernel: two HBM passes per tensor.

A temporal-major head sees its tokens in kernel order: text and the anchor frames where the
user has them, then the other T' frames temporal-major (place p, frame f at
main_start + p*T' + f - anchors; svgen.core.layout). XLA does that reshape + transpose
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

Per row the blocks are a two-slot pipeline: block j + 1's reads and block j - 1's writes run
while block j is transposed (in f32: bf16 rows are packed two to a sublane). On v6e at Wan
size (T' = 20, k = 128, bf16, 10 heads; libtpu's final schedule) a middle block's step issues
and transposes in about 990 bundles (to kernel order) and its DMAs move 1.3 MB, about 1,400
cycles at 1.64 TB/s: the kernel is bound by HBM, so q, k, v and o cost about 0.94 ms for the
Wan temporal spec (8 tensor passes at 1.64 TB/s: `bench/wrapper_cost.py`). Without the pipeline
(every DMA waited for where it was started) a block took ~771 bundles plus the DMAs' ~1,400
cycles, in series.

`to_kernel` / `from_kernel` carry each other as their VJP (a permutation's transpose is its
inverse), so gradients flow through them.

The generated wrappers use it (`svgen.runtime.kernel.make_attention`) wherever the heads'
layouts are identity layouts and one temporal-major layout, with text and frames of whole
multiples of 8 tokens (`applies`): 8 tensor passes for q, k, v and o instead of XLA's 33-40
(Wan's temporal and mixed specs, HunyuanVideo's mixed spec; CogVideoX's 226 text tokens take
the wrapper's gather, svgen.runtime.calls.token_gather). Eager calls in Pallas's TPU
interpreter wait for each result (svgen.runtime.interpret).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from svgen.runtime.interpret import settled
from svgen.core.layout import TokenLayout

#: Places per block: a block is PLACES x T' rows (1.3 MB in bf16 at T' = 20, d = 128).
PLACES = 128


#: Every DMA's rows start and end on a multiple of this: Mosaic refuses slices of a bf16 HBM
#: array that cut its (8, 128) tiles (measured: 226 text tokens or 204 places per frame fail
#: to compile for v6e, 232 and 216 compile).
ROW_ALIGNMENT = 8


def applies(layouts: list[TokenLayout]) -> bool:
    """Whether the heads' layouts are what this kernel permutes: identity layouts and at most
    one temporal-major layout that is not the identity, whose text and frames are whole
    multiples of ROW_ALIGNMENT tokens (then so is every run, block and range it moves)."""
    moved = [lay for lay in layouts if not lay.is_identity]
    if len(moved) != 1 or not moved[0].is_temporal_major or moved[0].transposed:
        return False
    lay = moved[0]
    return lay.text_tokens % ROW_ALIGNMENT == 0 and lay.tokens_per_frame % ROW_ALIGNMENT == 0


def _moved(layouts: list[TokenLayout]) -> TokenLayout:
    (lay,) = [lay for lay in layouts if not lay.is_identity]
    return lay


def permute(x, layouts: list[TokenLayout], head_layout, *, to_kernel: bool, interpret=False):
    """x [rows, seq, d] (rows = batch * heads, head = row % heads) from the user's order to
    each head's kernel order (or back); head_layout int32 [heads] indexes `layouts`."""
    lay = _moved(layouts)
    moved = jnp.asarray([not lay_.is_identity for lay_ in layouts], jnp.int32)[head_layout]
    return settled(_permute(x, moved, lay, to_kernel, interpret), interpret)


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
                pltpu.VMEM((2, frames, k, d), x.dtype),  # two slots: block j and j + 1
                pltpu.VMEM((2, k * frames, d), x.dtype),
                pltpu.SemaphoreType.DMA((2,)),  # reads into slot 0, 1
                pltpu.SemaphoreType.DMA((2,)),  # writes from slot 0, 1
                pltpu.SemaphoreType.DMA(()),  # whole-range copies
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


def _kernel(
    moved_ref,
    x_hbm,
    o_hbm,
    runs,
    rows,
    read_sem,
    write_sem,
    copy_sem,
    *,
    lay,
    heads,
    k,
    blocks,
    to_kernel,
    seq,
):
    """Grid (row, block j). A moved row is a two-slot pipeline over its blocks: step j starts
    block j + 1's reads, waits for block j's, transposes it and starts its writes, then waits
    for block j - 1's writes, so that the DMAs of neighbouring blocks run while this one is
    transposed. Every DMA a row starts is waited for within the row's own steps."""
    r, j = pl.program_id(0), pl.program_id(1)
    is_moved = moved_ref[jax.lax.rem(r, heads)] != 0
    last = lay.tokens_per_frame - (blocks - 1) * k  # places in the last block

    def copy(start: int, length: int):
        c = pltpu.make_async_copy(
            x_hbm.at[r, pl.ds(start, length)], o_hbm.at[r, pl.ds(start, length)], copy_sem
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

    blocks_of = _Blocks(r, x_hbm, o_hbm, runs, rows, read_sem, write_sem, lay, k, to_kernel)

    def size_of(block: int):
        return last if block == blocks - 1 else k

    def on_block(block_index, action):
        """Run action(size) with the static size of block `block_index` (traced)."""
        if last == k:  # (one block: last == k == places)
            action(k)
            return
        pl.when(block_index < blocks - 1)(lambda: action(k))
        pl.when(block_index == blocks - 1)(lambda: action(last))

    @pl.when(is_moved)
    def _():
        slot = jax.lax.rem(j, 2)

        @pl.when(j == 0)
        def _():
            _start(blocks_of.reads(0, 0, size_of(0)))

        @pl.when(j + 1 < blocks)
        def _():
            on_block(j + 1, lambda size: _start(blocks_of.reads(j + 1, 1 - slot, size)))

        def transpose_and_write(size):
            _wait(blocks_of.reads(j, slot, size))
            blocks_of.transpose(slot, size)
            _start(blocks_of.writes(j, slot, size))

        on_block(j, transpose_and_write)

        @pl.when(j > 0)
        def _():  # block j - 1 is never the last one
            _wait(blocks_of.writes(j - 1, 1 - slot, k))

        @pl.when(j == blocks - 1)
        def _():
            on_block(j, lambda size: _wait(blocks_of.writes(j, slot, size)))


def _start(copies) -> None:
    for c in copies:
        c.start()


def _wait(copies) -> None:
    for c in copies:
        c.wait()


class _Blocks:
    """The DMAs and the transpose of one row's blocks. Block j holds `size` places (k but
    for the last): T' runs of `size` places, one per main frame, in the user's order;
    size * T' rows, place-major, in the kernel's. `runs` holds the former, `rows` the
    latter, each in two slots."""

    def __init__(self, r, x_hbm, o_hbm, runs, rows, read_sem, write_sem, lay, k, to_kernel):
        self.r, self.x_hbm, self.o_hbm = r, x_hbm, o_hbm
        self.runs, self.rows = runs, rows
        self.read_sem, self.write_sem = read_sem, write_sem
        self.lay, self.k, self.to_kernel = lay, k, to_kernel

    def _user_runs(self, hbm, j, size):
        lay = self.lay
        first_frame = lay.video_start + lay.anchor_frames * lay.tokens_per_frame
        place = j * self.k
        return [
            hbm.at[self.r, pl.ds(first_frame + f * lay.tokens_per_frame + place, size)]
            for f in range(lay.main_frames)
        ]

    def _kernel_rows(self, hbm, j, size):
        frames = self.lay.main_frames
        return hbm.at[self.r, pl.ds(self.lay.main_start + j * self.k * frames, size * frames)]

    def reads(self, j, slot, size):
        sem = self.read_sem.at[slot]
        if self.to_kernel:
            return [
                pltpu.make_async_copy(src, self.runs.at[slot, f, pl.ds(0, size)], sem)
                for f, src in enumerate(self._user_runs(self.x_hbm, j, size))
            ]
        n = size * self.lay.main_frames
        src = self._kernel_rows(self.x_hbm, j, size)
        return [pltpu.make_async_copy(src, self.rows.at[slot, pl.ds(0, n)], sem)]

    def writes(self, j, slot, size):
        sem = self.write_sem.at[slot]
        if self.to_kernel:
            n = size * self.lay.main_frames
            dst = self._kernel_rows(self.o_hbm, j, size)
            return [pltpu.make_async_copy(self.rows.at[slot, pl.ds(0, n)], dst, sem)]
        return [
            pltpu.make_async_copy(self.runs.at[slot, f, pl.ds(0, size)], dst, sem)
            for f, dst in enumerate(self._user_runs(self.o_hbm, j, size))
        ]

    def transpose(self, slot, size):
        """runs[slot] [T', size, d] <-> rows[slot] [size * T', d], in f32 (bf16 rows are
        packed two to a sublane)."""
        frames, d = self.lay.main_frames, self.runs.shape[-1]
        if self.to_kernel:
            value = self.runs[slot, :, pl.ds(0, size), :].astype(jnp.float32)
            self.rows[slot, pl.ds(0, size * frames), :] = (
                jnp.swapaxes(value, 0, 1).reshape(size * frames, d).astype(self.rows.dtype)
            )
            return
        value = self.rows[slot, pl.ds(0, size * frames), :].astype(jnp.float32)
        self.runs[slot, :, pl.ds(0, size), :] = jnp.swapaxes(
            value.reshape(size, frames, d), 0, 1
        ).astype(self.runs.dtype)
