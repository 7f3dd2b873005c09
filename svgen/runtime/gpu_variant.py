"""The GPU forward kernel declared once: every static choice of one `svgen_gpu_attention`
kernel (svgen.runtime.gpu) as one frozen object, NumPy only, as `ForwardVariant` is for the
TPU kernel (svgen.runtime.variant).

From a `GpuVariant` follow

* the kernel's operands in pallas_call order (`operands`): the tables, q, k, v, the run-time
  ids or a chunk's per-row scalars, and o, each by name and with the index map that places its
  block. The kernel unpacks its refs by these names (`unpack`) and the call builder makes its
  BlockSpecs from the same list, so the two cannot drift apart;
* the branches of the kernel's per-entry `lax.switch`, by name and in order (`branches`):
  the kernel resolves each name to its score transform, and picks one by `branch_of`.

A new GPU kernel path is a field here, its operands or branch names below, and its phase
function in svgen.runtime.gpu.
"""

from __future__ import annotations

import dataclasses

from svgen.runtime.variant import Operand, PatternCode, Tables, named_refs

# Branch names of the per-entry switch (see GpuVariant.branches).
FULL = "full"
FULL_PADDING = "full_padding"  # a FULL tile reaching past seq_len: only k < seq_len
SEGMENT = "segment:"  # prefix: the branch again, with the run-time ids compared


def boundary(pattern: int) -> str:
    """The branch of a BOUNDARY tile under pattern `pattern`: its mask and k < seq_len."""
    return f"boundary[{pattern}]"


@dataclasses.dataclass(frozen=True)
class GpuVariant:
    """Every static choice of one GPU forward kernel: what its body traces and its call
    passes. rows: the call's rows (batch x heads); seq_len: the keys (a rolling cache's
    length); q_len: the query rows of q and o (a chunk's, else seq_len); tables: where the
    CSR tables come from (svgen.runtime.variant.Tables); frame_shifts: run-time segments
    with per-video frames (a third id input: each token's frame shift; the tables are then
    the patterns' supersets, so every visited tile is masked); ring_sink: a chunk against a
    rolling cache whose sink ends at this token."""

    patterns: tuple[PatternCode, ...]
    heads: int
    rows: int
    seq_len: int
    q_len: int
    head_dim: int
    block_q: int
    block_kv: int
    num_q_tiles: int
    q_scale: float  # sm_scale * log2(e): q is scaled by it once per q tile
    tables: Tables = "static"
    frame_shifts: bool = False
    ring_sink: int | None = None

    def __post_init__(self):
        if self.frame_shifts and self.tables != "segments":
            raise ValueError("per-video frame shifts come with run-time segments only")
        if self.ring_sink is not None and self.tables != "chunk":
            raise ValueError("a rolling cache's sink comes with a chunk's call only")

    # ---------------------------------------------------------------- derived choices
    @property
    def segments(self) -> bool:
        return self.tables == "segments"

    @property
    def chunk_rows(self) -> int:
        """A chunk's rows (0: not a chunk's call)."""
        return self.rows if self.tables == "chunk" else 0

    @property
    def per_row(self) -> int:
        """A selection's per-row CSR tables over that many rows (0: per-pattern tables)."""
        return self.rows if self.tables == "selection" else 0

    @property
    def pads_last_tile(self) -> bool:
        """Whether the last kv tile holds padding keys (past seq_len)."""
        return self.seq_len % self.block_kv != 0

    # ---------------------------------------------------------------- operands
    def operands(self) -> tuple[Operand, ...]:
        """Every ref of the kernel in pallas_call order. Index maps: `whole` (a table, the
        same block for every program), `q_rows` and `head_rows` (the program's row of q or
        o, and of k or v: [row, tokens, d]), `id_rows` (the row's ids, [row, seq_len])."""
        d = self.head_dim
        q_rows = (None, self.q_len, d)
        operands = [
            Operand("head_pattern", "input", "whole"),
            Operand("offsets", "input", "whole"),
            Operand("entries", "input", "whole"),
            Operand("q", "input", "q_rows", q_rows),
            Operand("k", "input", "head_rows", (None, self.seq_len, d)),
            Operand("v", "input", "head_rows", (None, self.seq_len, d)),
        ]
        if self.segments:
            ids = ["q_ids", "k_ids"] + (["frame_shifts"] if self.frame_shifts else [])
            operands += [Operand(n, "input", "id_rows", (None, self.seq_len)) for n in ids]
        if self.chunk_rows:  # per row: its table pattern, first token (and ring scalars)
            operands.append(Operand("chunk", "input", "whole"))
        operands.append(Operand("o", "output", "q_rows", q_rows))
        return tuple(operands)

    def unpack(self, refs) -> "GpuRefs":
        """The kernel body's refs by name (GpuRefs), in the order of `operands`."""
        _, named = named_refs("GPU", self.operands(), refs)  # no scalar operands on GPU
        return GpuRefs(**named)

    # ---------------------------------------------------------------- branches
    def branches(self) -> tuple[str, ...]:
        """The per-entry switch's branches in order: FULL (no mask at all), [FULL_PADDING,]
        one BOUNDARY branch per pattern (each evaluating only its own mask); with run-time
        segments each of those again, prefixed SEGMENT, for a tile not inside one segment."""
        plain = [FULL] + ([FULL_PADDING] if self.pads_last_tile else [])
        plain += [boundary(p) for p in range(len(self.patterns))]
        if self.segments:
            return (*plain, *(SEGMENT + name for name in plain))
        return tuple(plain)

    @property
    def first_boundary(self) -> int:
        """The index of boundary(0) among `branches`."""
        return self.branches().index(boundary(0))


@dataclasses.dataclass(frozen=True)
class GpuRefs:
    """The GPU kernel's refs by name (GpuVariant.operands); those its variant does not declare
    are None."""

    head_pattern: object
    offsets: object
    entries: object
    q: object
    k: object
    v: object
    o: object
    q_ids: object = None
    k_ids: object = None
    frame_shifts: object = None
    chunk: object = None
