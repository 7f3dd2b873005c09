"""`svgen schema`: a JSON Schema that accepts every shipped spec and rejects the invalid-spec
corpus of test_spec.py, wherever JSON Schema can say the rule."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from svgen.cli import main
from svgen.spec.errors import SpecError
from svgen.spec.schema import schema_text, spec_schema
from svgen.spec import parse_spec

from helpers import REPO, SPECS
from spec_corpus import (
    BASE,
    CASES,
    FULL,
    FULL_REORDERED,
    HEADS_BASE,
    INTEGER_PARAMS,
    MINIMAL,
    MIXED,
    _bad_values,
    _limits_spec,
)

VALIDATOR = jsonschema.Draft202012Validator(spec_schema())

#: Invalid cases the schema cannot reject, and why (svgen.spec.schema's docstring lists the
#: kinds of rule it leaves out).
NOT_EXPRESSIBLE = {
    # Not a JSON document: the YAML is broken, or holds what JSON cannot.
    "yaml_syntax_error": "broken YAML",
    "yaml_bad_indent": "broken YAML",
    "unknown_tag": "a YAML tag",
    "duplicate_key": "duplicate keys (a YAML loader keeps the last)",
    "duplicate_param": "duplicate keys (a YAML loader keeps the last)",
    "duplicate_pattern": "duplicate keys (a YAML loader keeps the last)",
    # The expr grammar.
    "bad_expr_syntax": "expr grammar",
    "bad_expr_plain": "expr grammar",
    "bad_expr_block": "expr grammar",
    # References between values.
    "candidate_unknown_pattern": "a candidate must name a defined pattern",
    "candidate_duplicate": "a pattern may be a candidate once (entries differ in layout)",
    "assign_too_short": "one entry per attention.heads",
    "assign_too_long": "one entry per attention.heads",
    "assign_unknown_name": "assign must name a candidate",
    "assign_not_a_candidate": "assign must name a candidate",
}


def _document(text: str):
    return yaml.safe_load(text)


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(spec_schema())
    assert spec_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_committed_schema_is_what_svgen_schema_prints(capsys):
    assert main(["schema"]) == 0
    printed = capsys.readouterr().out
    assert printed == schema_text()
    committed = (REPO / "svgen.schema.json").read_text()
    assert committed == printed, "run: svgen schema > svgen.schema.json"


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_shipped_spec_is_valid_and_names_the_schema(path):
    text = path.read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=../svgen.schema.json"
    VALIDATOR.validate(_document(text))


@pytest.mark.parametrize(
    "text",
    [FULL, FULL_REORDERED, MINIMAL, MIXED, BASE, HEADS_BASE],
    ids=["full", "full_reordered", "minimal", "mixed", "base", "heads"],
)
def test_valid_specs_of_the_spec_tests_are_valid(text):
    VALIDATOR.validate(_document(text))


@pytest.mark.parametrize(
    "mask, select",
    [
        ("{spatial_window: {rows: 1}}", ""),
        ("{spatial_window: }", ""),
        ("{causal_frames: }", "select: {candidate: {text: }, top_k: {k: 3}}"),
        ("{causal_frames: }", "select: {candidate: {text: }, top_p: {p: 0.5, min: 1}}"),
    ],
)
def test_keys_with_defaults_may_be_left_out(mask, select):
    """spatial_window's frames (every frame) and select's max (the candidate's bound): the
    schema accepts what the reader accepts."""
    text = MINIMAL.replace("mask: {causal_frames: }", f"mask: {mask}\n{select}")
    parse_spec(text)
    VALIDATOR.validate(_document(text))


EXPRESSIBLE = [(c, t) for c, t in CASES if c not in NOT_EXPRESSIBLE]
INEXPRESSIBLE = [(c, t) for c, t in CASES if c in NOT_EXPRESSIBLE]


@pytest.mark.parametrize("case_id,text", EXPRESSIBLE, ids=[c for c, _ in EXPRESSIBLE])
def test_invalid_specs_are_rejected(case_id, text):
    """Rejected, and where svgen's error points (one key path contains the other)."""
    error = jsonschema.exceptions.best_match(VALIDATOR.iter_errors(_document(text)))
    assert error is not None, case_id
    with pytest.raises(SpecError) as info:
        parse_spec(text)
    key, path = info.value.key or "", error.json_path.removeprefix("$").removeprefix(".")
    assert key.startswith(path) or path.startswith(key), (key, error.json_path, error.message)


def test_the_inexpressible_cases_exist():
    assert set(NOT_EXPRESSIBLE) <= {c for c, _ in CASES}


@pytest.mark.parametrize("case_id,text", INEXPRESSIBLE, ids=[c for c, _ in INEXPRESSIBLE])
def test_what_the_schema_cannot_express_svgen_still_refuses(case_id, text):
    """The rules left out of the schema (NOT_EXPRESSIBLE says why) are svgen's reader's."""
    with pytest.raises(SpecError):
        parse_spec(text)


@pytest.mark.parametrize(
    "where,slot,key,minimum,maximum", INTEGER_PARAMS, ids=[p[2] for p in INTEGER_PARAMS]
)
def test_every_integer_parameter_has_its_range(where, slot, key, minimum, maximum):
    for value in (minimum, maximum):
        VALIDATOR.validate(_document(_limits_spec(where, slot, value)))
    for value in _bad_values(minimum, maximum):
        if key == "geometry.text_tokens" and value == maximum + 1:
            continue  # over only because the video adds a token: arithmetic between values
        assert not VALIDATOR.is_valid(_document(_limits_spec(where, slot, value))), value
