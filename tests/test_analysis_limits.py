"""The analysis's own work limits (svgen.spec.limits MAX_ROW_SET_WORK, MAX_PRODUCT_WORK): specs
within every limit on their size that would still take minutes and gigabytes to classify are
refused, fast, at the mask's key; the shipped specs stay far below both."""

import itertools
import time

import numpy as np
import pytest

import svgen.analysis as analysis
from svgen import ir
from svgen.spec import limits
from svgen.analysis import axis_terms, product, rowsets
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.analysis.intervals import IntervalSet
from svgen.spec.errors import SpecError
from svgen.spec import parse_spec

from helpers import SPECS

TILING = "tiling: {block_q: 2048, block_kv: 2048, compute_q: 1024, compute_kv: 512}\n"


def _union_spec(name: str, geometry: str, terms: list[str], layout: str = "") -> str:
    body = "".join(f"    - {t}\n" for t in terms)
    return (
        f"svgen: 1\nname: {name}\ngeometry: {geometry}\n"
        "attention: {heads: 1, head_dim: 128, dtype: bfloat16}\n"
        f"{layout}mask:\n  any_of:\n{body}{TILING}"
    )


HUNYUAN = "{frames: 30, height: 48, width: 80, text_tokens: 0}"
VIDEO_2K = "{frames: 121, height: 90, width: 160, text_tokens: 0}"  # 1,742,400 tokens
RAGGED_CUBES = "layout: {tiled: {frames: 5, rows: 7, cols: 11}}\n"

WINDOWS = [  # 250 distinct 3-D windows: 500 nodes, within MAX_MASK_SIZE
    f"spatial_window: {{frames: {f}, rows: {r}, cols: {c}}}"
    for f, r, c in itertools.islice(itertools.product(range(5), range(10), range(10)), 250)
]
CUBES = [  # 200 distinct cube windows
    f"cube_window: {{cube_frames: {a}, cube_rows: {b}, cube_cols: {c}, frames: 1, rows: 1, "
    "cols: 1}"
    for a, b, c in itertools.islice(itertools.product(range(1, 5), range(1, 6), range(1, 11)), 200)
]
HOSTILE = [
    # (id, spec text, the limit named): before the limits, 4 min 25 s and 4.66 GB; 4 min 04 s
    # and 1.77 GB; 2 min 03 s and 1.83 GB; 3.5 to 5 minutes.
    ("windows_250", _union_spec("windows", HUNYUAN, WINDOWS), "MAX_ROW_SET_WORK"),
    ("cube_windows_200", _union_spec("cubes", HUNYUAN, CUBES), "MAX_ROW_SET_WORK"),
    (
        "ragged_tiled_band_2k",
        _union_spec(
            "ragged_band",
            VIDEO_2K,
            ["band: {width: 20000}", "first_frame: {frames: 1}"],
            RAGGED_CUBES,
        ),
        "MAX_ROW_SET_WORK",
    ),
    (
        "ragged_tiled_per_axis_2k",  # 63 terms of box pairs in many small cubes
        _union_spec(
            "ragged_terms",
            VIDEO_2K,
            [
                "first_frame: {frames: 1}",
                "spatial_window: {frames: 1, rows: 3, cols: 3}",
                "cube_window: {cube_frames: 3, cube_rows: 4, cube_cols: 4, frames: 1, rows: 1, "
                "cols: 1}",
                "temporal_stride: {rows: 1, cols: 1, stride: 3}",
                "spatial_window: {frames: 0, rows: 20, cols: 2}",
                "spatial_window: {frames: 5, rows: 0, cols: 0}",
            ],
            RAGGED_CUBES,
        ),
        "MAX_PRODUCT_WORK",
    ),
]


def _refused(text: str) -> tuple[SpecError, float]:
    start = time.perf_counter()
    with pytest.raises(SpecError) as err:
        analysis.analyze(parse_spec(text, source="hostile.yaml"))
    return err.value, time.perf_counter() - start


@pytest.mark.parametrize("text,limit", [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_costly_masks_are_refused_fast_at_the_mask_key(text, limit):
    err, elapsed = _refused(text)
    assert elapsed < 30, f"took {elapsed:.1f} s"
    assert limit in err.message
    assert (err.file, err.key) == ("hostile.yaml", "mask.any_of")
    assert (err.line, err.column) == (text.splitlines().index("mask:") + 2, 3)


def test_the_backstop_stops_what_the_estimate_misses(monkeypatch):
    """The estimate samples rows; were it wrong, the budget the classification runs under
    stops the work at ROW_SET_BACKSTOP times the limit, with the same error."""
    monkeypatch.setattr(rowsets, "estimate_work", lambda *args: 0)
    monkeypatch.setattr(analysis, "MAX_ROW_SET_WORK", 1 << 22)  # a few seconds, not minutes
    # The 250 windows' printed code would also keep ~250 query values, over any chip's VMEM,
    # which analysis refuses before classifying; this test is of the classification's budget.
    monkeypatch.setattr(analysis, "_query_values", lambda *args: 0)
    err, elapsed = _refused(HOSTILE[0][1])
    assert elapsed < 30 and "MAX_ROW_SET_WORK" in err.message and err.key == "mask.any_of"


def test_the_product_budget_refuses_a_level_before_it_runs(monkeypatch):
    """MAX_PRODUCT_WORK: each coarse-to-fine level is refused before it starts when its bound
    would pass the budget, and the bound is never below what the level then charges."""
    text = _union_spec(
        "terms",
        HUNYUAN,
        ["first_frame: {frames: 1}", "spatial_window: {frames: 1, rows: 3, cols: 3}"],
    )
    bounds, charged = [], []
    check, level = product._check_bound, product._classify_level

    def checked(bound):
        bounds.append(bound)
        check(bound)

    def counted(*args, **kwargs):
        before = limits.PRODUCT_WORK.current().used
        out = level(*args, **kwargs)
        charged.append(limits.PRODUCT_WORK.current().used - before)
        return out

    monkeypatch.setattr(product, "_check_bound", checked)
    monkeypatch.setattr(product, "_classify_level", counted)
    monkeypatch.setattr(product, "SIGNATURE_PAIRS", 0)  # every level
    # The classification's levels (a work limit met by the residual analysis after them
    # leaves residual masks out instead: test_residual_masks).
    analysis.analyze(parse_spec(text), residual_masks=False)
    assert len(bounds) == len(charged) > 1
    assert all(b >= c > 0 for b, c in zip(bounds, charged))
    # The last level's check: the work done before it plus its bound, one over the budget.
    monkeypatch.setattr(analysis, "MAX_PRODUCT_WORK", sum(charged[:-1]) + bounds[-1] - 1)
    levels = len(charged)
    err, _ = _refused(text)
    assert "MAX_PRODUCT_WORK" in err.message and err.key == "mask.any_of"
    assert len(charged) - levels == levels - 1  # the last level never ran


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.stem)
def test_shipped_specs_analyze_within_a_tenth_of_the_work_limits(spec_path, monkeypatch):
    monkeypatch.setattr(analysis, "MAX_ROW_SET_WORK", limits.MAX_ROW_SET_WORK // 10)
    monkeypatch.setattr(analysis, "ROW_SET_BACKSTOP", 1)
    monkeypatch.setattr(analysis, "MAX_PRODUCT_WORK", limits.MAX_PRODUCT_WORK // 10)
    analysis.analyze(parse_spec(spec_path.read_text(), source=str(spec_path)))


ESTIMATED = [  # (mask, layout): row-set masks of every kind of leaf
    (
        "any_of: [{band: {width: 300}}, {spatial_window: {frames: 1, rows: 2, cols: 3}}, "
        "{spatial_window: {frames: 0, rows: 4}}]",
        "frame_major",
    ),
    (
        "any_of: [{prefix: {tokens: 700}}, {temporal_stride: {rows: 1, stride: 2}}]",
        "temporal_major",
    ),
    ("all_of: [{expr: 'abs(f_q - f_k) <= 1'}, {not: {band: {width: 200}}}]", "frame_major"),
    (
        "any_of: [{band: {width: 90}}, {cube_window: {cube_frames: 2, cube_rows: 3, "
        "cube_cols: 4, frames: 1, rows: 1, cols: 1}}]",
        "{tiled: {frames: 2, rows: 3, cols: 5}}",
    ),
]


@pytest.mark.parametrize("mask,order", ESTIMATED)
def test_the_estimate_is_close_to_the_work_done(mask, order):
    """The sampled estimate against the work the classification then counts (the same
    charges, over every row): within a third either way on these smooth masks."""
    text = (
        "svgen: 1\nname: estimated\ngeometry: {frames: 9, height: 12, width: 20, "
        f"text_tokens: 0}}\nattention: {{heads: 1, head_dim: 128, dtype: bfloat16}}\n"
        f"layout: {order}\nmask: {{{mask}}}\ntiling: {{block_q: 128, block_kv: 128}}\n"
    )
    spec = parse_spec(text)
    lowered = ir.lower(spec)
    layout = analysis.choose_layout(spec, spec.layout, lowered)
    assert not axis_terms.applies(lowered, layout)
    estimate = rowsets.estimate_work(lowered, layout, 128, 128, layout.seq_len, 1 << 40)
    with limits.ROW_SET_WORK.budget(1 << 40) as done:
        classify_tiles(lowered, layout, TileGrid(layout.seq_len, 128, 128))
    assert 0.67 * done.used <= estimate <= 1.5 * done.used, (estimate, done.used)


@pytest.mark.parametrize("seed", range(20))
def test_unions_of_many_parts_equal_pairwise_unions(seed, monkeypatch):
    """any_of's union (normalized in batches) equals the fold of pairwise unions."""
    monkeypatch.setattr(rowsets, "UNION_BATCH", 8)
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(rng.integers(1, 40)):
        starts = rng.integers(0, 500, rng.integers(0, 30))
        parts.append(IntervalSet.normalized(starts, starts + rng.integers(0, 20, starts.size)))
    union = rowsets._Union()
    for part in parts:
        union.add(part)
    got = union.result()
    expected = IntervalSet.empty()
    for part in parts:
        expected = expected.union(part)
    assert np.array_equal(got.starts, expected.starts)
    assert np.array_equal(got.ends, expected.ends)


def test_the_estimate_extrapolates_sampled_rows():
    """A band has one interval per row in frame-major order: the estimate is the rows, and
    None (over) for any smaller limit."""
    lay = parse_spec(_union_spec("b", HUNYUAN, ["band: {width: 100}"])).geometry
    rows = lay.seq_len
    assert rowsets.estimate_work(ir.Band(100), lay, 2048, 2048, rows, 1 << 40) == rows
    assert rowsets.estimate_work(ir.Band(100), lay, 2048, 2048, rows, rows - 200) is None
