"""svgen.chip.kernel_fingerprint: the digests that prove a restructuring of the kernels left
them as they were. They must be stable, blind to where the code sits, and see any change
to what a kernel computes or how its grid reads its tables."""

from __future__ import annotations

import pathlib

from svgen.chip import kernel_fingerprint
from svgen.spec import load_spec

BOUNDED = pathlib.Path("bench/specs/features/bounded.yaml")


def _trace():
    return kernel_fingerprint.fingerprint(load_spec(BOUNDED, chip="v5e"), "v5e")


def test_digests_are_stable_and_cover_every_call_of_the_module():
    first, second = _trace(), _trace()
    assert first == second
    assert sorted(first) == ["forward", "grad", "grad, dq unfused", "softmax_modes"]
    assert [name for name, _ in first["grad"]] == ["svgen_attention", "svgen_attention_dkv"]
    unfused = [name for name, _ in first["grad, dq unfused"]]
    assert unfused == ["svgen_attention", "svgen_attention_dq", "svgen_attention_dkv"]
    # the forward of grad saves lse: another kernel than the plain forward
    assert first["grad"][0][1] != first["forward"][0][1]


def test_a_change_to_the_kernel_body_or_its_index_maps_changes_its_digest(monkeypatch):
    from svgen.runtime import forward, steps

    before = _trace()
    monkeypatch.setattr(forward, "MASK_VALUE", forward.MASK_VALUE / 2)
    body = _trace()
    assert body["forward"] != before["forward"]
    monkeypatch.undo()
    # the grid's table reads, which only the index maps hold
    real = steps.StepView.kv_block
    monkeypatch.setattr(steps.StepView, "kv_block", lambda self, slot: real(self, slot) + 1)
    assert _trace()["forward"] != before["forward"]


def test_source_locations_do_not_count():
    from svgen.chip.fingerprint import digest

    assert digest("kernel at /a/svgen/runtime/forward.py:147 x") == digest(
        "kernel at /b/svgen/runtime/forward.py:203 x"
    )
    assert digest("mul a 2.0") != digest("mul a 3.0")


def test_differences_name_each_changed_call():
    before = {"a.yaml": {"forward": [["svgen_attention", "1"]], "grad": [["x", "2"]]}}
    after = {"a.yaml": {"forward": [["svgen_attention", "9"]], "grad": [("x", "2")]}}
    (line,) = kernel_fingerprint.differences(before, after)
    assert line.startswith("a.yaml forward:")
    assert kernel_fingerprint.differences(before, {}) == []  # not traced: not compared
