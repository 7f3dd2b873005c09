"""Splash Attention given the same mask as a generated module: what `svgen bench` times svgen
against.

A user without svgen would hand Splash Attention (jax.experimental.pallas.ops.tpu
.splash_attention) their mask as a `Mask` object, and Splash would cut it into blocks, keep
the all-true and all-false ones as flags and load the partial ones from HBM. This module
builds that object from a generated module: one `PackedKeep` per pattern, its bits the
module's own mask (`coords.keep` of each pattern's `boundary_mask`, the same function the
module's profiling and reference paths use) on every pair of kernel positions, computed on
the default device a strip of rows at a time and kept bit-packed on the host (75,776² pairs
take 718 MB). Heads get their pattern's object, so Splash's deduplication sees one mask per
pattern; tokens are in each head's kernel order (what svgen's kernel runs on, and what a
user keeping activations in that order would give Splash). An aligned pattern (`tiling.align`)
runs a mask rounded to its compute blocks, which its `boundary_mask` (every pair of a visited
block) does not spell out: its bits come from the plan's compute-block kinds instead
(`aligned_keep`), so Splash and the reference get the mask the kernel runs.

Padding: Splash needs the sequence to be a multiple of its blocks; padded positions keep no
pair (their query rows come out as whatever Splash makes of an empty row, and are dropped).

Nothing here is timed and nothing runs on a TPU by necessity: on a CPU host the strips run
under XLA's CPU backend (the tests check the bits against the IR oracle, brute force).
"""

from __future__ import annotations

import functools

import numpy as np

from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

#: Query rows per device evaluation: [rows, padded] bools in flight.
STRIP_ROWS = 512


def padded_length(seq_len: int, *blocks: int) -> int:
    """The smallest multiple of every block size that holds `seq_len` tokens. Block sizes
    whose least common multiple would more than double the tokens (or the largest block) are
    refused with a ValueError, before Splash builds a mask of that size: (99999, 128, 128)
    would pad 424 tokens to 12.8M, whose mask Splash then scans for minutes."""
    step = int(np.lcm.reduce(np.asarray(blocks, np.int64)))
    padded = -(-seq_len // step) * step
    if padded > 2 * max(seq_len, *blocks):
        raise ValueError(
            f"Splash blocks {'/'.join(map(str, blocks))} would pad {seq_len:,} tokens to "
            f"{padded:,} (their least common multiple is {step:,})"
        )
    return padded


def pattern_keep(pattern):
    """keep(q_pos, k_pos) -> bool: the pattern's mask on kernel positions (coords.keep of its
    `boundary_mask`, as the module's profiling and reference paths read it)."""
    from svgen.runtime import coords

    return functools.partial(
        coords.keep, pattern.boundary_mask, pattern.layout, tables=pattern.block_tables
    )


def aligned_keep(plan_pattern):
    """keep(q_pos, k_pos) -> bool of an aligned pattern (plan_pattern.budget set): the pair's
    compute block is FULL. Positions in kernel order, non-negative (lax.div, not //: it lowers
    for TPU)."""
    import jax.numpy as jnp
    from jax import lax

    from svgen.core.kinds import TileKind

    full = jnp.asarray(plan_pattern.compute_kinds == TileKind.FULL)
    grid = plan_pattern.compute_grid

    def keep(q_pos, k_pos):
        return full[lax.div(q_pos, grid.block_q), lax.div(k_pos, grid.block_kv)]

    return keep


def kernel_keep(plan_pattern, runtime_pattern):
    """The mask a pattern's kernel runs: its plan's aligned blocks when aligned, else the
    module's own `boundary_mask` (runtime_pattern, a module's attention.patterns[i])."""
    if plan_pattern is not None and plan_pattern.budget is not None:
        return aligned_keep(plan_pattern)
    return pattern_keep(runtime_pattern)


def packed_keep(
    keep,
    first_row: int,
    rows: int,
    keys: int,
    shape: tuple[int, int],
    strip_rows: int = STRIP_ROWS,
) -> np.ndarray:
    """uint8 [shape[0], shape[1] / 8]: keep(q_pos, k_pos) (int32 [r, 1] and [1, k] -> bool)
    for the queries first_row .. first_row + rows - 1 (row i of the result is query
    first_row + i) against the keys 0 .. keys - 1, bit-packed along keys (big-endian bits, as
    np.packbits), computed on the default device a strip of rows at a time. Rows and keys past
    those keep nothing; positions are clamped into range before `keep` reads them (a mask may
    divide or index by them)."""
    import jax
    import jax.numpy as jnp

    padded_rows, padded_keys = shape
    if padded_keys % 8:
        raise ValueError(f"the padded keys must be a multiple of 8, got {padded_keys}")
    strip_rows = min(strip_rows, padded_rows)
    last_row = first_row + rows - 1

    @jax.jit
    def strip(first):
        q_pos = first + jnp.arange(strip_rows, dtype=jnp.int32).reshape(strip_rows, 1)
        k_pos = jnp.arange(padded_keys, dtype=jnp.int32).reshape(1, padded_keys)
        kept = keep(jnp.minimum(q_pos, last_row), jnp.minimum(k_pos, keys - 1))
        real = (q_pos <= last_row) & (k_pos < keys)
        return jnp.packbits(jnp.broadcast_to(kept, real.shape) & real, axis=-1)

    out = np.empty((padded_rows, padded_keys // 8), np.uint8)
    for start in range(0, padded_rows, strip_rows):
        block = np.asarray(strip(np.int32(first_row + start)))
        out[start : start + strip_rows] = block[: padded_rows - start]
    return out


def packed_keep_bits(
    pattern, seq_len: int, padded: int, strip_rows: int = STRIP_ROWS, plan_pattern=None
):
    """uint8 [padded, padded / 8]: the pattern's whole mask in kernel order, bit-packed (the
    aligned mask when `plan_pattern` is an aligned pattern's plan)."""
    keep = kernel_keep(plan_pattern, pattern)
    return packed_keep(keep, 0, seq_len, seq_len, (padded, padded), strip_rows)


class PackedKeep(mask_lib.Mask):
    """A Splash `Mask` over a bit-packed keep[q, k] (one pattern, kernel order; square, or
    with `cols` keys a rectangle: a chunk's rows against every key). Splash asks for blocks
    by slices; each comes unpacked. Equal only to itself, so heads that share the object
    share Splash's mask processing and partial blocks."""

    def __init__(self, name: str, bits: np.ndarray, cols: int | None = None):
        cols = bits.shape[0] if cols is None else cols
        if bits.ndim != 2 or bits.dtype != np.uint8 or bits.shape[1] != -(-cols // 8):
            raise ValueError(
                f"expected uint8 [rows, {cols} / 8] bits, got {bits.dtype} {bits.shape}"
            )
        self.name = name
        self.bits = bits
        self._cols = cols

    @property
    def shape(self) -> tuple[int, int]:
        return (self.bits.shape[0], self._cols)

    def __getitem__(self, idx) -> np.ndarray:
        rows, cols = idx
        r0, r1 = _bounds(rows, self.shape[0])
        c0, c1 = _bounds(cols, self.shape[1])
        byte0, byte1 = c0 // 8, -(-c1 // 8)
        unpacked = np.unpackbits(self.bits[r0:r1, byte0:byte1], axis=-1)
        return unpacked[:, c0 - 8 * byte0 : c1 - 8 * byte0].astype(np.bool_)

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"PackedKeep({self.name!r}, {self.shape[0]} x {self.shape[1]})"


def _bounds(index, size: int) -> tuple[int, int]:
    if isinstance(index, (int, np.integer)):
        return int(index), int(index) + 1
    if not isinstance(index, slice) or index.step not in (None, 1):
        raise NotImplementedError(f"PackedKeep takes unit-step slices, got {index!r}")
    start, stop, _ = index.indices(size)
    return start, stop


def head_patterns(module) -> tuple[int, ...]:
    """Each head's pattern index: the module's static assignment, else (patterns chosen at
    run time) pattern i % patterns for head i, so that every pattern is timed."""
    static = getattr(module, "HEAD_PATTERN", None)
    if static is not None:
        return tuple(int(p) for p in static)
    count = len(module.PATTERNS)
    return tuple(h % count for h in range(module.HEADS))


def splash_mask(module, padded: int, assignment: tuple[int, ...], plan=None):
    """A Splash `MultiHeadMask` [heads, padded, padded] of the module's mask, each head its
    pattern's in that pattern's kernel order (`plan`, the module's: required for an aligned
    spec, whose rounded mask only the plan holds)."""
    masks = _pattern_masks(module, padded, tuple(sorted(set(assignment))), plan)
    return mask_lib.MultiHeadMask([masks[p] for p in assignment])


def _pattern_masks(module, padded: int, used: tuple[int, ...], plan) -> dict[int, PackedKeep]:
    patterns = module.attention.patterns
    seq = int(module.SEQ_LEN)
    return {
        p: PackedKeep(
            patterns[p].name,
            packed_keep_bits(
                patterns[p], seq, padded, plan_pattern=plan.patterns[p] if plan else None
            ),
        )
        for p in used
    }


@functools.cache
def _splash():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel

    return splash_attention_kernel


def make_splash(
    mask,
    blocks: tuple[int, int, int],
    backward: bool,
    interpret: bool = False,
    fused: bool = True,
    backward_blocks: tuple[int, int, int] | None = None,
):
    """Splash's multi-head kernel for `mask` at blocks (block_q, block_kv, block_kv_compute);
    with `backward`, its backward at `backward_blocks` (default: the forward's), fused
    (one dq/dk/dv kernel) or its two kernels."""
    splash = _splash()
    bq, bkv, bkvc = blocks
    extra = {}
    if backward:
        dq, dkv, dkvc = backward_blocks or blocks
        extra = dict(
            block_q_dkv=dq,
            block_kv_dkv=dkv,
            block_kv_dkv_compute=dkvc,
            use_fused_bwd_kernel=fused,
        )
        if not fused:
            extra.update(block_q_dq=dq, block_kv_dq=dkv)
    sizes = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkvc, **extra)
    return splash.make_splash_mha(
        mask, head_shards=1, q_seq_shards=1, block_sizes=sizes, interpret=interpret
    )


def full_mask(heads: int, padded: int):
    return mask_lib.MultiHeadMask([mask_lib.FullMask((padded, padded)) for _ in range(heads)])
