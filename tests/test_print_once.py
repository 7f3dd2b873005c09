"""Each mask is printed once per compile (issue 60, item 5): the analysis prints every mask
function a module holds (svgen.analysis.mask_functions), counts its query values for the
VMEM check from that print, the plan carries it, and codegen places it in the module as it
is, reading nothing back out of the printed code."""

from __future__ import annotations

import collections

import pytest

from helpers import REPO
from svgen import codegen
from svgen.analysis import analyze, mask_code
from svgen.spec import load_spec

MIXED = REPO / "specs" / "cogvideox_mixed.yaml"


@pytest.fixture
def prints(monkeypatch) -> collections.Counter:
    """How many times each mask function (by name) is printed: every print, whoever asks
    for it, starts an emitter (mask_code.emit_mask)."""
    counted: collections.Counter = collections.Counter()
    printer = mask_code._Emitter

    class Counting(printer):
        def __init__(self, layout, owner, shared):
            counted[owner] += 1
            super().__init__(layout, owner, shared)

    monkeypatch.setattr(mask_code, "_Emitter", Counting)
    return counted


def _mask_functions(plan) -> list[str]:
    """The names of the mask functions the plan's module holds: per pattern its whole
    mask's and its residual masks'."""
    names = []
    for pattern in plan.patterns:
        names.append(pattern.mask_functions.boundary_name)
        names += pattern.mask_functions.residual_names
    return names


def test_a_multi_pattern_compile_prints_each_mask_once(prints):
    plan = analyze(load_spec(MIXED), target_name="v5e")
    files = codegen.render(plan, "specs/cogvideox_mixed.yaml")
    functions = _mask_functions(plan)
    # Two patterns, each a whole mask and three residual masks: once each, 18 prints before.
    assert len(plan.patterns) == 2 and len(functions) == 8
    assert prints == {name: 1 for name in functions}
    module = files["cogvideox_mixed.py"].decode()
    assert all(f"def {name}(" in module for name in functions)


def test_the_module_keeps_the_query_values_the_analysis_counted(compile_text):
    """The query values each pattern's kernel keeps (its query_coords: coordinates, then
    query functions) are the ones the VMEM check counted, from the same print."""
    plan, module = compile_text(MIXED.read_text(), target_name="v5e")
    for pattern, kept in zip(plan.patterns, module.attention.patterns, strict=True):
        printed = pattern.mask_functions
        names = [c if isinstance(c, str) else c.__name__ for c in kept.query_coords]
        assert names == [*printed.query_coords, *printed.query_functions]
        assert printed.value_count == len(names) > 0


def test_no_regex_reads_printed_code():
    """The analysis and codegen note what printed code reads as they print it: no module
    of theirs imports re but the header's (it reads a generated file's header from disk)."""
    sources = sorted((REPO / "svgen" / "analysis").glob("*.py"))
    sources += sorted((REPO / "svgen" / "codegen").glob("*.py"))
    importing = [p.name for p in sources if "\nimport re\n" in p.read_text()]
    assert importing == ["header.py"]
