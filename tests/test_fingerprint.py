"""svgen.chip.fingerprint: what `svgen bench` times, digested on a CPU host. The committed
references must be what HEAD's code gives (recomputed here for two small specs), the
fingerprint must be of the calls bench times (its fixed head assignment, kernel order), and it
must see the tables' contents and the ops around the kernels but not where code sits."""

from __future__ import annotations

import json
import pathlib


from helpers import REPO
from svgen.chip import chip_bench, fingerprint
from svgen.spec import load_spec

SMALL = ("examples/first_kernel.yaml", "examples/dit_small.yaml")
FAILURE = (
    "the kernels svgen bench times changed (a change to svgen.runtime, svgen.codegen or the "
    "specs): if that is meant, run `svgen fingerprint --write` and commit "
    "bench/results/fingerprints.json; results timed before no longer match HEAD"
)


def _spec(path: str):
    return load_spec(REPO / path, chip=fingerprint.REFERENCE_TARGET)


def test_the_committed_references_are_what_heads_code_gives():
    committed = json.loads((REPO / fingerprint.REFERENCES).read_text())
    import jax

    assert committed["jax"] == jax.__version__, "references of another JAX: rewrite them"
    found = {path: chip_bench.fingerprint_spec(_spec(path), "v5e") for path in SMALL}
    assert fingerprint.differences(committed["specs"], found) == [], FAILURE


def test_the_references_cover_every_shipped_spec():
    committed = json.loads((REPO / fingerprint.REFERENCES).read_text())["specs"]
    assert sorted(committed) == sorted(fingerprint.reference_paths(REPO))
    assert all(f"specs/{p.name}" in committed for p in (REPO / "specs").glob("*.yaml"))


def test_it_is_of_the_fixed_assignment_in_kernel_order_that_bench_times():
    spec = _spec("examples/dit_small.yaml")
    found = chip_bench.fingerprint_spec(spec, "v5e")
    # dit_small's heads pick their pattern at run time: bench times head i on pattern i % 2
    assert found["head_patterns"] == ["spatial", "temporal"] * 4
    assert [name for name, _ in found["backward"]["kernels"]] == [
        "svgen_attention",
        "svgen_attention_dkv",
    ]
    with _module(spec) as module:
        other = chip_bench.fingerprint_module(module, (0,) * 8, ("forward",))
        kernel = chip_bench.fingerprint_module(module, (0, 1) * 4, ("forward",))
    assert kernel["forward"] == found["forward"]
    assert other["forward"] != found["forward"]  # another assignment is another program


def test_bench_records_the_fingerprint_of_what_it_timed():
    spec = _spec("examples/first_kernel.yaml")
    options = chip_bench.Options(warmup=0, iters=1, splash=False, check_rows=0, interpret=True)
    result = chip_bench.bench_spec(spec, "v5e", options, env={})
    reference = chip_bench.fingerprint_spec(spec, "v5e", ("forward",))
    assert result["fingerprint"] == {"forward": reference["forward"]}


def test_constants_and_the_ops_around_the_kernel_count_and_the_kernels_body_does_not():
    hlo = (
        "%c = stablehlo.constant dense<[1, 2]> : tensor<2xi32>\n"
        '%0 = stablehlo.custom_call @tpu_custom_call(%c) {backend_config = "{\\22custom_call_'
        'config\\22: {\\22body\\22: \\22QUJD\\22, \\22serialization_format\\22: 1}}"}\n'
        "%1 = stablehlo.add %0, %0 : tensor<2xi32>\n"
    )
    base = fingerprint.program_digests(hlo)
    table = fingerprint.program_digests(hlo.replace("[1, 2]", "[1, 3]"))
    assert table["constants"] != base["constants"] and table["program"] != base["program"]
    around = fingerprint.program_digests(hlo.replace("stablehlo.add", "stablehlo.multiply"))
    assert around["constants"] == base["constants"] and around["program"] != base["program"]
    # the Mosaic body embeds file paths and lines: the kernel's own digest stands for it
    body = fingerprint.program_digests(hlo.replace("QUJD", "WFla"))
    assert body == base


def test_a_changed_table_changes_the_fingerprint_of_a_real_module():
    import dataclasses

    spec = _spec("examples/first_kernel.yaml")
    with _module(spec) as module:
        before = chip_bench.fingerprint_module(module, (0, 0), ("forward",))["forward"]
        tables = module.attention.tables  # the scalar-prefetch tables the kernel walks
        entries = tables.entries.copy()
        entries[-1] ^= 1  # one step's word: same shapes, same kernel, other contents
        changed = dataclasses.replace(tables, entries=entries)
        object.__setattr__(module.attention, "tables", changed)
        after = chip_bench.fingerprint_module(module, (0, 0), ("forward",))["forward"]
    assert after["constants"] != before["constants"]
    assert after["kernels"] == before["kernels"]


def test_the_command_checks_and_writes_the_references(tmp_path, capsys):
    from svgen.cli import main

    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "examples").mkdir()
    for path in SMALL:
        (tmp_path / path).write_bytes((REPO / path).read_bytes())
    argv = ["fingerprint", *SMALL, "--root", str(tmp_path), "-q"]
    assert main([*argv, "--write"]) == 0
    assert main([*argv, "--check"]) == 0
    written = json.loads((tmp_path / fingerprint.REFERENCES).read_text())
    committed = json.loads((REPO / fingerprint.REFERENCES).read_text())
    assert written["specs"] == {p: committed["specs"][p] for p in SMALL}
    written["specs"][SMALL[0]]["forward"]["constants"] = "0" * 16
    (tmp_path / fingerprint.REFERENCES).write_text(json.dumps(written))
    capsys.readouterr()
    assert main([*argv, "--check"]) == 1
    assert "examples/first_kernel.yaml forward constants" in capsys.readouterr().out


def test_differences_name_the_part_that_changed():
    before = {"a.yaml": {"tiling": {}, "forward": {"kernels": [["k", "1"]], "constants": "c"}}}
    after = {"a.yaml": {"tiling": {}, "forward": {"kernels": [["k", "1"]], "constants": "d"}}}
    assert fingerprint.differences(before, after) == ["a.yaml forward constants: c -> d"]
    assert fingerprint.differences({}, after) == ["a.yaml: no reference"]


class _module:
    """The spec compiled as bench compiles it, imported, for the block's length."""

    def __init__(self, spec):
        import tempfile

        self._folder = tempfile.TemporaryDirectory(prefix="svgen-fp-test-")
        _, self.module = chip_bench.compile_module(spec, "v5e", pathlib.Path(self._folder.name))

    def __enter__(self):
        return self.module

    def __exit__(self, *exc):
        self._folder.cleanup()
