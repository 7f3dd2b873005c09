"""Warnings for likely mistakes (svgen.report.lint): every parameter measured against the geometry
warns just past its largest meaningful value and not at it; masks that keep nothing warn."""

import os
import pathlib
import tempfile

import numpy as np
import pytest
import yaml

from svgen.report import lint
from svgen.spec import primitives
from svgen.analysis import analyze
from svgen.spec import parse_spec

GEOMETRY = {"frames": 3, "height": 4, "width": 5, "text_tokens": 2}  # 62 tokens

MEASURED = [
    (p.key, q.name) for p in primitives.registered() for q in p.params if q.within is not None
]


def _spec(mask: dict):
    return parse_spec(
        yaml.safe_dump(
            {
                "svgen": 1,
                "name": "lint",
                "geometry": GEOMETRY,
                "attention": {"heads": 1, "head_dim": 128, "dtype": "float32"},
                "mask": mask,
                "tiling": {"block_q": 128, "block_kv": 128},
            }
        ),
        source="specs/lint.yaml",
    )


def _mask(key: str, name: str, value: int) -> dict:
    """Primitive `key` with parameter `name` = value and its other required ones at their
    minimum (a required file: a one-block mask, what any block past the sequence reads)."""
    p = primitives.get(key)
    params = {
        q.name: _one_block_file() if q.kind == primitives.TEXT else q.minimum
        for q in p.params
        if q.required
    }
    params[name] = value
    return {"any_of": [{"text": {}}, {key: params}]}


def _one_block_file() -> str:
    path = pathlib.Path(tempfile.gettempdir()) / f"svgen-lint-{os.getpid()}-one-block.npy"
    np.save(path, np.ones((1, 1), np.uint8))
    return str(path)


def test_every_extent_has_a_limit():
    assert set(lint.EXTENT_LIMITS) == set(primitives.EXTENTS)
    for p in primitives.registered():
        for q in p.params:
            assert q.within is None or q.within in primitives.EXTENTS, (p.key, q.name)
    assert len(MEASURED) >= 10


@pytest.mark.parametrize("key,name", MEASURED, ids=[f"{k}.{n}" for k, n in MEASURED])
def test_parameter_past_the_geometry_warns(key, name):
    within = primitives.get(key).params[primitives.get(key).param_names.index(name)].within
    largest = lint.EXTENT_LIMITS[within][0](_spec({"text": {}}).geometry)
    assert lint.spec_warnings(_spec(_mask(key, name, largest))) == []
    (warning,) = lint.spec_warnings(_spec(_mask(key, name, largest + 1)))
    assert warning.file == "specs/lint.yaml" and warning.line is not None
    assert warning.key == f"mask.any_of[1].{key}.{name}"
    assert warning.message.startswith(f"{largest + 1:,} is more than ")
    assert str(warning).startswith(
        f"specs/lint.yaml:{warning.line}:{warning.column}: mask.any_of[1].{key}.{name}: "
    )


def test_defaults_are_never_blamed():
    """temporal_stride's rows/cols default to 0 and stride to 1: fine on a one-frame, 1 x 1
    video; only values the spec writes are checked."""
    spec = parse_spec(
        yaml.safe_dump(
            {
                "svgen": 1,
                "name": "lint",
                "geometry": {"frames": 1, "height": 1, "width": 1},
                "attention": {"heads": 1, "head_dim": 128, "dtype": "float32"},
                "mask": {"any_of": [{"temporal_stride": {}}, {"first_frame": {}}]},
            }
        )
    )
    assert lint.spec_warnings(spec) == []


@pytest.mark.parametrize(
    "mask,warns",
    [
        ({"all_of": [{"first_frame": {}}, {"not": {"first_frame": {}}}]}, True),
        ({"expr": "f_q < 0"}, True),  # a user predicate proven false everywhere
        ({"all_of": [{"spatial_window": {"frames": 0}}, {"text": {}}]}, True),
        ({"spatial_window": {"frames": 0}}, False),
        ({"expr": "(w_q + w_k) % 2 == 0"}, False),
    ],
)
def test_a_mask_that_keeps_nothing_warns(mask, warns):
    plan = analyze(_spec(mask))
    found = lint.plan_warnings(plan)
    assert bool(found) == warns, found
    if warns:
        assert found[0].message.startswith("the mask keeps no pair")
        assert found[0].key == f"mask.{next(iter(mask))}"


def _tiled_spec(frames: int, height: int) -> str:
    return f"""
svgen: 1
name: sta
geometry: {{frames: {frames}, height: {height}, width: 16}}
attention: {{heads: 1, head_dim: 128, dtype: float32}}
layout: {{tiled: {{frames: 2, rows: 4, cols: 16}}}}
mask: {{cube_window: {{cube_frames: 2, cube_rows: 4, cube_cols: 16, frames: 1, rows: 1, cols: 0}}}}
tiling: {{block_q: 128, block_kv: 128}}
"""


def test_ragged_cubes_warn_with_their_cost_and_what_divides():
    """Cubes of 2 x 4 x 16 (128 tokens, one a tile) on 5 x 9 x 16: frames and rows leave
    smaller last cubes, which straddle tiles; on 4 x 8 x 16 they divide and nothing warns."""
    plan = analyze(parse_spec(_tiled_spec(5, 9), source="specs/sta.yaml"))
    (warning,) = [w for w in lint.plan_warnings(plan) if w.key == "layout.tiled"]
    counts = plan.patterns[0].tile_counts()
    visited = counts["full"] + counts["boundary"]
    assert counts["boundary"] >= lint.RAGGED_BOUNDARY_SHARE * visited
    assert warning.file == "specs/sta.yaml"
    assert "(frames 5 = 2 x 2 + 1; rows 9 = 2 x 4 + 1)" in warning.message
    assert f"{counts['boundary']:,} of {visited:,} visited tiles" in warning.message
    assert (
        "Cube sizes that divide: frames 5; rows 3 or 9; or a video of 6 x 12 x 16"
        in warning.message
    )
    divided = analyze(parse_spec(_tiled_spec(4, 8), source="specs/sta.yaml"))
    assert divided.patterns[0].tile_counts()["boundary"] == 0
    assert lint.plan_warnings(divided) == []


def test_divisors_near_a_cube_size():
    assert lint._divisors_near(33, 6) == [3, 11]
    assert lint._divisors_near(45, 8) == [5, 9]
    assert lint._divisors_near(7, 4) == [7]  # a prime: only the whole axis
    assert lint._divisors_near(12, 13) == [12]


def _anchored_blocks_spec(tmp_path, layout: str, anchor: bool) -> str:
    """4 frames of 8 x 8 (256 tokens) in `layout`, a diagonal 64-token block mask from a file,
    with or without a first-frame anchor beside it."""
    np.save(tmp_path / "calibrated.npy", np.eye(4, dtype=np.uint8))
    first = "    - first_frame: {frames: 1}\n" if anchor else ""
    path = tmp_path / "paro.yaml"
    path.write_text(
        "svgen: 1\nname: paro\ngeometry: {frames: 4, height: 8, width: 8}\n"
        "attention: {heads: 1, head_dim: 64, dtype: float32}\n"
        f"layout: {layout}\nmask:\n  any_of:\n{first}"
        "    - blocks: {file: calibrated.npy, block: 64}\n"
        "tiling: {block_q: 128, block_kv: 128}\n"
    )
    return str(path)


@pytest.mark.parametrize("order", ["{order: [h, w, f]}", "{order: [w, h, f]}", "temporal_major"])
def test_a_data_mask_shifted_by_an_anchor_frame_warns(tmp_path, order, capsys):
    """first_frame in a temporal-major order moves the first frame first, and every other
    token with it: the same block-mask file then indexes other tokens (issue 59, item 7).
    The compiler says so at the `blocks` key, naming the shift; without the anchor, or in
    frame-major order (no anchor frames), nothing warns."""
    from svgen.cli import main
    from svgen.spec import load_spec

    path = _anchored_blocks_spec(tmp_path, order, anchor=True)
    (warning,) = lint.plan_warnings(analyze(load_spec(path)))
    assert warning.key == "mask.any_of[1].blocks" and warning.line == 9
    assert "first_frame keeps the first 1 frame(s) (64 tokens) first" in warning.message
    assert "(frame 1, place 0: position 64 here, 1 there)" in warning.message
    assert main(["compile", path, "--out", str(tmp_path / "out"), "--no-size-check"]) == 0
    assert f"svgen: warning: {warning}" in capsys.readouterr().err
    for quiet in (
        _anchored_blocks_spec(tmp_path, order, anchor=False),
        _anchored_blocks_spec(tmp_path, "{order: [f, h, w]}", anchor=True),
    ):
        assert lint.plan_warnings(analyze(load_spec(quiet))) == []
