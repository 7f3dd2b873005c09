"""The forward kernel declared once (svgen.runtime.variant): the kernel unpacks its refs by the
variant's names and the call builder passes exactly the variant's operands; the branches the
cost model reads come from the variant for each source of tables; the cost cache key covers
every module the kernels import."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import pytest

from svgen.estimate import measure
from svgen.runtime import backward, branch_tree, forward
from svgen.runtime.variant import BackwardVariant, ForwardVariant, TableWalk, backward_branches

from backend_helpers import record_kernel_variants
from helpers import REPO, run_python, straight_band

BAND = straight_band("variant_band")


def _variant(module, **fields) -> ForwardVariant:
    walk = TableWalk(2, None, has_lengths=False, has_blocks=True, flat=False, per_row=True)
    base = dict(
        shape=module.SHAPE,
        patterns=tuple(module.attention.codes),
        walk=walk,
        tables="static",
        num_tables=4,
        dtype="float32",
        q_scale=0.125,
    )
    return ForwardVariant(**{**base, **fields})


def test_operands_are_named_in_call_order_and_unpacked_by_name(compile_text):
    _, module = compile_text(BAND)
    bounded = dataclasses.replace(module.SHAPE, bounded_softmax=True)
    variant = _variant(
        module, shape=bounded, tables="segments", id_rows=1, with_lse=True, with_modes=True
    )
    names = [o.name for o in variant.operands()]
    assert names == (
        ["table0", "table1", "table2", "table3", "q", "k", "v", "key_bound", "q_ids", "kv_ids"]
        + ["o", "lse", "modes", "m", "acc", "q_scaled", "coords", "mode"]
    )  # no l: the row sum rides on the MXU at head_dim 128
    refs = variant.unpack([f"ref {name}" for name in names])
    assert (refs.q, refs.kv_ids, refs.lse, refs.mode) == (
        "ref q",
        "ref kv_ids",
        "ref lse",
        "ref mode",
    )
    assert refs.tables == ("ref table0", "ref table1", "ref table2", "ref table3")
    assert refs.l is None and refs.coords == "ref coords"
    with pytest.raises(ValueError, match="got 17 refs, its variant declares 18"):
        variant.unpack(names[:-1])
    plain = _variant(module)
    assert [o.name for o in plain.operands()][4:] == [
        "q",
        "k",
        "v",
        "o",
        "m",
        "acc",
        "q_scaled",
        "coords",
    ]


def test_the_call_passes_the_kernel_exactly_its_variants_operands(compile_text, monkeypatch):
    _, module = compile_text(BAND)
    seen = record_kernel_variants(monkeypatch, forward, "_attention_kernel")
    x = jax.ShapeDtypeStruct((2, module.SEQ_LEN, 128), jnp.float32)

    def loss(q, k, v):
        return jnp.sum(module.attention(q, k, v))

    jax.make_jaxpr(jax.grad(loss))(x, x, x)
    (variant, count), *_ = seen
    assert count == len(variant.operands()) and variant.with_lse
    assert variant.tables == "static" and variant.branches.straight[0]


@pytest.mark.parametrize("fused", [True, False])
def test_the_backward_kernels_get_exactly_their_variants_operands(compile_text, monkeypatch, fused):
    _, module = compile_text(BAND)
    calls = record_kernel_variants(monkeypatch, backward, "_dq_kernel", "_dkv_kernel")
    monkeypatch.setattr(backward, "FUSED_DQ", fused)
    x = jax.ShapeDtypeStruct((2, module.SEQ_LEN, 128), jnp.float32)
    jax.make_jaxpr(jax.grad(lambda q, k, v: jnp.sum(module.attention(q, k, v))))(x, x, x)
    seen = {variant.kernel: (variant, count) for variant, count in calls}  # the last of each
    assert sorted(seen) == (["dkv"] if fused else ["dkv", "dq"])
    for variant, count in seen.values():
        assert count == len(variant.operands())
    dkv = seen["dkv"][0]
    assert dkv.fused_dq == fused and (dkv.shape.block_q, dkv.shape.block_kv) == (512, 256)
    names = [o.name for o in dkv.operands() if o.role != "scalar"]
    assert names[:6] == ["k", "v", "q", "do", "lse", "delta"]  # keys are the walk's rows
    assert ("dq_hbm" in names) == fused and ("dq_sems" in names) == fused


def test_backward_refs_by_name(compile_text):
    _, module = compile_text(BAND)
    walk = TableWalk(2, None, has_lengths=False, has_blocks=True, flat=False, per_row=True)
    variant = BackwardVariant(
        "dkv", module.SHAPE, tuple(module.attention.codes), walk, 3, 0.1, True, id_rows=2
    )
    names = [o.name for o in variant.operands()]
    refs = variant.unpack(names)
    assert refs.id_refs == ("row_ids", "col_ids") and refs.dq_hbm == "dq_hbm"
    assert refs.tables == ("table0", "table1", "table2") and refs.dq is None
    # the two ids blocks are two rows high (ids and per-video frame shifts)
    assert {o.block[1] for o in variant.operands() if o.name.endswith("_ids")} == {2}
    with pytest.raises(ValueError, match="the dkv kernel got"):
        variant.unpack(names[1:])


def test_branches_follow_the_source_of_the_tables(compile_text):
    _, module = compile_text(BAND)
    static = module.attention.forward_branches("static")
    assert static.straight[0] and static.phases() == ("full", "mixed[0]")
    for source in ("segments", "chunk", "selection"):
        # a call's own tables may hold any word: no straight bodies, no residual variants
        branches = module.attention.forward_branches(source)
        assert branches.straight == ((),) and branches.residuals == (0,)
    assert module.attention.forward_branches("segments").segmented
    selection = module.attention.forward_branches("selection")
    assert selection.padded_column == module.SHAPE.padding_block_column is not None


def test_the_cost_cache_key_covers_every_module_the_kernels_import():
    """Each svgen module that importing the TPU attention loads is in the cache key's sources
    (a fresh process: the suite's own imports would hide a missing one)."""
    script = (
        "import sys, svgen.runtime.kernel; "
        "print('\\n'.join(m for m in sys.modules if m.split('.')[0] == 'svgen'))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = run_python("-c", script, env=env, check=True, cwd=None)
    loaded = {m for m in done.stdout.split() if m != "svgen"}
    sources = {str(p.relative_to(REPO)) for p in measure.kernel_sources()}
    files = {m.replace(".", "/") + ".py" for m in loaded}
    missing = {
        f for f in files if f not in sources and f.replace(".py", "/__init__.py") not in sources
    }
    assert not missing, missing
    assert "svgen/runtime/variant.py" in sources and "svgen/core/vmem.py" in sources


def test_the_declared_step_names_every_branch_the_body_emits(compile_text):
    """svgen.runtime.branch_tree.step: the tree svgen.estimate.paths reads, each branch by name
    (tests/test_paths.py reads schedules laid out from it)."""
    _, module = compile_text(BAND)
    shape = module.SHAPE
    static = module.attention.forward_branches("static")
    assert static.padding_column == shape.padding_block_column is not None
    init, full, mixed, finalize = branch_tree.step(static)
    assert (init.name, full.name, mixed.name, finalize.name) == (
        "init",
        "full",
        "mixed[0]",
        "finalize",
    )
    words = len(static.straight[0])
    assert [b.name for b in mixed.children] == [f"straight[{i}]" for i in range(words)] + ["blocks"]
    blocks = mixed.children[-1].children
    names = [f"{kind}@{i}" for i in range(shape.compute_blocks) for kind in ("full", "boundary")]
    assert [b.name for b in blocks] == names
    for index in range(shape.compute_blocks):  # the masked body's twins on the padding column
        twins = [b.name for b in blocks[2 * index + 1].children]
        on_padding = index % shape.kv_blocks_per_tile == shape.padding_block_column
        assert twins == (["plain", "padding"] if on_padding else [])
    # a selection's calls: a PADDED branch after the blocks of the padding column, no words
    selection = branch_tree.step(module.attention.forward_branches("selection"))[2].children
    padded = [b.name for b in selection if b.name.startswith("padded@")]
    column = shape.padding_block_column
    assert padded == [
        f"padded@{i}" for i in range(shape.compute_blocks) if i % shape.kv_blocks_per_tile == column
    ]
    # the backward kernels test no padding keys: no twins
    assert backward_branches(shape, 1).padding_column is None
