"""Generated source: the emitted boundary mask equals the oracle; files parse; headers hold."""

import ast
import re
from dataclasses import replace

import numpy as np
import pytest

from svgen import codegen, ir
from svgen.analysis import analyze, query_coordinate_bound
from svgen.codegen import backends
from svgen.analysis.mask_code import emit_mask
from svgen.codegen.tilemap import render_tile_map
from svgen.core.layout import TokenLayout
from svgen.core.kinds import TileKind
from svgen.spec import load_spec, parse_spec

from helpers import (
    REPO,
    SPECS,
    dense_keep,
    lower_mask_dict,
    mask_spec_text,
    random_layout,
    random_mask,
)
from kernel_helpers import emitted_function, emitted_keep


@pytest.mark.parametrize("seed", range(40))
def test_emitted_mask_equals_the_oracle(seed):
    rng = np.random.default_rng(5000 + seed)
    lay = random_layout(rng)
    _, mask = lower_mask_dict(random_mask(rng, lay), lay, 128, 128)
    fn, text = emitted_function(mask, lay)
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=text)
    # The kernel keeps each query coordinate the mask reads in VMEM, sized by this bound.
    assert len(emit_mask(mask, lay).query_coords) <= query_coordinate_bound(mask), text
    code = [line for line in text.splitlines() if not line.strip().startswith("#")]
    assert not any("//" in line or "%" in line for line in code)  # lax.div / lax.rem only


@pytest.mark.parametrize(
    "mask, widest",
    [
        ({"spatial_window": {"rows": 1}}, {"spatial_window": {"frames": 4, "rows": 1}}),
        ({"spatial_window": None}, {"spatial_window": {"frames": 4}}),
        (
            {"any_of": [{"spatial_window": {"cols": 2}}, {"first_frame": {}}]},
            {"any_of": [{"spatial_window": {"frames": 4, "cols": 2}}, {"first_frame": {}}]},
        ),
    ],
    ids=["rows", "null", "or_first_frame"],
)
def test_emitted_spatial_window_without_frames_spans_every_frame(mask, widest):
    """`frames` omitted: the emitted line keeps what the same window with frames: F - 1
    keeps (every frame), text pairs included."""
    lay = TokenLayout(5, 4, 6, 16, "last")
    fn, text = emitted_function(lower_mask_dict(mask, lay, 128, 128)[1], lay)
    keep = emitted_keep(fn, lay)
    np.testing.assert_array_equal(keep, dense_keep(lower_mask_dict(widest, lay, 128, 128)[1], lay))
    assert keep.any() and not keep.all(), text


def _module_and_mask_sources(plan, spec_path: str) -> tuple[str, list[str]]:
    """(the module codegen renders for ``plan``, the source emitted_function gives of each
    exact pattern's mask, named as the module names it; aligned patterns have none)."""
    stem = codegen.module_stem(plan.spec.name, plan.backend)
    module = codegen.render(plan, spec_path)[f"{stem}.py"].decode()
    single = len(plan.patterns) == 1
    return module, [
        emitted_function(
            p.mask, p.layout, "boundary_mask" if single else f"{p.name}_boundary_mask"
        )[1]
        for p in plan.patterns
        if p.budget is None
    ]


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.stem)
def test_the_mask_tests_run_the_modules_mask_function(spec_path):
    """The mask tests (emitted_function: test_codegen, test_expr, test_predicate_printer,
    test_primitives) run the text a generated module holds, byte for byte: each shipped
    pattern's mask function, docstring and formatter layout included."""
    plan = analyze(load_spec(spec_path))
    module, sources = _module_and_mask_sources(plan, f"specs/{spec_path.name}")
    assert sources
    for source in sources:
        assert f"\n\n\n{source}" in module, source


def test_the_mask_tests_run_the_modules_mask_function_on_random_masks():
    """As above on random masks and layouts (long chains split as the formatter would)."""
    for seed in range(20):
        rng = np.random.default_rng(12_000 + seed)
        lay = random_layout(rng)
        plan = analyze(parse_spec(mask_spec_text(random_mask(rng, lay), lay, name="same_text")))
        module, [source] = _module_and_mask_sources(plan, "specs/same_text.yaml")
        head = 'def boundary_mask(q, k):\n    """keep(q, k) on a BOUNDARY'
        # (its query functions, when it has any, come first)
        assert source.startswith((head, "def boundary_mask_fields(q):")) and head in source
        assert f"\n\n\n{source}" in module, f"seed {seed}\n{source}"


def test_sympy_predicate_agrees_with_the_oracle():
    rng = np.random.default_rng(7)
    for _ in range(40):
        lay = random_layout(rng)
        _, mask = lower_mask_dict(random_mask(rng, lay), lay, 128, 128)
        c = lay.coordinates(np.arange(lay.seq_len))
        q, k = c.reshape(-1, 1), c.reshape(1, -1)
        via_sympy = np.broadcast_to(
            ir.evaluate_sympy(mask.predicate(), q, k), (lay.seq_len, lay.seq_len)
        )
        np.testing.assert_array_equal(via_sympy, mask.evaluate(q, k))


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.stem)
def test_shipped_modules_parse_and_carry_a_valid_header(spec_path):
    text = (REPO / "generated" / f"{spec_path.stem}.py").read_text()
    ast.parse(text)
    header = codegen.parse_header(text)
    assert header is not None and header.spec_path == f"specs/{spec_path.name}"
    assert header.body_sha256 == codegen.body_checksum(codegen.body_of(text))
    assert header.spec_digest == load_spec(spec_path).digest
    assert "/work" not in text and "/tmp" not in text  # no absolute paths
    assert "Tile map:" in text and "Kept pairs:" in text


def test_large_tables_go_to_a_checked_npy_file(tmp_path, monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, "tpu", replace(backends.TPU, max_inline_runs=4))
    plan = analyze(load_spec(REPO / "specs" / "wan21_720p_spatial.yaml"))
    files = codegen.render(plan, "specs/wan21_720p_spatial.yaml")
    assert sorted(files) == ["wan21_720p_spatial.py", "wan21_720p_spatial_tables.npy"]
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    from helpers import import_file

    module = import_file(tmp_path / "wan21_720p_spatial.py")
    np.testing.assert_array_equal(module.STEP_RUNS, plan.table.runs)
    (tmp_path / "wan21_720p_spatial_tables.npy").write_bytes(
        files["wan21_720p_spatial_tables.npy"][:-4] + b"\xff\xff\xff\xff"
    )
    with pytest.raises(RuntimeError, match="does not match the module"):
        import_file(tmp_path / "wan21_720p_spatial.py")


def test_tile_map_downsamples_and_marks_mixed_cells():
    kinds = np.zeros((4, 4), np.int8)
    kinds[0, 0] = TileKind.FULL
    kinds[:2, 2:] = TileKind.FULL
    lines = render_tile_map(kinds, max_rows=2, max_cols=2)
    assert lines[2:] == ["+#", ".."]
    assert render_tile_map(kinds)[2] == "#.##"


@pytest.mark.parametrize("text", [0, 5])
@pytest.mark.parametrize("order", ["frame_major", "temporal_major"])
@pytest.mark.parametrize(
    "mask",
    [
        {"any_of": [{"band": {"width": 6}}, {"prefix": {"tokens": 7}}]},
        {"any_of": [{"first_frame": {"frames": 1}}, {"spatial_window": {"frames": 1}}]},
        {
            "any_of": [
                {"first_frame": {"frames": 1}},
                {"prefix": {"tokens": 3}},
                {"spatial_window": {"frames": 0}},
            ]
        },
        {"any_of": [{"first_frame": {"frames": 1}}, {"temporal_stride": {}}]},
    ],
)
def test_window_or_key_terms_fuse_and_equal_the_oracle(mask, order, text):
    """A window or'ed with key-only terms is one compare with the key terms as a bit mask
    (coords.within(..., unless=...)); place equality replaces row and column equality."""
    lay = TokenLayout(4, 3, 5, text, "last", order, 1 if order == "temporal_major" else 0)
    _, lowered = lower_mask_dict(mask, lay, 128, 128)
    fn, text_src = emitted_function(lowered, lay)
    if "temporal_stride" in mask["any_of"][1]:
        assert "q.place == k.place" in text_src
    elif not text:  # with text tokens the window also tests is_text: not a bare window
        assert "unless=" in text_src, text_src
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(lowered, lay), err_msg=text_src)


@pytest.mark.parametrize("text_position", ["first", "last"])
@pytest.mark.parametrize("order", ["frame_major", "temporal_major"])
@pytest.mark.parametrize("frames", [1, 2, 3])
def test_block_causal_emits_the_oracle(frames, order, text_position):
    """block_causal's line (one division, on the query's frame: a shift for a power of two)
    equals the oracle with text tokens on either side, and with `text: {}` giving them
    global attention."""
    lay = TokenLayout(7, 2, 3, 5, text_position, order, 1 if order == "temporal_major" else 0)
    mask = {
        "any_of": [
            {"block_causal": {"frames": frames}},
            {"text": {}},
            {"first_frame": {"frames": 1}},
        ]
    }
    _, lowered = lower_mask_dict(mask, lay, 128, 128)
    fn, text_src = emitted_function(lowered, lay)
    assert "block_causal = " in text_src
    division = "jnp.right_shift(q.frame, 1)" if frames == 2 else "lax.div(q.frame"
    assert (division in text_src) == (frames > 1), text_src
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(lowered, lay), err_msg=text_src)


def _docstring_numbers(text: str, label: str) -> list[list[int]]:
    """Per pattern, the integers of the docstring line that starts with `label`."""
    lines = [line.strip() for line in text.split('"""')[1].splitlines()]
    return [
        [int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", line.split(":", 1)[1])]
        for line in lines
        if line.startswith(label)
    ]


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.stem)
def test_docstring_counts_are_the_plans(spec_path):
    """The tile and compute-block counts, kept pairs and steps a reviewer reads in a
    generated module's docstring are the analysis's own numbers."""
    plan = analyze(load_spec(spec_path))
    text = (REPO / "generated" / f"{spec_path.stem}.py").read_text()
    tiles = _docstring_numbers(text, "Tiles:")
    blocks = _docstring_numbers(text, "Compute blocks:")
    kept = _docstring_numbers(text, "Kept pairs")
    visited = _docstring_numbers(text, "Visited fraction:")
    assert len(tiles) == len(plan.patterns)
    for index, pattern in enumerate(plan.patterns):
        counts = pattern.tile_counts()
        assert tiles[index][-3:] == [counts["full"], counts["boundary"], counts["empty"]]
        if blocks:
            c = pattern.compute_block_counts()
            assert blocks[index][-3:] == [c["full"], c["boundary"], c["empty"]]
        assert kept[index][0] == pattern.classification.kept_pairs
        assert visited[index][-1] == pattern.table.visited_steps


@pytest.mark.parametrize("seed", range(40))
def test_rendered_module_masks_equal_the_oracle_under_jit(seed, compile_text):
    """The real template, rendered and imported: each pattern's boundary_mask, jitted over
    every (q, k) pair in kernel order, equals the IR oracle (random masks and layouts)."""
    import jax

    from svgen.runtime import coords

    rng = np.random.default_rng(9000 + seed)
    lay = random_layout(rng)
    mask = random_mask(rng, lay)
    text = mask_spec_text(mask, lay, name="rendered_oracle")
    plan, module = compile_text(text)
    pattern, planned = module._PATTERNS[0], plan.only
    pos = np.arange(planned.layout.seq_len, dtype=np.int32)
    keep = jax.jit(lambda q, k: coords.keep(pattern.boundary_mask, pattern.layout, q, k))(
        pos[:, None], pos[None, :]
    )
    got = np.broadcast_to(np.asarray(keep), (pos.size, pos.size))
    np.testing.assert_array_equal(got, dense_keep(planned.mask, planned.layout))
