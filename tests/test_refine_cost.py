"""bench/refine_cost.py's counting on a small pattern, in a fresh process (libtpu must start
with the bundle-dump flags): every XLA program of the v6e compile is counted, and its ops are
attributed to the refine.py functions that emitted them; the transpose form of the
temporal-major permutation equals the layout's. No timing is asserted."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers import REPO

CHECK = textwrap.dedent(
    """
    import sys, types
    sys.path.insert(0, "bench")
    import refine_cost as rc
    import numpy as np
    from svgen.analysis.classify import TileGrid
    from svgen.analysis.tables import build_runs, kernel_tiles
    from svgen.core.layout import TokenLayout
    from svgen.core.tables import KernelShape

    for text_tokens, position in [(0, "last"), (8, "first"), (8, "last")]:
        lay = TokenLayout(5, 4, 8, text_tokens, position).with_order("temporal_major", 1)
        ids = np.arange(lay.seq_len)
        assert np.array_equal(rc._temporal_major(ids, lay), lay.original_index(ids))

    layout = TokenLayout(4, 4, 8).with_order("temporal_major", 1)  # 128 tokens
    seq, block, compute = layout.seq_len, 32, 16
    rng = np.random.default_rng(0)
    kinds = rng.choice(3, size=(seq // compute, seq // compute)).astype(np.int8)
    grid, blocks = TileGrid(seq, block, block), TileGrid(seq, compute, compute)
    runs = build_runs(*kernel_tiles(kinds, grid, blocks), grid)
    shape = KernelShape(seq, seq, block, block, 128, 1, compute, compute)
    module = types.SimpleNamespace(
        SHAPE=shape, SLOTS_PER_PIECE=2, _PATTERNS=[types.SimpleNamespace(runs=runs, layout=layout)]
    )
    visits = rc.pattern_visits(module)
    ids = rc.jax.ShapeDtypeStruct(
        (seq,), rc.jnp.int32, sharding=rc.tpu_schedule.tpu_sharding(rc.TARGET)
    )
    for how in ("gather", "transpose"):
        dumps, compiled = rc._compile_dumps(rc.call_tables(module, visits, how), ids, target="v6e")
        stages = rc.op_stages(compiled.as_text())
        counted = {name: rc.op_cycles(text)[0] for name, text in dumps.items()}
        assert all(c is not None for c in counted.values()), counted
        seen = {stages[n.split("#")[0]][1] for n in dumps if n.split("#")[0] in stages}
        for stage in ("block_segment_ranges", "segment_words", "refine / _scatter"):
            # A stage, or a function it calls (segment_words / segment_block_kinds).
            assert any(s == stage or s.startswith(stage + " / ") for s in seen), (how, stage, seen)
        assert rc.PERMUTE_STAGE in seen, (how, seen)
        print(how, sum(counted.values()), len(dumps))
    """
)


def test_refinement_programs_are_counted_and_attributed():
    result = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=600, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.split("\n")
    assert [line.split()[0] for line in lines if line] == ["gather", "transpose"]
