"""Residual masks (svgen.analysis.residuals): on each BOUNDARY compute block, the mask with
what is decided there folded away; the kernel runs the variant its tables name.

Against the whole mask on every pair of every block that runs a variant, for random masks
(built-ins and user predicates: sums, differences, floor divisions and modulos of shifted
coordinates, min / max / abs, unions and intersections) in all three token orders; the
kernels with variants in NaN-poisoned interpret mode against float64; the tables and the cost
model reading the variant of each block.
"""

import dataclasses

import numpy as np
import pytest

from svgen import ir
from svgen.report import lint
from svgen.analysis import analyze, residuals
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.estimate.cost import PathCosts, model_cycles
from svgen.spec.expr import parse_predicate
from svgen.core.kinds import TileKind
from svgen.core.layout import TokenLayout
from svgen.core.tables import PieceTables, variant_bits
from svgen.spec import SpecError, parse_spec

from helpers import (
    REPO,
    SPECS,
    dense_keep,
    lower_mask_dict,
    random_any_layout,
    random_axis_predicate,
    random_mask,
    random_predicate,
)
from kernel_helpers import POISONED, check_per_head, mixed_inputs
from spec_corpus import any_of, spec_text


@pytest.fixture
def every_variant(monkeypatch):
    """Keep every residual that saves anything, so that small random cases have many."""
    monkeypatch.setattr(residuals, "MIN_SAVED_OPS", 1)
    monkeypatch.setattr(residuals, "MIN_SAVED_SHARE", 0.0)


def _check_variants(mask, layout, grid):
    kinds = classify_tiles(mask, layout, grid).kinds
    found = residuals.analyze(mask, layout, grid, kinds)
    if found is None:
        return 0
    assert 1 <= len(found.variants) <= residuals.MAX_VARIANTS
    assert np.all((found.block_variant == 0) | (kinds == TileKind.BOUNDARY))
    keep = dense_keep(mask, layout)
    checked = 0
    for j, variant in enumerate(found.variants, 1):
        q_blocks, kv_blocks = np.nonzero(found.block_variant == j)
        assert q_blocks.size == variant.blocks > 0
        residual = dense_keep(variant.mask, layout)
        for qb, kb in zip(q_blocks, kv_blocks):
            rows = slice(qb * grid.block_q, (qb + 1) * grid.block_q)
            cols = slice(kb * grid.block_kv, (kb + 1) * grid.block_kv)
            np.testing.assert_array_equal(residual[rows, cols], keep[rows, cols])
            checked += 1
        assert variant.ops < found.mask_ops
    return checked


@pytest.mark.parametrize("seed", range(120))
def test_residuals_agree_with_the_mask_on_their_blocks(seed, every_variant):
    rng = np.random.default_rng(9100 + seed)
    lay = random_any_layout(rng)
    grid = TileGrid(lay.seq_len, int(rng.choice([8, 16])), int(rng.choice([8, 16, 24])))
    draw = rng.random()
    if draw < 0.4:
        _, mask = lower_mask_dict(random_mask(rng, lay), lay, 128, 128)
    else:
        sources = [random_axis_predicate(rng, places=not lay.is_tiled), random_predicate(rng)]
        parts = tuple(ir.Predicate(s, parse_predicate(s)) for s in sources)
        mask = ir.AnyOf(parts) if rng.random() < 0.5 else ir.AllOf(parts)
    _check_variants(mask, lay, grid)


def test_a_radial_mask_runs_one_window_per_block(every_variant):
    """Frame-distance bands of a union: on a block inside one frame pair the band is decided
    and only its place window is left."""
    source = (
        "f_k < 1 or abs(f_q - f_k) <= 1 or 2 <= abs(f_q - f_k) <= 3 and "
        "abs(8 * (h_q - h_k) + w_q - w_k) < 16 or 4 <= abs(f_q - f_k) <= 7 and "
        "abs(8 * (h_q - h_k) + w_q - w_k) < 8"
    )
    mask = ir.Predicate(source, parse_predicate(source))
    lay = TokenLayout(9, 4, 8, 5, "first")
    grid = TileGrid(lay.seq_len, 16, 16)
    assert _check_variants(mask, lay, grid) > 0
    found = residuals.analyze(mask, lay, grid, classify_tiles(mask, lay, grid).kinds)
    words = [v.mask.describe() for v in found.variants]
    assert any("f_" not in w for w in words), words  # some variant reads no frame at all


def test_no_variants_for_masks_without_parts():
    """A single primitive has nothing to fold; a decided mask has no BOUNDARY block."""
    lay = TokenLayout(4, 4, 8)
    grid = TileGrid(lay.seq_len, 16, 16)
    mask = ir.SpatialWindow(1, None, None)
    assert residuals.analyze(mask, lay, grid, classify_tiles(mask, lay, grid).kinds) is None


def test_variants_only_for_static_kernels():
    """Run-time tables, selections and chunked calls run whole masks."""
    text = _NATTEN.format(runtime="runtime: {segments: true}\n")
    plan = analyze(parse_spec(text, source="x.yaml"))
    assert plan.only.residuals is None and plan.tables.variants is None
    plan = analyze(parse_spec(_NATTEN.format(runtime=""), source="x.yaml"))
    assert plan.only.residuals is not None and plan.tables.variants is not None


@pytest.mark.parametrize("foreseen", [True, False], ids=["foreseen", "found"])
def test_a_work_limit_leaves_residual_masks_out_not_the_spec(foreseen, monkeypatch, capsys):
    """Where classifying the mask's parts would pass MAX_PRODUCT_WORK (foreseen from the
    classification's own work, or found on the way), the plan is the one without residual
    masks, says why (inspect --json, the warning), and is not refused: they are a speed-up."""
    import svgen.analysis as analysis

    spec = parse_spec(_NATTEN.format(runtime=""), source="x.yaml")
    mask = ir.lower(spec)
    layout = analysis.choose_layout(spec, spec.head_patterns().candidates[0].layout, mask)
    _, _, (_, used) = analysis._pattern_plans(spec, [mask], [layout], None)
    without = analyze(spec, residual_masks=False)
    ratio = residuals.relative_work(without.only.mask, without.only.layout)
    assert ratio is not None and ratio > 2
    # Room for the classification, and for the parts' work only where it is not foreseen.
    monkeypatch.setattr(analysis, "MAX_PRODUCT_WORK", 2 * used)
    if foreseen:  # skipped before any of the parts' classification runs

        def not_run(*args):
            raise AssertionError("residual analysis ran")

        monkeypatch.setattr(residuals, "analyze", not_run)
    else:
        monkeypatch.setattr(residuals, "relative_work", lambda mask, layout: None)
    plan = analyze(spec)
    assert plan.only.residuals is None and plan.only.residuals_skipped == "MAX_PRODUCT_WORK"
    np.testing.assert_array_equal(plan.only.table.runs, without.only.table.runs)
    assert plan.tables.variants is None
    np.testing.assert_array_equal(plan.tables.entries, without.tables.entries)
    assert plan.only.summary()["residual_masks_skipped"] == "MAX_PRODUCT_WORK"
    (warning,) = [w for w in lint.plan_warnings(plan) if "residual" in w.message]
    assert "no residual masks" in warning.message and "MAX_PRODUCT_WORK" in warning.message
    monkeypatch.undo()
    assert analyze(spec).only.residuals is not None  # within the limit they are there


# A NATTEN neighborhood (3 x 3 x 5, clamped inside the video) or'ed with a 3 x 3 echo four
# frames back, at a size where variants pay: each conjunction alone is one coords.fields,
# so a block where one of them is decided runs the other alone (a neighborhood by itself
# gets no variants: its whole mask is that one call already).
_NATTEN = """svgen: 1
name: small_natten
geometry: {{frames: 8, height: 8, width: 16}}
attention: {{heads: 2, head_dim: 128, dtype: float32}}
mask: {{expr: "max(0, min(f_q - 1, 5)) <= f_k <= max(0, min(f_q - 1, 5)) + 2 and max(0, min(h_q - 1, 5)) <= h_k <= max(0, min(h_q - 1, 5)) + 2 and abs(w_q - w_k) <= 2 or f_q - f_k == 4 and abs(h_q - h_k) <= 1 and abs(w_q - w_k) <= 1"}}
tiling: {{block_q: 128, block_kv: 128}}
{runtime}"""

_RADIAL = """svgen: 1
name: small_radial
geometry: {{frames: 12, height: 4, width: 32, text_tokens: {text}, text_position: first}}
attention: {{heads: 2, head_dim: 128, dtype: {dtype}{softmax}}}
mask: {{expr: "f_k < 1 or abs(f_q - f_k) <= 1 or 2 <= abs(f_q - f_k) <= 3 and abs(32 * (h_q - h_k) + w_q - w_k) < 64 or 4 <= abs(f_q - f_k) <= 7 and abs(32 * (h_q - h_k) + w_q - w_k) < 32 or 8 <= abs(f_q - f_k) <= 15 and abs(32 * (h_q - h_k) + w_q - w_k) < 16"}}
tiling: {{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}}
"""

_UNION = """svgen: 1
name: small_union
geometry: {frames: 9, height: 8, width: 16, text_tokens: 40}
attention: {heads: 4, head_dim: 128, dtype: float32}
layout: temporal_major
patterns:
  spatial: {any_of: [{spatial_window: {frames: 1}}, {first_frame: {frames: 1}}, {text: {}}]}
  band: {any_of: [{band: {width: 100}}, {text: {}}, {expr: "f_k == 2 and h_k < 3"}]}
heads: {candidates: [{pattern: spatial}, {pattern: band}], assign: [spatial, band, band, spatial]}
tiling: {block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}
"""


def _run(plan, module, dtype, seed=0):
    """Every head against float64, in the user's token order (NaN-poisoned buffers)."""
    heads = plan.spec.attention.heads
    q, k, v = mixed_inputs(plan, dtype, seed, heads=heads)
    head_pattern = np.zeros(heads, np.int32) if plan.assign is None else np.array(plan.assign)
    out = module.attention(q, k, v, head_pattern=head_pattern, interpret=POISONED)
    check_per_head(plan, out, q, k, v, head_pattern, dtype)


def _with_variants(plan):
    assert plan.tables.variants is not None
    return [p for p in plan.patterns if p.residuals is not None]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernel_with_one_block_per_tile(dtype, compile_text):
    plan, module = compile_text(_NATTEN.format(runtime="").replace("float32", dtype))
    assert _with_variants(plan)
    _run(plan, module, dtype)


@pytest.mark.parametrize(
    "dtype,text,softmax,variants", [("float32", 0, "", 3), ("bfloat16", 24, "", 8)]
)
def test_kernel_with_several_blocks_per_tile(dtype, text, softmax, variants, compile_text):
    """Four compute blocks per tile: 4 bits per block in the variants words, room for 15
    variants: the three radial bands, and with text tokens more (blocks across two bands),
    the last numbered above 7."""
    plan, module = compile_text(_RADIAL.format(dtype=dtype, text=text, softmax=softmax))
    (pattern,) = _with_variants(plan)
    assert len(pattern.residuals.variants) == variants
    assert pattern.residuals.block_variant.max() == len(pattern.residuals.variants)
    _run(plan, module, dtype)


def test_kernel_with_the_bounded_softmax(compile_text):
    plan, module = compile_text(
        _RADIAL.format(dtype="float32", text=8, softmax=", softmax: bounded")
    )
    assert _with_variants(plan)
    _run(plan, module, "float32", seed=3)


def test_kernel_with_variants_for_several_patterns(every_variant, compile_text):
    plan, module = compile_text(_UNION)
    assert len(_with_variants(plan)) == 2
    _run(plan, module, "float32", seed=5)


def test_a_wrong_variant_is_caught(compile_text, monkeypatch):
    """Planted bug: tables naming variant 1 on every BOUNDARY block; the kernel's output then
    differs from the reference (so the kernel tests above can fail)."""
    analyze_residuals = residuals.analyze

    def everywhere_one(mask, layout, compute, kinds, max_variants):
        found = analyze_residuals(mask, layout, compute, kinds, max_variants)
        wrong = np.where(kinds == TileKind.BOUNDARY, 1, 0).astype(np.int8)
        return dataclasses.replace(found, block_variant=wrong)

    monkeypatch.setattr(residuals, "analyze", everywhere_one)
    plan, module = compile_text(_RADIAL.format(dtype="float32", text=0, softmax=""))
    with pytest.raises(AssertionError, match="head 0"):
        _run(plan, module, "float32")


def test_the_model_charges_each_block_its_variant():
    paths = PathCosts(
        bookkeeping=10,
        full=100,
        mixed=(20,),
        block=(((30, 50, 60), (31, 51, 61)),),
        init=(5,),
        finalize=7,
        pipeline=3,
        residual_block=((((40, 45), (35, 38)), ((41, 46), (36, 39))),),
    )
    b = int(TileKind.BOUNDARY)
    word = b | (b << 2)
    runs = np.array([[0, 0, 1, b, word], [0, 1, 1, b, word], [0, 2, 1, b, word]])
    bits = variant_bits(2)  # 4: two compute blocks leave room
    variants = np.array([0, 1 | (2 << bits), 2])  # block 0 / block 1: (0, 0), (1, 2), (2, 0)
    tables = PieceTables.from_runs([runs], 1, compute_blocks=2, variants_per_pattern=[variants])
    _, steps, by_path = model_cycles(paths, tables, [0])
    assert steps["mixed"] == 3
    assert by_path["mixed"] == (20 + 50 + 51) + (20 + 40 + 36) + (20 + 35 + 51)


# -- the slower-than-dense warning ----------------------------------------------------------

# (its mask on line 5, from column 7)
_SCATTERED = spec_text(
    "scattered",
    (4, 16, 16),
    1,
    mask='{expr: "(i_q * 7 + i_k * 3) % 5 != 0 and (i_q + 2 * i_k) % 7 != 1 and abs(i_q - i_k) % 3 != 2"}',
)


def test_a_kernel_slower_than_dense_is_said(tmp_path, monkeypatch, capsys):
    """Every tile BOUNDARY under a mask of many operations: compile and inspect warn, with
    the estimate and what helps, and still succeed."""
    from svgen.cli import main

    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "scattered.yaml").write_text(_SCATTERED)
    monkeypatch.chdir(tmp_path)
    for command in (["inspect"], ["compile", "--out", "out"]):
        assert main([*command, "specs/scattered.yaml"]) == 0
        err = capsys.readouterr().err
        assert "specs/scattered.yaml:5:8: mask.expr: the mask: its kernel would be about" in err, (
            err
        )
        assert "slower than the same kernel on a dense mask" in err and "tiling.align" in err


@pytest.mark.parametrize("name", [p.stem for p in SPECS])
def test_no_shipped_spec_is_slower_than_dense(name):
    plan = analyze(parse_spec((REPO / "specs" / f"{name}.yaml").read_text(), source=name))
    assert not [w for w in lint.plan_warnings(plan) if "slower" in str(w)]


@pytest.mark.parametrize("nodes", [1, 3, 31, 32, 33, 48])
def test_unique_rows_is_numpys_row_unique(nodes):
    """The packed row sort gives np.unique(axis=0)'s rows, order and inverse (what ranks the
    variants, so generated modules stay the same), for one and several 64-bit words."""
    from svgen.analysis.residuals import _unique_rows

    rng = np.random.default_rng(nodes)
    values = rng.integers(0, 4, size=(500, nodes)).astype(np.int8)
    values[250:] = values[rng.integers(0, 250, 250)]  # repeated rows
    rows, inverse = np.unique(values, axis=0, return_inverse=True)
    got_rows, got_inverse = _unique_rows(values)
    assert np.array_equal(got_rows, rows)
    assert np.array_equal(got_inverse, inverse.ravel())


def _smallest_budget(fits) -> int:
    """The smallest SMEM budget (bytes) at which fits(budget) holds (monotone)."""
    lo, hi = 0, 1 << 20
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def test_residual_masks_that_would_pass_the_smem_budget_are_left_out():
    """Residual masks are a speed-up: where their variant words would take the tables past
    the SMEM budget, the spec compiles without them (and a spec whose tables cannot fit even
    without them is refused as before)."""
    spec = parse_spec(_NATTEN.format(runtime=""), source="x.yaml")
    assert any(p.residuals is not None for p in analyze(spec).patterns)

    def plain_fits(budget):
        try:
            return bool(analyze(spec, smem_budget=budget, residual_masks=False))
        except SpecError:
            return False

    def variants_fit(budget):
        plan = analyze(spec, smem_budget=budget)  # never refused where plain tables fit
        return any(p.residuals is not None for p in plan.patterns)

    plain = _smallest_budget(plain_fits)
    with_variants = _smallest_budget(lambda b: plain_fits(b) and variants_fit(b))
    assert plain < with_variants  # the variant words cost bytes
    squeezed = analyze(spec, smem_budget=plain)
    assert all(p.residuals is None for p in squeezed.patterns)
    assert squeezed.tables.variants is None
    with pytest.raises(SpecError, match="over the SMEM budget"):
        analyze(spec, smem_budget=plain - 1)


def test_no_residual_search_where_boundary_blocks_are_a_sliver(monkeypatch):
    """Where all of the BOUNDARY blocks' mask work is under MIN_KERNEL_SHARE of the kernel's
    block work, no mask node is classified (the search would cost seconds at 1.74M tokens
    and save nothing measurable); past it, the search runs."""
    spec = parse_spec(_NATTEN.format(runtime=""), source="x.yaml")
    plan = analyze(spec)
    mask, layout, grid = plan.only.mask, plan.only.layout, plan.only.compute_grid
    ops = residuals.estimate_ops(mask)
    visited_per_boundary = ops * residuals.MAX_SHARE_PER_MASK_OP / residuals.MIN_KERNEL_SHARE
    full = int(visited_per_boundary) + 1  # one BOUNDARY block among this many FULL ones
    kinds = np.full((1, full + 1), TileKind.FULL, np.int8)
    kinds[0, 0] = TileKind.BOUNDARY
    calls = []
    monkeypatch.setattr(residuals, "classify_tiles", lambda *a: calls.append(a) or 1 / 0)
    assert residuals.analyze(mask, layout, grid, kinds) is None and calls == []
    kinds[0, 1:3] = TileKind.BOUNDARY  # three among as many: over the share
    with pytest.raises(ZeroDivisionError):
        residuals.analyze(mask, layout, grid, kinds)
    assert len(calls) == 1


_DECAY = spec_text(
    "small_decay",
    (16, 4, 16),
    2,
    mask=any_of(
        "{first_frame: {}}",
        "{spatial_window: {frames: 1}}",
        '{expr: "abs(f_q - f_k) <= 4 and (f_q - f_k) % 2 == 0 and abs(h_q - h_k) <= 1 and '
        'abs(w_q - w_k) <= 2"}',
    ),
)


def test_query_functions_are_decoded_once_and_shared_by_the_residual_masks(compile_text):
    """A coords.fields packing is one query function, which the kernel decodes once per q
    tile in place of the coordinates only it reads, and which a residual mask made of that
    conjunction alone (the frame-decay shape, on blocks where the anchor and the window
    keep nothing) reads too instead of a copy; the kernel matches float64; a mask reading a
    function the kernel did not decode fails loudly."""
    import inspect

    from svgen.runtime.forward import _QueryBlockCoords

    plan, module = compile_text(_DECAY)
    (pattern,) = module._PATTERNS
    assert _with_variants(plan)
    assert tuple(pattern.query_coords) == ("frame", module.boundary_mask_fields)
    source = inspect.getsource(module)
    assert source.count("_fields(q):") == 1, source
    shared = [r for r in pattern.residual_masks if "q.once(" in inspect.getsource(r)]
    assert shared and all("q.once(boundary_mask_fields)" in inspect.getsource(r) for r in shared), (
        source
    )
    _run(plan, module, "float32")
    coords = _QueryBlockCoords(None, ("frame",), None)
    with pytest.raises(AttributeError, match="boundary_mask_fields was not decoded"):
        coords.once(module.boundary_mask_fields)


def test_query_functions_past_the_query_symbols_are_counted_in_the_vmem_need(compile_text):
    """Five conjunctions of windows in a union: five query functions, one [block_q, 128]
    int32 buffer each, past the mask's four query symbols (frame, row, column and place): the
    analysis counts them from the printed code when it sizes the VMEM (once), the module
    asks for that, and the kernel runs against float64."""
    from svgen.analysis import query_coordinate_bound
    from svgen.core.vmem import kernel_vmem

    conjunctions = " or ".join(
        f"f_q - f_k == {d} and abs(h_q - h_k) <= {d % 2} and abs(w_q - w_k) <= {d}"
        for d in (1, 2, 3, 5, 6)
    )
    text = (
        "svgen: 1\nname: small_echoes\ngeometry: {frames: 16, height: 8, width: 32}\n"
        "attention: {heads: 1, head_dim: 128, dtype: float32}\n"
        f'mask: {{expr: "{conjunctions}"}}\n'
        # 2048-row tiles: a query value's buffer is 1 MiB, past the limit's rounding
        "tiling: {block_q: 2048, block_kv: 512, compute_q: 512, compute_kv: 512}\n"
    )
    plan, module = compile_text(text, residual_masks=False)
    (pattern,) = module._PATTERNS
    values = len(pattern.query_coords)
    assert values == 5 > query_coordinate_bound(plan.only.mask), pattern.query_coords
    t = plan.spec.tiling
    need = kernel_vmem(t.block_q, t.block_kv, t.cq, t.ckv, 128, "float32", values)
    assert need == plan.kernel.vmem  # the analysis counted the printed query values
    assert module.VMEM_LIMIT_BYTES == need.limit()
    _run(plan, module, "float32")


def test_variant_words_take_4_bits_only_where_the_tile_has_room():
    """variant_bits: 4 bits per compute block up to 8 blocks a tile (32 bits), 2 beyond;
    the analysis packs a tile's word so (8 blocks: 4 bits each, 16 blocks: 2 bits each)."""
    from svgen.analysis.tables import variant_words

    assert [variant_bits(n) for n in (1, 2, 4, 8, 9, 16)] == [4, 4, 4, 4, 2, 2]
    for rows, cols, bits in ((2, 4, 4), (4, 4, 2)):
        grid = TileGrid(128 * cols, 128 * rows, 128 * cols, q_len=128 * rows)  # one tile
        compute = TileGrid(128 * cols, 128, 128, q_len=128 * rows)
        block_variant = (np.arange(rows * cols) % (1 << bits)).reshape(rows, cols)
        kinds = np.full((1, 1), TileKind.BOUNDARY)
        (word,) = variant_words(block_variant, kinds, grid, compute).ravel()
        got = [(int(word) >> (bits * i)) & ((1 << bits) - 1) for i in range(rows * cols)]
        assert got == block_variant.ravel().tolist(), (rows, cols)
