"""Block masks given as data (`blocks`): the kernels and calls that read them, and their
kernel tables' size, checked before anything is classified."""

from __future__ import annotations

import numpy as np

from svgen.analysis.classify import TileGrid
from svgen.core.tables import block_table_shape
from svgen.spec import Spec
from svgen.spec.errors import SpecError


def check_block_masks(run) -> None:
    """Pass: the spec's block masks run where it asks (the backend's kernel, its calls) and
    their tables fit MAX_BLOCK_TABLE_BYTES."""
    _check_block_masks(run.spec, run.backend.refuses_block_data(), run.settings.block_table_bytes)


def _check_block_masks(spec: Spec, backend_refusal: str | None, max_bytes: int) -> None:
    """Block masks given as data (`blocks`) run in the TPU kernels over the module's own
    tables, forward and backward; the calls that build their tables on the device (run-time
    segments, KV-cache chunks, selections) and the GPU kernel do not read them yet
    (backend_refusal: the backend's kernel in words where it does not)."""
    term = _first_blocks_term(spec)
    if term is None:
        return
    where = (
        {}
        if term.where is None
        else {
            "file": term.where.file,
            "line": term.where.line,
            "column": term.where.column,
            "key": term.where.key,
        }
    )
    refused = [
        (backend_refusal is not None, backend_refusal),
        (spec.runtime.any, "runtime: (packed videos, text lengths or frame offsets)"),
        (bool(spec.runtime.kv_cache), "runtime.kv_cache"),
        (spec.select is not None, "select"),
    ]
    for found, what in refused:
        if found:
            raise SpecError(
                f"a block mask given as data (blocks) does not run with {what} yet; it runs in "
                "the TPU kernels' static tables, forward and backward (docs/limits.md)",
                **where,
            )
    _check_block_table_size(spec, where, max_bytes)


def _check_block_table_size(spec: Spec, where: dict, max_bytes: int) -> None:
    """The kernels' table of each block mask (svgen.core.tables.block_table_shape) within
    MAX_BLOCK_TABLE_BYTES (`max_bytes`), before any table is built: small blocks over a long
    sequence make a table of many data blocks per compute block."""
    t = spec.tiling
    grid = TileGrid(spec.geometry.seq_len, t.block_q, t.block_kv)
    for term in _blocks_terms(spec):
        shape = block_table_shape(
            term.param("block"),
            t.cq,
            t.ckv,
            grid.num_q_blocks,
            grid.num_kv_blocks,
            t.block_q,
            t.block_kv,
        )
        size = 2 * int(np.prod(shape))  # bf16 on the device
        if size > max_bytes:
            raise SpecError(
                f"blocks of {term.param('block')} tokens make a kernel table of "
                f"{' x '.join(map(str, shape))} ({size:,} bytes), over the "
                f"{max_bytes:,} allowed (MAX_BLOCK_TABLE_BYTES): use larger blocks, "
                "or compute blocks nearer their size",
                **where,
            )


def _first_blocks_term(spec: Spec):
    """The first `blocks` term of the spec's masks (its mask, then its patterns), or None."""
    return next(iter(_blocks_terms(spec)), None)


def _blocks_terms(spec: Spec) -> list:
    """The `blocks` terms of the spec's masks (its mask, its patterns, a selection's
    candidate), depth first."""
    roots = ([spec.mask] if spec.mask is not None else []) + [t for _, t in spec.patterns]
    if spec.select is not None:
        roots.append(spec.select.candidate)
        roots.extend(own.candidate for own in spec.select.patterns)
    stack, found = list(reversed(roots)), []
    while stack:
        term = stack.pop()
        if term.op == "blocks":
            found.append(term)
        stack.extend(reversed(term.children))
    return found
