"""A block mask given as data (the `blocks` primitive): its node, `BlockData`, and the
opaque boolean `BlockBit` the predicate algebra sees of it."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib

import numpy as np
import sympy

from svgen.spec.expr import SYMBOLS
from svgen.spec.quoting import safe_text

from svgen.ir.facts import NodeFacts

_S = SYMBOLS


class BlockBit(sympy.logic.boolalg.BooleanFunction):
    """keep(q, k) of a block mask given as data, as the predicate algebra sees it: an opaque
    boolean of (i_q, i_k, block, tag), tag naming the array (its digest's first 48 bits); i
    stands for the kernel position here, which the predicate language cannot name. Nothing
    simplifies through it; svgen.analysis reads BlockData nodes, not this."""

    nargs = 4

    @classmethod
    def eval(cls, *args):
        return None


@dataclasses.dataclass(frozen=True)
class BlockData(NodeFacts):
    """A block mask given as data (the `blocks` primitive): keep(q, k) = bits[p_q // block,
    p_k // block], p the token's position in the head's kernel order (the order its layout
    runs it in, `token_order="kernel"`: the user's order for frame_major), bits read from
    `file` (checked by svgen.spec.block_data; equal nodes have equal files by digest)."""

    file: str
    block: int
    head: int | None
    array: str | None
    digest: str
    bits: np.ndarray = dataclasses.field(compare=False, hash=False, repr=False)

    @classmethod
    def from_term(cls, term, spec) -> "BlockData":
        """The node of a spec's `blocks` term: its file read and checked now, a SpecError at
        the term's location when the file is wrong."""
        from svgen.spec.block_data import BlockDataError, load
        from svgen.spec.errors import SpecError

        file, block = term.param("file"), term.param("block")
        head, array = term.param("head"), term.param("array")
        where = term.where
        try:
            data = load(
                file, block, head, array, spec.geometry.seq_len, where.file if where else None
            )
        except BlockDataError as exc:
            location = (
                {}
                if where is None
                else {
                    "file": where.file,
                    "line": where.line,
                    "column": where.column,
                    "key": where.key,
                }
            )
            raise SpecError(str(exc), **location) from None
        return cls(file, block, head, array, data.digest, data.bits)

    @property
    def tag(self) -> str:
        """The table's short name in generated code: the file's digest's first 12 hex
        digits, the block size, and which head's array (and which .npz member) it is."""
        tag = f"{self.digest[:12]}_{self.block}"
        if self.head is not None:
            tag += f"_h{self.head}"
        if self.array is not None:
            tag += "_a" + hashlib.sha256(self.array.encode()).hexdigest()[:6]
        return tag

    def evaluate(self, q, k):
        return self.bits[q.position // self.block, k.position // self.block]

    def predicate(self):
        return BlockBit(
            _S["i_q"],
            _S["i_k"],
            sympy.Integer(self.block),
            sympy.Integer(int(self.digest[:12], 16)),
        )

    @property
    def shown_file(self) -> str:
        """How generated modules and reports name the file: as the spec gave it when
        relative, by its name alone when absolute (a module must not depend on where it was
        compiled; its sha256 names the content), through safe_text (a file name is never
        code)."""
        path = pathlib.PurePath(self.file)
        return safe_text(path.name if path.is_absolute() else self.file)

    def describe(self):
        which = "" if self.head is None else f", head {self.head}"
        name = "" if self.array is None else f", array {safe_text(self.array)}"
        return (
            f"blocks of {self.block} tokens from {self.shown_file}{name}{which} "
            f"(sha256 {self.digest[:12]}), {int(self.bits.sum()):,} of {self.bits.size:,} kept"
        )
