"""Limits on what a spec may ask for, so that no spec file can hang or exhaust the compiler.

Each limit bounds one kind of work that would otherwise grow without bound with a small,
hostile file: YAML aliases expand exponentially, pattern references fan out, a long sum
makes sympy quadratic, deep nesting exhausts Python's stack, huge integers overflow NumPy,
and a huge geometry asks for a dense tile grid that no machine holds. Every value is far
above what a real video model needs (the shipped specs use at most 119,056 tokens, masks
of under 10 nodes and predicates of under 40 tokens), and each one is checked in
:mod:`svgen.spec` (or :mod:`svgen.spec.expr`) before the work it bounds starts, so a spec over a
limit is one :class:`svgen.spec.errors.SpecError` naming the limit, in well under a second.

The analysis's own work (row-set intervals, product box pairs) depends on the mask's terms
and the geometry together, not on the file's size: it is counted while it runs (`Work`),
before each step allocates, and estimated before the classification starts where it can be.

docs/spec.md lists these under "Limits"; change both together.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses

# --------------------------------------------------------------------------- the YAML text

#: Bytes in a spec file. The shipped specs are under 2 KiB.
MAX_SPEC_BYTES = 256 * 1024
#: Nesting of YAML mappings and lists, checked while composing (PyYAML's composer recurses
#: once per level, so without it ~1,000 levels overflow Python's stack). Leaves room for a
#: mask nested MAX_MASK_DEPTH deep through any_of (two YAML levels per mask level).
MAX_YAML_DEPTH = 150
#: YAML nodes once aliases are expanded (each shared node counted as often as it is used,
#: computed without expanding anything): an 849-byte "billion laughs" alias bomb expands
#: to ~10^9 nodes.
MAX_YAML_NODES = 1 << 16

# --------------------------------------------------------------------------- sizes and numbers

#: Tokens in a sequence (frames x height x width + text_tokens): bounds every coordinate
#: and every array the analysis builds per row or per key. 2.6x the 1.6M-token 2K video of
#: bench/compile_speed.py; at this length MAX_TILE_PAIRS asks for compute blocks of at
#: least 1024 x 1024.
MAX_SEQ_LEN = 1 << 22
#: The largest value of any integer parameter of a mask primitive (frames, rows, cols,
#: stride, width, tokens): a value past the sequence length means the same as the sequence
#: length, and the bound keeps the kernel's int32 index arithmetic far from overflow.
MAX_PARAM = MAX_SEQ_LEN
#: attention.heads.
MAX_HEADS = 1024
#: Compute-block pairs the analysis classifies, over all candidate patterns together:
#: ceil(N / compute_q) x ceil(N / compute_kv) x candidates. The analysis keeps one byte per
#: pair (a dense tile grid), so this caps that grid at 16 MiB; a long sequence needs larger
#: compute blocks.
MAX_TILE_PAIRS = 1 << 24
#: Row-set work of the analysis, over all candidate patterns together: the intervals of
#: allowed keys it builds per query row for the masks the per-axis analysis does not take
#: (band, prefix, `expr`, unions of more than 64 terms once expanded), counted at every step
#: that builds them (svgen.analysis.rowsets; about 10-16M a second). The node limits do not
#: bound it: 250 windows in one any_of at 115,200 tokens need 1.7*10^9 (4.5 minutes, 4.7
#: GB), a band and whole-frame windows in 6 x 8 x 8 cubes at 1.74M tokens 2.2*10^9.
#: Estimated from sampled rows before the classification starts (a spec over it is refused
#: in about a second), and enforced while it runs at ROW_SET_BACKSTOP times this
#: (svgen.analysis). The shipped specs need at most 0.7M, the bench's `expr` window of whole
#: tiles at 1.74M tokens 33M, STA's cube window with a prefix anchor in 6 x 8 x 8 cubes at
#: 1.74M tokens 162M (10 s).
MAX_ROW_SET_WORK = 1 << 28
#: Work of the per-axis (product) analysis, over all candidate patterns together, per term
#: of the mask's inclusion-exclusion sum (at most svgen.analysis.product's MAX_TERMS): box
#: pairs counted, plus each query box's reach along every axis value. It grows with the
#: boxes a tile breaks into (many small cubes of a ragged tiled layout) and the terms (six
#: per-axis primitives in one any_of make 63): at 1.74M tokens, six such terms in 5 x 7 x 11
#: cubes need ~2.4*10^9 (four minutes). Each level of the coarse-to-fine classification is
#: refused before it starts when its bound (the children of BOUNDARY blocks) would pass
#: this. The shipped specs need at most 5M; the bench's 1.74M-token cases 21M; a 3-D window
#: and a cube window in those ragged cubes at 1.74M tokens 120M.
MAX_PRODUCT_WORK = 1 << 28

# --------------------------------------------------------------------------- masks

#: Length of a spec or pattern name (it becomes a Python module or identifier).
MAX_NAME_LEN = 64
#: Named patterns in one spec (each candidate is analyzed on its own).
MAX_PATTERNS = 64
#: Nesting of one mask (any_of / all_of / not / ref levels), counting the levels of the
#: patterns that refs name: every pass over a mask recurses once per level.
MAX_MASK_DEPTH = 64
#: Size of one mask once refs are expanded: one per primitive or combinator, and one per
#: token for an `expr`. Every pass over a mask (lowering, row bounds, evaluation) visits the
#: expanded tree, so a few lines of refs that each name the next pattern twice would
#: otherwise ask for 2^n nodes.
MAX_MASK_SIZE = 512

# --------------------------------------------------------------------------- expr predicates

#: Characters in one `expr` (checked before tokenizing).
MAX_EXPR_CHARS = 4096
#: Tokens in one `expr`: sympy builds sums term by term (quadratic), and the analysis
#: evaluates the predicate on up to 2^26 undecided pairs.
MAX_EXPR_TOKENS = 256
#: Nesting of parentheses, function calls, `not` and unary signs in one `expr` (the parser
#: recurses about ten Python frames per level).
MAX_EXPR_DEPTH = 32
#: The largest integer literal in an `expr`: the kernel evaluates predicates in int32.
MAX_EXPR_LITERAL = 2**31 - 1


# --------------------------------------------------------------------------- analysis work


class WorkOverLimit(Exception):
    """A step of the analysis would have taken its `Work` past the budget (it did not run)."""

    def __init__(self, work: "Work", used: int):
        super().__init__(f"{work.name}: {used:,} units of work, over the budget")
        self.work, self.used = work, used


@dataclasses.dataclass
class Budget:
    limit: int
    used: int = 0


class Work:
    """One kind of analysis work, bounded while it runs: a step `charge`s what it is about to
    build before it allocates it, and inside `budget(n)` the charge that passes n raises
    WorkOverLimit. Outside any budget nothing is counted (tests and benchmarks call the
    analysis functions unbounded; `svgen.analysis.analyze` sets the budgets)."""

    def __init__(self, name: str):
        self.name = name
        self._current: contextvars.ContextVar[Budget | None] = contextvars.ContextVar(
            name, default=None
        )

    @contextlib.contextmanager
    def budget(self, limit: int):
        """Count the work inside against `limit` (an inner budget shadows an outer one)."""
        budget = Budget(limit)
        token = self._current.set(budget)
        try:
            yield budget
        finally:
            self._current.reset(token)

    def current(self) -> Budget | None:
        return self._current.get()

    def charge(self, amount) -> None:
        budget = self._current.get()
        if budget is not None:
            budget.used += int(amount)
            if budget.used > budget.limit:
                raise WorkOverLimit(self, budget.used)


#: Counted by svgen.analysis.rowsets (intervals built), against MAX_ROW_SET_WORK.
ROW_SET_WORK = Work("MAX_ROW_SET_WORK")
#: Counted by svgen.analysis.product (box pairs and reach, times terms), against
#: MAX_PRODUCT_WORK.
PRODUCT_WORK = Work("MAX_PRODUCT_WORK")
#: Nodes of a predicate's sympy tree once boolean == / != are expanded (each repeats both of
#: its sides, so nesting them doubles the tree per level: 16 levels in 131 tokens made 409,590
#: nodes). Four times MAX_EXPR_TOKENS: an equality between two halves of a predicate of the
#: token limit, nested once more, still fits.
MAX_EXPR_NODES = 4 * MAX_EXPR_TOKENS

# Block masks given as data (`blocks`): the file, the array read from it and the table the
# kernels keep of it. A path past MAX_PATH_CHARS is refused before the file system sees it; a
# file past MAX_BLOCK_FILE_BYTES before it is read; an array past MAX_BLOCK_ENTRIES (per head
# array: 4,096 x 4,096 blocks) before its data is read. The kernels' table holds, per compute
# block, the data blocks it spans (svgen.core.tables.block_table_shape: 8 x 8 at least, bf16 in
# HBM, a .npy of half that beside the module); MAX_BLOCK_TABLE_BYTES caps it before it is built
# (75,600 tokens in 64-token blocks at 512 x 512 compute blocks: 2.9 MB).
MAX_PATH_CHARS = 1024
MAX_BLOCK_FILE_BYTES = 256 << 20
MAX_BLOCK_ENTRIES = 1 << 24
MAX_BLOCK_TABLE_BYTES = 64 << 20
