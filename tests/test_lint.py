"""Warnings for likely mistakes (svgen.report.lint): every parameter measured against the geometry
warns just past its largest meaningful value and not at it; masks that keep nothing warn."""

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
    minimum."""
    p = primitives.get(key)
    params = {q.name: q.minimum for q in p.params if q.required}
    params[name] = value
    return {"any_of": [{"text": {}}, {key: params}]}


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
