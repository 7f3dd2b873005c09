"""Blocks chosen from the activations: a spec's `select:` policy, run per call on device.

A spec with a selection policy keeps two masks:
  * the *always-kept* mask (the spec's `mask`): exact, classified at compile time into FULL
    and BOUNDARY compute blocks like any other pattern's;
  * the *candidate* region (`select.candidate`, a mask too): the compute blocks it touches
    are the ones a call may choose. A chosen block is attended whole (every real key of the
    block), as Video Sparse Attention's cubes are; the candidate bounds what can be chosen,
    so the static maxima (steps, SMEM) are those of always-kept + every candidate block.

keep(q, k) = always(q, k) or (selected(block(q), block(k)) and k < seq_len)

Per call, in jnp under jit (no host round trip; k and p may be traced, one compile for all):
  1. pooling: the mean of q and of k over each compute block's real tokens (blocks of
     compute_q rows and compute_kv keys, in each head's kernel order), f32;
  2. block scores: pooled q . pooled k * sm_scale, one small matmul per head;
  3. per compute block row, among its *selectable* blocks (candidate blocks the always-kept
     mask does not already keep whole): top_k keeps the k best; top_p keeps the fewest
     best blocks whose softmax mass (over the row's selectable scores) reaches p; either
     clamped to the policy's [min, max] and to the row's selectable blocks (a -inf score
     has no mass: only `min` can bring it in). Traced amounts are not checked: a p that
     is NaN or below 0 counts no block (so `min` are selected), one above 1 every ranked
     block of finite score; a k below 0 gives `min` (docs/runtime.md). Ranking is by
     score, highest first; ties go to the lower kv block (rows of up to
     MAX_COMPARED_COLUMNS blocks compare every pair, longer ones sort: the same order). A
     NaN or +inf score is always selected (on top of the count, its mass left out of
     top_p): bad activations reach the output as they would in dense attention, never
     silently dropped or masked away. A call with return_selection=True returns the
     selected blocks (`Selected.blocks`, per head) beside o;
  4. the selected blocks raise the static always-kept kinds (svgen.runtime.refine's words):
     a selected block is FULL, or, where it holds the end of the keys, the kind 3 (PADDED,
     the value SEGMENT_BOUNDARY has in segment tables), which the forward kernel runs
     unmasked but for the keys past seq_len; refine() compacts each head's words into the
     kernels' table format at the static maximum (each walk's: svgen.runtime.select_walk).
On GPU (svgen.runtime.gpu) the grain is the module's GPU tile and `gpu_tables` builds the
Triton kernel's per-row CSR tables the same way (a selected tile FULL: that kernel masks the
padding keys of a FULL tile itself).
Gradients treat the selection as a constant (no gradient flows through pooling, scores or
top-k); the backward kernels walk the same selected blocks (the dk/dv walk through the
transposed visits), where padded keys are zeros, so a selected block is FULL there.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from svgen.core.kinds import TileKind
from svgen.runtime.refine import block_segments
from svgen.runtime.segments import CallTables
from svgen.runtime.select_walk import SelectionWalk, call_tables
from svgen.core.tables import (
    KV_BLOCK_SHIFT,
    SMEM_BUDGET,
    KernelShape,
    compute_block_kinds,
    selectable_blocks,
    tile_grid,
    transposed_shape,
)

TOP_K = "top_k"
TOP_P = "top_p"


@dataclasses.dataclass(frozen=True)
class SelectPolicy:
    """What the spec's `select:` says: the rule, its default amount (k blocks, or mass p),
    and the least and most blocks selected per compute block row."""

    rule: str  # TOP_K or TOP_P
    default: float
    min_blocks: int
    max_blocks: int
    # Scores from this many sampled query rows per compute block row (`sampled_block_scores`);
    # 0: mean pooling (`block_scores`).
    sampled_rows: int = 0

    @property
    def argument(self) -> str:
        """The keyword of `attention` that overrides the default amount."""
        return self.rule


class Selected(NamedTuple):
    """One call's selection (a pytree): bool [rows, row blocks, col blocks], rows = batch *
    heads in the kernel's order, blocks of compute_q x compute_kv tokens."""

    blocks: jax.Array


def pooled_blocks(x, block: int, num_blocks: int):
    """f32 [rows, num_blocks, d]: the mean of x [rows, seq, d] over each block of `block`
    tokens; positions past seq count for nothing (a block of padding only is 0).

    The sums are one matmul with a 0/1 block indicator (exact: products with 1, f32
    accumulation), which reads x once and writes nothing else: reshaping x into blocks
    makes XLA copy it whole, since seq is no multiple of the block (383 MB of temporaries
    for Wan 720p's q and k, AOT for v6e, against none)."""
    rows, seq, d = x.shape
    token = lax.broadcasted_iota(jnp.int32, (num_blocks, seq), 1)
    block_of = lax.broadcasted_iota(jnp.int32, (num_blocks, seq), 0)
    indicator = (lax.div(token, jnp.int32(block)) == block_of).astype(x.dtype)
    sums = jnp.einsum(
        "bn,rnd->rbd",
        indicator,
        x,
        preferred_element_type=jnp.float32,
        precision=lax.Precision.HIGHEST,
    )
    real = np.clip(seq - np.arange(num_blocks) * block, 0, block)
    return sums / np.maximum(real, 1).astype(np.float32)[None, :, None]


def block_scores(q, k, shape: KernelShape, num_row_blocks: int, num_col_blocks: int, sm_scale):
    """f32 [rows, row blocks, col blocks]: pooled q . pooled k * sm_scale (kernel order)."""
    pq = pooled_blocks(q, shape.cq, num_row_blocks)
    pk = pooled_blocks(k, shape.ckv, num_col_blocks)
    scores = jnp.einsum("rqd,rkd->rqk", pq, pk, precision=lax.Precision.HIGHEST)
    return scores * jnp.float32(sm_scale)


def sampled_rows(seq: int, block: int, num_blocks: int, per_block: int) -> np.ndarray:
    """int [num_blocks, per_block]: `per_block` query rows evenly spaced inside each block of
    `block` rows (the middles of equal parts), clipped to the last real row."""
    per_block = min(per_block, block)
    offsets = (2 * np.arange(per_block) + 1) * block // (2 * per_block)
    return np.minimum(np.arange(num_blocks)[:, None] * block + offsets, seq - 1)


def sampled_block_scores(
    q, k, shape: KernelShape, num_row_blocks: int, num_col_blocks: int, sm_scale, per_block: int
):
    """f32 [rows, row blocks, col blocks]: per compute block row, the log of the mean over
    `per_block` sampled query rows of each key block's share of that row's attention mass
    (kernel order; keys past seq have none). With every row sampled it is the log of the
    block's exact mean attention mass, so top_p's softmax over a row's selectable blocks is
    their share of the mass they hold together. One [sampled rows x seq] score matrix per
    row of q (batch x head) at a time: 8 samples per 1,024-row block of 75,600 tokens are
    592 x 75,600 f32, 179 MB."""
    seq = k.shape[1]
    picked = sampled_rows(seq, shape.cq, num_row_blocks, per_block)
    samples = picked.shape[1]
    pad = num_col_blocks * shape.ckv - seq

    def one_row(qk):
        qr, kr = qk
        scores = jnp.einsum(
            "sd,nd->sn", qr[picked.reshape(-1)], kr, preferred_element_type=jnp.float32
        ) * jnp.float32(sm_scale)
        scores = jnp.pad(scores, ((0, 0), (0, pad)), constant_values=-jnp.inf)
        per_block_mass = jax.nn.logsumexp(
            scores.reshape(-1, num_col_blocks, shape.ckv), axis=-1
        )  # [samples * row blocks, col blocks]
        share = jax.nn.log_softmax(per_block_mass, axis=-1)
        share = share.reshape(num_row_blocks, samples, num_col_blocks)
        return jax.nn.logsumexp(share, axis=1) - jnp.float32(np.log(samples))

    return lax.map(one_row, (q, k))


# Rows of at most this many block columns rank by comparing every pair (an [R, C, C] mask
# and two small matmuls: no sort, which is the dearest op on a TPU; bench/select_cost.py);
# longer rows sort.
MAX_COMPARED_COLUMNS = 128


def select_blocks(
    scores, selectable: np.ndarray, policy: SelectPolicy, amount, least=None, most=None
):
    """bool [..., R, C]: the selected blocks of f32 scores [..., R, C] among the selectable
    ones (bool [R, C] or [..., R, C]), for `amount` (k or p; may be traced), clamped to
    [least, most] (default: the policy's min and max); amount, least and most broadcast
    against [..., R] (a value per row: per head). See the docstring."""
    least = policy.min_blocks if least is None else least
    most = policy.max_blocks if most is None else most
    selectable = jnp.asarray(selectable)
    forced = selectable & (jnp.isnan(scores) | (scores == jnp.inf))
    ranked = selectable & ~forced
    mass = _row_mass(scores, ranked) if policy.rule == TOP_P else None
    if scores.shape[-1] <= MAX_COMPARED_COLUMNS:
        rank, before = _compared_ranks(scores, ranked, mass)
    else:
        rank, before = _sorted_ranks(scores, ranked, mass)
    available = jnp.sum(ranked, axis=-1, dtype=jnp.int32)
    if policy.rule == TOP_K:
        count = jnp.broadcast_to(jnp.asarray(amount, jnp.int32), available.shape)
    else:
        # The fewest best blocks reaching p: those whose better blocks' mass is below p. A
        # -inf score has no mass: it never helps reach p (only `min` can bring it in).
        p = jnp.asarray(amount, jnp.float32)[..., None]
        counted = ranked & (scores > -jnp.inf) & (before < p)
        count = jnp.sum(counted, axis=-1, dtype=jnp.int32)
    count = jnp.clip(count, least, most)
    count = jnp.minimum(count, available)
    return (ranked & (rank < count[..., None])) | forced


def _row_mass(scores, ranked):
    """Each ranked block's softmax mass over its row's ranked blocks (0 for the others)."""
    top = jnp.max(jnp.where(ranked, scores, -jnp.inf), axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weight = jnp.where(ranked, jnp.exp(jnp.where(ranked, scores, -jnp.inf) - top), 0.0)
    total = jnp.sum(weight, axis=-1, keepdims=True)
    return weight / jnp.where(total > 0, total, 1.0)


def _compared_ranks(scores, ranked, mass):
    """(rank, mass of the better blocks) per block from all pairs: block j is better than
    block i when both are ranked and j scores higher, or the same at a lower column."""
    s_i, s_j = scores[..., :, None], scores[..., None, :]
    columns = jnp.arange(scores.shape[-1])
    lower = columns[None, :] < columns[:, None]  # [i, j]: j is the lower column
    better = ranked[..., :, None] & ranked[..., None, :] & ((s_j > s_i) | ((s_j == s_i) & lower))
    rank = jnp.sum(better, axis=-1, dtype=jnp.int32)
    before = None
    if mass is not None:
        before = jnp.einsum(
            "...ij,...j->...i", better.astype(jnp.float32), mass, precision=lax.Precision.HIGHEST
        )
    return rank, before


def _sorted_ranks(scores, ranked, mass):
    """(rank, mass of the better blocks) per block by sorting (rows too long to compare)."""
    # Highest first, ties to the lower column; blocks not ranked (NaN keys) sort last.
    order = jnp.argsort(jnp.where(ranked, -scores, jnp.nan), axis=-1, stable=True)
    rank = jnp.argsort(order, axis=-1, stable=True)
    before = None
    if mass is not None:
        sorted_mass = jnp.take_along_axis(mass, order, -1)
        sorted_before = jnp.cumsum(sorted_mass, axis=-1) - sorted_mass
        before = jnp.take_along_axis(sorted_before, rank, -1)
    return rank, before


def per_row(value, rows: int):
    """A call's amount (or bound) for rows = batch x heads: a scalar as it is, one value per
    head ([heads]) as [rows, 1] (row r is head r % heads), to broadcast against [rows, R]."""
    value = jnp.asarray(value)
    if value.ndim == 0:
        return value
    return value[jnp.arange(rows) % value.shape[0]][:, None]


@dataclasses.dataclass(frozen=True, eq=False)
class Selection:
    """A module's selection policy and the static side of its per-call tables, built from
    the always-kept pattern's runs and the candidate region's runs (both in the module)."""

    policy: SelectPolicy
    shape: KernelShape
    always_runs: np.ndarray
    candidate_runs: np.ndarray
    slots: int

    @functools.cached_property
    def always_blocks(self) -> np.ndarray:
        """int8 [R, C]: the always-kept compute block kinds (the kernel's: a FULL block
        holding the end of the keys is BOUNDARY)."""
        return compute_block_kinds(self.always_runs, *tile_grid(self.shape))

    @functools.cached_property
    def selectable(self) -> np.ndarray:
        """bool [R, C]: real blocks the candidate touches and always does not keep whole."""
        candidate = compute_block_kinds(self.candidate_runs, *tile_grid(self.shape))
        return selectable_blocks(self.always_blocks, candidate, self.shape)

    @property
    def padded_col(self) -> int | None:
        """The compute block column holding the end of the keys, when it is not whole."""
        s = self.shape
        return None if s.seq_len % s.ckv == 0 else s.seq_len // s.ckv

    @functools.cached_property
    def forward_walk(self) -> SelectionWalk:
        return SelectionWalk.build(
            self.always_blocks, self.selectable, self.shape, self.slots, self.padded_col
        )

    def transposed_walk(self, slots: int) -> SelectionWalk:
        """The dk/dv walk: rows are key blocks (padded keys are zeros there: FULL)."""
        return SelectionWalk.build(
            self.always_blocks.T,
            self.selectable.T,
            transposed_shape(self.shape),
            slots,
            None,
            transposed=True,
        )

    @functools.cached_property
    def dq_walk(self) -> SelectionWalk:
        """The separate dq kernel's walk: the forward's blocks, selected ones FULL."""
        return SelectionWalk.build(
            self.always_blocks, self.selectable, self.shape, self.slots, None
        )

    @property
    def max_pieces(self) -> int:
        return self.forward_walk.max_pieces

    @property
    def policies(self) -> tuple[SelectPolicy, ...]:
        """Per pattern (one): what a call's docstring words."""
        return (self.policy,)

    # -- what svgen.runtime.kernel asks of a call's selection (as of HeadSelections) --------
    def choose(self, q, k, sm_scale: float, amount, head_pattern, ids=None) -> Selected:
        """ids: the call's run-time (query, key) ids [rows, seq] in kernel order, or None."""
        del head_pattern  # every head has this pattern
        return self.select(q, k, sm_scale, amount, ids)

    def forward_tables(self, selected, head_pattern, ids=None) -> CallTables:
        return self.forward_walk.tables(selected, ids)

    def backward_tables(self, selected, head_pattern, dkv_slots: int, ids=None) -> tuple:
        """(the dq kernel's tables, the dk/dv kernel's) for a call's selection."""
        dkv = self.transposed_walk(dkv_slots)
        return self.dq_walk.tables(selected, ids), dkv.tables(selected, ids)

    def check_smem(self, rows: int, ids: bool = False) -> None:
        """ids: the call has run-time ids (its tables carry a chosen word per piece)."""
        need = self.forward_walk.smem_bytes(rows) + ids * 4 * rows * self.max_pieces
        if need > SMEM_BUDGET:
            raise ValueError(
                f"the selection tables of {rows} rows (batch x heads) need {need:,} bytes of "
                f"SMEM, over {SMEM_BUDGET:,}: call with fewer batch elements at a time, or "
                "narrow select.candidate"
            )

    @functools.lru_cache(maxsize=4)
    def _gpu_visits(self, block_q: int, block_kv: int):
        """The GPU kernel's static side: every GPU tile always-kept or selectable, by q tile
        (row-major, as its CSR rows list them), with its always-kept kind and the compute
        block it lies in (NumPy)."""
        s = self.shape
        if s.cq % block_q or s.ckv % block_kv:
            raise ValueError(
                f"GPU tiles ({block_q} x {block_kv}) must divide the selection's blocks "
                f"({s.cq} x {s.ckv})"
            )
        gq, gk = -(-s.seq_len // block_q), -(-s.seq_len // block_kv)
        rows = np.arange(gq) * block_q // s.cq
        cols = np.arange(gk) * block_kv // s.ckv
        always = self.always_blocks[np.ix_(rows, cols)]
        selectable = self.selectable[np.ix_(rows, cols)]
        q_tile, kv_tile = np.nonzero((always != TileKind.EMPTY) | selectable)
        return (
            q_tile.astype(np.int32),
            kv_tile.astype(np.int32),
            always[q_tile, kv_tile].astype(np.int32),
            rows[q_tile].astype(np.int32),
            cols[kv_tile].astype(np.int32),
            gq,
        )

    def gpu_tables(self, selected, block_q: int, block_kv: int):
        """(offsets, entries) of the GPU kernel's per-row CSR tables (svgen.runtime.gpu) for
        selected bool [rows, R, C]: row r's q tile i lists its kept GPU tiles at entries
        offsets[r * tiles + i] .. offsets[(rows + r) * tiles + i], kv_tile << 2 | kind, a
        selected tile FULL (the kernel masks the padding keys of a FULL tile itself)."""
        q_tile, kv_tile, always, block_row, block_col, gq = self._gpu_visits(block_q, block_kv)
        rows, visits = selected.shape[0], len(q_tile)
        chosen = selected[:, block_row, block_col]  # [rows, V]
        kind = jnp.where(chosen, jnp.int32(TileKind.FULL), jnp.asarray(always))
        keep = kind != TileKind.EMPTY
        value = (jnp.asarray(kv_tile) << KV_BLOCK_SHIFT) | kind
        row_base = jnp.arange(rows, dtype=jnp.int32)[:, None] * visits
        position = jnp.cumsum(keep, axis=1, dtype=jnp.int32) - 1 + row_base
        at = jnp.where(keep, position, rows * visits)  # past the end: dropped
        entries = jnp.zeros(max(rows * visits, 1), jnp.int32)
        entries = entries.at[at.reshape(-1)].set(value.reshape(-1), mode="drop")
        # Per (row, q tile): kept visits before it (its first entry) and through it (its end).
        counts = jnp.zeros((rows, gq), jnp.int32).at[:, q_tile].add(keep.astype(jnp.int32))
        ends = jnp.cumsum(counts, axis=1, dtype=jnp.int32) + row_base
        begins = ends - counts
        return jnp.concatenate([begins.reshape(-1), ends.reshape(-1)]), entries

    def select(self, q, k, sm_scale: float, amount, ids=None) -> Selected:
        """The call's selection from q, k [rows, seq, d] in kernel order (not differentiated);
        amount: one for every row, or one per head ([heads]); ids: run-time (query, key) ids
        [rows, seq], under which a block whose queries and keys share no segment is not
        selectable."""
        scores = self.scores(q, k, sm_scale)
        amount = per_row(amount, q.shape[0])
        selectable = self.selectable if ids is None else self.selectable & self.sharing(ids)
        return Selected(select_blocks(scores, selectable, self.policy, amount))

    def sharing(self, ids):
        """bool [rows, R, C]: per row, the blocks whose queries and keys may share a
        segment (their ids' ranges meet, and so do their bits: svgen.runtime.refine)."""
        rows_b, cols_b = self.selectable.shape
        s = self.shape

        def one_row(q_ids, k_ids):
            q_lo, q_hi, k_lo, k_hi, q_bits, k_bits = block_segments(
                q_ids, k_ids, s.cq, s.ckv, rows_b, cols_b
            )
            meet = (q_lo[:, None] <= k_hi[None, :]) & (k_lo[None, :] <= q_hi[:, None])
            return meet & ((q_bits[:, None] & k_bits[None, :]) != 0)

        return jax.vmap(one_row)(*ids)

    def scores(self, q, k, sm_scale: float):
        """f32 [rows, R, C]: the policy's block scores of q, k [rows, seq, d] in kernel order
        (pooled, or from sampled rows), not differentiated."""
        rows_b, cols_b = self.selectable.shape
        q, k = lax.stop_gradient(q), lax.stop_gradient(k)
        if self.policy.sampled_rows:
            return sampled_block_scores(
                q, k, self.shape, rows_b, cols_b, sm_scale, self.policy.sampled_rows
            )
        return block_scores(q, k, self.shape, rows_b, cols_b, sm_scale)

    def amount(self, top_k, top_p):
        """The call's amount (k or p), [] or per head [heads]: its argument, or the spec's
        default; the other argument is refused."""
        value = self.given_amount(top_k, top_p)
        return jnp.asarray(self.policy.default if value is None else value, self.amount_dtype)

    @property
    def amount_dtype(self):
        return jnp.int32 if self.policy.rule == TOP_K else jnp.float32

    def given_amount(self, top_k, top_p):
        """The call's own amount, checked (a scalar, or one per head), or None when it gives
        none; the other rule's argument is refused."""
        given = {TOP_K: top_k, TOP_P: top_p}
        other = TOP_P if self.policy.rule == TOP_K else TOP_K
        if given[other] is not None:
            raise TypeError(
                f"{other}: this module's select policy is {self.policy.rule} (the spec's "
                f"select.{self.policy.rule}); pass {self.policy.rule}= instead"
            )
        value = given[self.policy.rule]
        if value is None:
            return None
        rule, heads = self.policy.rule, self.shape.heads
        self._check_amount_dtype(value)
        if jnp.shape(value) not in ((), (heads,)):
            raise ValueError(
                f"{rule} must be a scalar or one value per head (shape ({heads},)), got shape "
                f"{jnp.shape(value)}"
            )
        if not isinstance(value, jax.core.Tracer):
            array = np.asarray(value)
            if not np.isfinite(array).all():
                raise ValueError(f"{rule} must be finite, got {value!r}")
            if rule == TOP_K and ((array != np.round(array)).any() or (array < 0).any()):
                raise ValueError(f"top_k must be whole numbers >= 0, got {value!r}")
            if rule == TOP_P and not ((array >= 0.0) & (array <= 1.0)).all():
                raise ValueError(f"top_p must lie in 0 .. 1, got {value!r}")
        return jnp.asarray(value, self.amount_dtype)

    def _check_amount_dtype(self, value) -> None:
        """No bool amount (True is no count and no mass), and no traced float k: the cast to
        int32 would truncate it (a concrete one is checked to be whole instead)."""
        rule = self.policy.rule
        kind = np.asarray(value).dtype if not hasattr(value, "dtype") else np.dtype(value.dtype)
        if kind == np.bool_:
            raise TypeError(f"{rule} must be a number, got a bool")
        traced = isinstance(value, jax.core.Tracer)
        if rule == TOP_K and traced and not jnp.issubdtype(kind, jnp.integer):
            raise TypeError(
                f"a traced top_k must have an integer dtype (int32), got {kind}: casting it "
                "would truncate it"
            )


@dataclasses.dataclass(frozen=True, eq=False)
class HeadSelections:
    """The selection of a module whose heads have patterns of their own (`select:` with
    `heads:`): one rule and scoring, and per pattern a Selection of its always-kept runs,
    its candidate region in its layout and its amounts (default, min, max: the section's,
    or the pattern's own from select.patterns). A call scores every row (batch x head)
    once, as one pattern would, and selects each row among its head's pattern's selectable
    blocks, by its head's amounts; each walk's tables take a row's pieces from its
    pattern's walk, padded to the longest."""

    selections: tuple[Selection, ...]

    def __post_init__(self):
        first = self.selections[0]
        for other in self.selections[1:]:
            same = (other.policy.rule, other.policy.sampled_rows, other.shape, other.slots)
            if same != (first.policy.rule, first.policy.sampled_rows, first.shape, first.slots):
                raise ValueError(
                    "the patterns' selections must share the rule, the scoring, the shape and "
                    "the slots"
                )

    @property
    def policy(self) -> SelectPolicy:
        """The first pattern's policy (the rule and scoring are every pattern's)."""
        return self.selections[0].policy

    @property
    def policies(self) -> tuple[SelectPolicy, ...]:
        return tuple(s.policy for s in self.selections)

    @property
    def shape(self) -> KernelShape:
        return self.selections[0].shape

    @property
    def max_pieces(self) -> int:
        return max(s.max_pieces for s in self.selections)

    def amount(self, top_k, top_p):
        """The call's own amount (checked; [] or [heads]), or None: each head's pattern's
        default (resolved per row by choose)."""
        return self.selections[0].given_amount(top_k, top_p)

    def _of_rows(self, values, head_pattern, rows: int, unknown):
        """[rows, 1]: per row, its head's pattern's value (`unknown` for a pattern index out
        of range: such rows select nothing anyway)."""
        table = jnp.asarray(np.asarray([*values, unknown]))
        return table[self._row_patterns(head_pattern, rows)][:, None]

    @property
    def selectable(self) -> np.ndarray:
        """bool [patterns, R, C]: what a head of each pattern may choose."""
        return np.stack([s.selectable for s in self.selections])

    def selectable_of_rows(self, head_pattern, rows: int):
        """bool [rows, R, C]: each row's pattern's selectable blocks (rows = batch x heads,
        head = row % heads; a pattern index out of range selects nothing)."""
        stacked = self.selectable
        stacked = np.concatenate([stacked, np.zeros_like(stacked[:1])])  # the unknown pattern
        return jnp.asarray(stacked)[self._row_patterns(head_pattern, rows)]

    def _row_patterns(self, head_pattern, rows: int):
        hp = jnp.asarray(head_pattern, jnp.int32)
        known = (hp >= 0) & (hp < len(self.selections))
        per_head = jnp.where(known, hp, len(self.selections))
        return per_head[jnp.arange(rows) % hp.shape[0]]

    def choose(self, q, k, sm_scale: float, amount, head_pattern, ids=None) -> Selected:
        """The call's selection from q, k [rows, seq, d], each row in its head's kernel order
        (not differentiated): the scores are every pattern's (the same policy and blocks).
        ids: run-time (query, key) ids [rows, seq], each row's in its head's order."""
        rows = q.shape[0]
        scores = self.selections[0].scores(q, k, sm_scale)
        selectable = self.selectable_of_rows(head_pattern, rows)
        if ids is not None:
            selectable = selectable & self.selections[0].sharing(ids)
        policies = self.policies
        if amount is None:
            defaults = [p.default for p in policies]
            dtype = self.selections[0].amount_dtype
            amount = self._of_rows(defaults, head_pattern, rows, 0).astype(dtype)
        else:
            amount = per_row(amount, rows)
        least = self._of_rows([p.min_blocks for p in policies], head_pattern, rows, 0)
        most = self._of_rows([p.max_blocks for p in policies], head_pattern, rows, 0)
        return Selected(select_blocks(scores, selectable, self.policy, amount, least, most))

    def _merged(self, walks, selected, head_pattern, ids=None) -> CallTables:
        """Each row's pieces from its pattern's walk, padded to the longest walk's."""
        most = max(w.max_pieces for w in walks)
        row_pattern = self._row_patterns(head_pattern, selected.shape[0])
        merged = None
        for index, walk in enumerate(walks):
            pieces = walk.pieces(selected, ids)
            pad = most - walk.max_pieces
            pieces = pieces._replace(
                **{
                    field: jnp.pad(getattr(pieces, field), ((0, 0), (0, pad)), mode="edge")
                    for field in ("entries", "lengths", "blocks", "chosen")
                    if getattr(pieces, field) is not None
                }
            )
            if merged is None:
                merged = pieces
                continue
            mine = row_pattern == index
            merged = jax.tree.map(
                lambda a, b: jnp.where(mine.reshape((-1,) + (1,) * (a.ndim - 1)), b, a),
                merged,
                pieces,
            )
        return call_tables(merged, most)

    def forward_tables(self, selected, head_pattern, ids=None) -> CallTables:
        walks = [s.forward_walk for s in self.selections]
        return self._merged(walks, selected, head_pattern, ids)

    def backward_tables(self, selected, head_pattern, dkv_slots: int, ids=None) -> tuple:
        dq = self._merged([s.dq_walk for s in self.selections], selected, head_pattern, ids)
        dkv = self._merged(
            [s.transposed_walk(dkv_slots) for s in self.selections], selected, head_pattern, ids
        )
        return dq, dkv

    def check_smem(self, rows: int, ids: bool = False) -> None:
        worst = max(self.selections, key=lambda s: s.max_pieces)
        worst.check_smem(rows, ids)


def call_amount(select: "Selection | None", top_k, top_p):
    """A call's amount (k or p) for a module's policy, or None without one (then top_k and
    top_p are refused with what to do)."""
    if select is None:
        if top_k is not None or top_p is not None:
            raise TypeError(
                f"{'top_k' if top_k is not None else 'top_p'}: this module was compiled "
                "without a `select:` policy in its spec; add one and run svgen compile again"
            )
        return None
    return select.amount(top_k, top_p)


def check_return_selection(select: "Selection | None", return_selection) -> None:
    """A call's return_selection: a Python bool (it decides what the call returns, so it
    cannot be traced), True only for a module with a selection policy."""
    if not isinstance(return_selection, (bool, np.bool_)):
        raise TypeError(
            "return_selection must be True or False (it decides whether the call returns "
            f"(o, selected) or o), got {type(return_selection).__name__} {return_selection!r}"
        )
    if return_selection and select is None:
        raise TypeError(
            "return_selection: this module was compiled without a `select:` policy in its "
            "spec, so a call selects nothing (it attends its mask); add one and run svgen "
            "compile again"
        )


def reference_selection(scores: np.ndarray, selectable: np.ndarray, policy: SelectPolicy, amount):
    """NumPy reference of select_blocks (the tests' oracle): the same rule, row by row."""
    out = np.zeros(scores.shape, bool)
    for index in np.ndindex(scores.shape[:-1]):
        row, can = scores[index], selectable[index[-1]]
        forced = can & (np.isnan(row) | (row == np.inf))
        ranked = np.flatnonzero(can & ~forced)
        order = ranked[np.argsort(-row[ranked], kind="stable")]
        if policy.rule == TOP_K:
            count = int(amount)
        else:
            s = row[order].astype(np.float64)
            top = s.max() if s.size and np.isfinite(s.max()) else 0.0
            w = np.exp(s - top) if s.size else s
            mass = w / w.sum() if s.size and w.sum() > 0 else np.zeros_like(w)
            before = np.cumsum(mass) - mass
            count = int(np.sum((before < amount) & (s > -np.inf)))
        count = min(max(count, policy.min_blocks), policy.max_blocks, len(order))
        out[index][order[:count]] = True
        out[index][forced] = True
    return out
