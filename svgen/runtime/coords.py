"""Token coordinates inside a kernel, decoded from kernel positions under a layout (the orders
themselves, and the permutations into and out of kernel order: svgen/core/layout.py).

A boundary tile decides keep(q, k) from coordinates: the generated predicate reads
`q.frame`, `k.row`, ... and only what it reads is computed (cached properties are traced
lazily), so a band mask never pays for frame/row/column decoding.

Integer division uses `lax.div` / `lax.rem` on values made non-negative first: jnp's `//` and
`%` lower through `sign`, whose Mosaic rule asks the default device for its chip and fails when
compiling for TPU from a CPU host.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax

from svgen.core.layout import TokenLayout


class TokenCoords:
    """Coordinates of kernel positions `pos` (an int32 array) under `layout`.

    Text tokens have frame = row = col = place = 0 (the documented `expr` semantics); built-in
    primitives always test `is_text` first. `index` is the position in the nominal order
    (temporal_major: p*T + f for video; tiled: the kernel position); `place` = row * width +
    col.
    """

    def __init__(self, pos, layout: TokenLayout, tables=None):
        self._pos = pos
        self.layout = layout
        # Block masks given as data, by tag (refs in a kernel, arrays elsewhere): what a
        # generated mask's coords.block_bits reads through its key coordinates.
        self.tables = {} if tables is None else tables

    def _out(self, value):
        """How a coordinate leaves this object (QueryCoords turns rows into columns)."""
        return value

    def once(self, function):
        """function(self): a value of these coordinates alone that a generated mask reads
        through here (codegen's query functions, such as a coords.fields packing), so that
        the forward kernel, whose query coordinates are decoded once per q tile, computes it
        there once instead of on every block (svgen.runtime.forward); here, computed now."""
        return function(self)

    @property
    def pos(self):
        """The kernel positions themselves (in this object's output orientation)."""
        return self._out(self._pos)

    # -- public coordinates ---------------------------------------------------------------
    @functools.cached_property
    def is_text(self):
        return self._out_bool(self._is_text)

    @functools.cached_property
    def is_text_int(self):
        return self._out(self._is_text.astype(jnp.int32))

    @functools.cached_property
    def frame(self):
        if self.layout.curve_over_video:
            self._not_decoded("frames")
        return self._out(self._zero_for_text(self._frame_place[0]))

    @functools.cached_property
    def row(self):
        self._not_decoded("rows and columns")
        if self.layout.is_tiled:
            return self._out(self._zero_for_text(self._tiled[1]))
        return self._out(self._zero_for_text(lax.div(self._frame_place[1], self.layout.width)))

    @functools.cached_property
    def col(self):
        self._not_decoded("rows and columns")
        if self.layout.is_tiled:
            return self._out(self._zero_for_text(self._tiled[2]))
        return self._out(self._zero_for_text(lax.rem(self._frame_place[1], self.layout.width)))

    @functools.cached_property
    def place(self):
        self._not_decoded("rows and columns")
        return self._out(self._zero_for_text(self._frame_place[1]))

    @functools.cached_property
    def index(self):
        """Position in the layout's nominal order."""
        lay = self.layout
        if not lay.is_temporal_major:
            return self._out(self._pos)
        frame, place = self._frame_place
        nominal = lay.video_start + place * lay.frames + frame
        return self._out(
            nominal if lay.text_tokens == 0 else jnp.where(self._is_text, self._pos, nominal)
        )

    def _out_bool(self, value):
        return self._out(value)

    def _not_decoded(self, what: str):
        """A curve layout's rows and columns (over the whole video, its frames too) are not
        decoded in the kernel (svgen.core.layout): the analysis refuses masks that read them,
        so reaching this is a bug."""
        if self.layout.curve:
            raise NotImplementedError(
                f"a {self.layout.curve} curve layout's {what} are not decoded"
            )

    # -- decoding, in the orientation `pos` came in ------------------------------------------
    @functools.cached_property
    def _is_text(self):
        lay = self.layout
        if lay.text_tokens == 0:
            return jnp.zeros_like(self._pos, dtype=jnp.bool_)
        start = lay.video_start
        return (self._pos < start) | (self._pos >= start + lay.video_tokens)

    @functools.cached_property
    def _video_offset(self):
        lay = self.layout
        # Clamped so that text positions decode to a valid (if meaningless) video offset and
        # lax.div/rem only ever see non-negative operands.
        return jnp.clip(self._pos - lay.video_start, 0, lay.video_tokens - 1)

    @functools.cached_property
    def _frame_place(self):
        """(frame, place p = h*W + w) of the video offset, in this layout's kernel order."""
        lay = self.layout
        s, v = lay.tokens_per_frame, self._video_offset
        if lay.is_tiled:
            frame, row, col = self._tiled
            return frame, row * lay.width + col
        if not lay.is_temporal_major or lay.main_frames == 0:
            return lax.div(v, s), lax.rem(v, s)
        t = lay.main_frames
        main = jnp.maximum(v - lay.anchor_frames * s, 0)
        frame = lay.anchor_frames + lax.rem(main, t)
        place = lax.div(main, t)
        if lay.anchor_frames:
            in_anchor = v < lay.anchor_frames * s
            frame = jnp.where(in_anchor, lax.div(v, s), frame)
            place = jnp.where(in_anchor, lax.rem(v, s), place)
        return frame, place

    @functools.cached_property
    def _tiled(self):
        """tiled: (frame, row, col) of the video offset, level by level as
        TokenLayout.tiled_coordinates peels them. Each level divides by a unit size that
        depends on whether the enclosing groups are the last, partial ones; only constant
        divisors are used (one division per case, then a select), and no select at all on an
        axis the cube divides."""
        lay = self.layout
        (a, b, c), big_w = lay.cube, lay.width
        sizes = [(a, lay.frames), (b, lay.height), (c, big_w)]

        def unit(n: int, size: int, last: bool) -> int:  # an axis group's extent
            return size - (-(-size // n) - 1) * n if last else n

        def last_group(group, n: int, size: int):  # None: the axis has no partial group
            return None if size % n == 0 else group == (-(-size // n) - 1)

        def extent(axis: int, flag):
            full, partial = unit(*sizes[axis], False), unit(*sizes[axis], True)
            return full if flag is None else jnp.where(flag, partial, full)

        v = self._video_offset
        gf = lax.div(v, a * lay.tokens_per_frame)
        v = v - gf * (a * lay.tokens_per_frame)
        last_f = last_group(gf, a, lay.frames)
        gh = _cases(lax.div, v, lambda f: unit(a, lay.frames, f) * b * big_w, [last_f])
        v = v - gh * (extent(0, last_f) * (b * big_w))
        last_h = last_group(gh, b, lay.height)

        def cube_units(f, h):
            return unit(a, lay.frames, f) * unit(b, lay.height, h) * c

        gw = _cases(lax.div, v, cube_units, [last_f, last_h])
        v = v - gw * (extent(0, last_f) * extent(1, last_h) * c)
        last_w = last_group(gw, c, big_w)

        def slice_units(h, w):
            return unit(b, lay.height, h) * unit(c, big_w, w)

        df = _cases(lax.div, v, slice_units, [last_h, last_w])
        v = v - df * (extent(1, last_h) * extent(2, last_w))
        dh = _cases(lax.div, v, lambda w: unit(c, big_w, w), [last_w])
        dw = v - dh * extent(2, last_w)
        return gf * a + df, gh * b + dh, gw * c + dw

    def _zero_for_text(self, value):
        if self.layout.text_tokens == 0:
            return value
        return jnp.where(self._is_text, 0, value)


def _cases(op, x, operand, flags, chosen=()):
    """op(x, operand(*flag values)) element by element, each flag (a bool array, or None for
    never) selecting its case: one op per combination of the flags given, with constant
    operands (Mosaic divides by constants, not by vectors)."""
    if len(chosen) == len(flags):
        return op(x, operand(*chosen))
    off = _cases(op, x, operand, flags, chosen + (False,))
    if flags[len(chosen)] is None:
        return off
    on = _cases(op, x, operand, flags, chosen + (True,))
    return jnp.where(flags[len(chosen)], on, off)


class QueryCoords(TokenCoords):
    """Query coordinates decoded in row form: positions arrive lane-major, [1, n], and every
    coordinate leaves as a column, [n, 1].

    Why: a [n, 1] int32 array occupies n/8 vregs (one lane of each used), a [1, n] one n/128,
    so the decoding (divisions by constants, clamps, selects) costs 16x fewer VALU ops in row
    form; one transpose per coordinate brings it back (libtpu's v6e schedule: 868 bundles of a
    temporal-major decode of 1024 rows in column form, 151 in row form with the transpose).
    Positions given as a column are used as they are.
    """

    def _out(self, value):
        if value.ndim == 2 and value.shape[0] == 1 and value.shape[1] > 1:
            return jnp.transpose(value)
        return value

    def _out_bool(self, value):
        # Transpose as int32 (the layout Mosaic transposes natively), compare back to bool.
        return self._out(value.astype(jnp.int32)) != 0


def keep(mask, layout: TokenLayout, q_pos, k_pos, tables=()):
    """A generated `boundary_mask(q, k)` evaluated on positions: q_pos [n, 1], k_pos [1, m]
    (the reference and profiling path; the kernel passes precomputed query coordinates).
    tables: the pattern's block masks given as data, as svgen.core.tables.Pattern holds them."""
    by_tag = {tag: BlockTable(jnp.asarray(t), cq, ckv) for tag, t, cq, ckv in tables}
    return mask(TokenCoords(q_pos, layout), TokenCoords(k_pos, layout, by_tag))


@dataclasses.dataclass(frozen=True)
class BlockTable:
    """A block mask given as data, as block_bits reads it: `values` is the whole table,
    [R, C, rq, ck] over the compute blocks of cq x ckv tokens (svgen.codegen.block_table),
    or, in a kernel, one compute block's [rq, ck] piece of it."""

    values: object
    cq: int
    ckv: int


def block_table_inputs(patterns) -> dict:
    """The patterns' block tables as the kernels' `blocks_<tag>` inputs, by name, in the
    order of variant.unique_block_tables (bf16: 0 and 1, what the MXU multiplies)."""
    from svgen.runtime.variant import unique_block_tables

    tables = unique_block_tables(patterns)
    return {f"blocks_{tag}": jnp.asarray(t, jnp.bfloat16) for tag, t in tables.items()}


def block_pieces(refs: dict | None, block, shape, transposed: bool = False) -> dict:
    """The block tables' pieces of one compute block (BlockTable), by tag, from a kernel's
    `blocks_<tag>` refs: block (qi, ki) of a kernel of `shape`, or of the transposed dk/dv
    walk (its qi indexes keys, and its shape's cq is the keys')."""
    if not refs:
        return {}
    if transposed:
        at, cq, ckv = (block.ki, block.qi), shape.ckv, shape.cq
    else:
        at, cq, ckv = (block.qi, block.ki), shape.cq, shape.ckv
    return {tag: BlockTable(ref[at[0], at[1]], cq, ckv) for tag, ref in refs.items()}


def block_bits(q_pos, k_pos, table: BlockTable, block: int):
    """bits[p_q // block, p_k // block] of a block mask given as data, for query positions
    q_pos and key positions k_pos in either orientation ([n, 1] against [1, m], or keys
    down and queries across as the dk/dv walk has them).

    In a kernel, `table` holds the compute block's own piece: the few data blocks its rows
    and keys fall in. A TPU kernel cannot gather, but a one-hot matrix times the piece picks
    rows exactly (one 1 per row, bf16 0/1 products summed in f32): [n, rq] x [rq, ck] gives
    each query's data row, [n, ck] x [ck, m] each key's bit, on the MXU with inner
    dimensions of a few blocks. Elsewhere (profiling, the Splash mask of `svgen bench`) the
    whole table is read by a gather."""
    values, cq, ckv = table.values, table.cq, table.ckv
    q_row = lax.div(q_pos, block) - lax.div(q_pos - lax.rem(q_pos, cq), block)
    k_col = lax.div(k_pos, block) - lax.div(k_pos - lax.rem(k_pos, ckv), block)
    if values.ndim == 4:
        q_block = jnp.minimum(lax.div(q_pos, cq), values.shape[0] - 1)
        k_block = jnp.minimum(lax.div(k_pos, ckv), values.shape[1] - 1)
        return values[q_block, k_block, q_row, k_col] != 0
    piece = values[...].astype(jnp.bfloat16)
    rq, ck = piece.shape
    f32, bf16 = jnp.float32, jnp.bfloat16
    if k_pos.shape[0] == 1:  # queries down, keys across
        q_col = q_row[:, :1]
        pick_rows = (q_col == lax.broadcasted_iota(jnp.int32, (1, rq), 1)).astype(bf16)
        picked = jnp.dot(pick_rows, piece, preferred_element_type=f32).astype(bf16)
        pick_cols = (lax.broadcasted_iota(jnp.int32, (ck, 1), 0) == k_col).astype(bf16)
        return jnp.dot(picked, pick_cols, preferred_element_type=f32) > 0.5
    # keys down, queries across (keep^T of the dk/dv walk)
    k_rows = k_col[:, :1]
    pick_cols = (k_rows == lax.broadcasted_iota(jnp.int32, (1, ck), 1)).astype(bf16)
    picked = lax.dot_general(
        pick_cols, piece, (((1,), (1,)), ((), ())), preferred_element_type=f32
    ).astype(bf16)
    pick_rows = (lax.broadcasted_iota(jnp.int32, (rq, 1), 0) == q_row).astype(bf16)
    return jnp.dot(picked, pick_rows, preferred_element_type=f32) > 0.5


# The int32 sign bit: a + _SIGN - b maps a - b in 0 .. width to _SIGN .. _SIGN + width, the
# smallest int32 values, and any other a - b (in int32) above them, by two's complement wrap.
_SIGN = -(2**31)


def windows(*terms, width: int):
    """0 <= a - b <= width for every (a, b) of `terms`, a a query-side value ([queries, 1])
    and b a key-side one ([1, keys]): the signed maximum over the terms of
    a + _SIGN - b (wrapping) against _SIGN + width, one compare for them all. Per term one
    full-block subtract and one maximum, where a `within` each and an AND between them cost
    one op more per term (the a + _SIGN is on the narrow side). The printer scales a window
    0 <= x <= c to 0 <= m * x <= width (m * c <= width < m * (c + 1): the same integers x)
    so that windows of different widths share one compare, and checks that a - b fits
    int32 over the geometry (svgen/analysis/mask_code.py)."""
    top = None
    for a, b in terms:
        x = (a + _SIGN) - b
        top = x if top is None else jnp.maximum(top, x)
    return top <= _SIGN + width


def pack(*terms):
    """sum value << shift over the (value, shift) of `terms` (int32, wrapping): the bit-field
    packing coords.fields compares, for one side of its terms."""
    packed = 0
    for value, shift in terms:
        packed = packed + (jnp.left_shift(value, shift) if shift else value)
    return packed


def fields(query, *terms):
    """0 <= a_i - b_i < 2^bits_i for every term, with `query` the packing of the a_i (a
    query-side value, [queries, 1]: coords.pack((a_i, shift_i), ...), which the kernel
    computes once per q tile, see TokenCoords.once) and `terms` the (b_i, shift_i, bits_i)
    of the key side ([1, keys]): one subtract, one AND and one compare on every pair,
    ((query - pack(b_i, shift_i)) & clear) == 0 with clear every bit outside the fields'
    kept bits, however many windows, one-sided bounds and equalities (bits 0) the
    conjunction holds (a neighborhood's three axes: three ops where coords.windows costs
    six).

    Why it is exact: the printer gives each field room above its kept bits for every value
    of a - b over the geometry (negative ones included), so the lowest field whose a - b is
    out of range leaves a bit set outside its kept bits, with no borrow from the fields
    below it (they hold values in range), and all the arithmetic is modulo 2^32 (int32
    wraps). Windows 0 <= x <= c are scaled to 0 <= m * x <= 2^bits - 1 (the same integers
    x) by the printer (svgen/analysis/mask_code.py, _field_layout), which also proves the
    room."""
    key = pack(*((b, shift) for b, shift, _ in terms))
    kept = sum(((1 << bits) - 1) << shift for _, shift, bits in terms)
    clear = ~kept & 0xFFFFFFFF
    clear = clear - (1 << 32) if clear >= 1 << 31 else clear  # as the int32 it is
    return ((query - key) & clear) == 0


def same(*terms):
    """a == b for every (a, b, n) of `terms`, a query-side value ([queries, 1]) and b a
    key-side one ([1, keys]), both in [0, n): one compare of their mixed-radix packings
    sum a_i * base_i and sum b_i * base_i (base_i the product of the n before it), built on
    the narrow sides, where a compare each and an AND between them cost two full-block ops
    per term. The printer checks the ranges and that the product of the n fits int32
    (svgen/analysis/mask_code.py)."""
    query, key, base = 0, 0, 1
    for a, b, n in terms:
        query, key, base = query + a * base, key + b * base, base * n
    return query == key


def within(shifted, width: int, unless=None):
    """0 <= shifted <= width, i.e. |x| <= width / 2 for shifted = x + width / 2: one unsigned
    compare (a negative value wraps above any width), two VALU ops per vreg less than
    abs and a signed compare.

    unless: a bool [1, keys] of keys kept whatever shifted is; it clears their bits before
    the compare (0 <= width), one AND per vreg instead of broadcasting the bools and an OR.
    """
    bits = lax.bitcast_convert_type(shifted, jnp.uint32)
    if unless is not None:
        bits = bits & jnp.where(unless, jnp.uint32(0), jnp.uint32(0xFFFFFFFF))
    return bits <= jnp.uint32(width)
