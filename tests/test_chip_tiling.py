"""A tiling per chip: `tiling: {<plain keys>, v5e: {...}}`. The reader (the chip's own tiling
or the plain keys', every chip's checked), the digest, the schema, `svgen tune --apply` for a
chip, and the chip carried through the commands (plan_spec, the docstring, inspect)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from helpers import REPO, SPECS
from svgen import cli, codegen
from svgen.analysis.targets import TARGETS
from svgen.cli.plan import plan_spec
from svgen.cli.tune import apply_chip, apply_measured
from svgen.estimate import tune
from svgen.estimate.tune import Candidate, rewrite_tiling
from svgen.spec import TPU_CHIPS, SpecError, Tiling, load_spec, parse_spec
from svgen.spec.limits import MAX_SEQ_LEN
from svgen.spec.schema import spec_schema
from tune_helpers import SPEC as SMALL_BAND
from tune_helpers import fake_measure

# Line 9 is `tiling:`; the chip keys are on lines 15 (v7x) and 16 (v5e).
CHIPS = """\
svgen: 1
name: chips
geometry: {frames: 5, height: 8, width: 26}
attention: {heads: 2, head_dim: 128, dtype: bfloat16}
layout: frame_major
mask:
  any_of:
    - band: {width: 200}
tiling:
  block_q: 2048     # the plain keys: every chip not named
  block_kv: 4096
  compute_q: 1024
  compute_kv: 1024
  align: nearest
  v7x: {block_q: 512, block_kv: 1024, compute_q: 512, compute_kv: 512}
  v5e: {block_q: 1024, block_kv: 1024}
"""

PLAIN = Tiling(2048, 4096, 1024, 1024, "nearest")
V5E = Tiling(1024, 1024, None, None, "nearest")
V7X = Tiling(512, 1024, 512, 512, "nearest")


def _with_v5e(chip_tiling: str) -> str:
    old = "  v5e: {block_q: 1024, block_kv: 1024}\n"
    assert CHIPS.count(old) == 1
    return CHIPS.replace(old, chip_tiling)


# ----------------------------------------------------------------------------- reading


def test_the_chips_are_the_tpu_targets():
    assert TPU_CHIPS == tuple(TARGETS)


def test_each_chip_gets_its_own_tiling_or_the_plain_one():
    plain = parse_spec(CHIPS)
    assert plain.tiling == PLAIN and plain.tiling_chip is None and plain.plain_tiling is None
    # TARGETS order, whatever the file's; the plain align applies to every chip's.
    assert plain.tilings == (("v5e", V5E), ("v7x", V7X))
    v5e = parse_spec(CHIPS, chip="v5e")
    assert v5e.tiling == V5E and v5e.tiling_chip == "v5e" and v5e.plain_tiling == PLAIN
    assert parse_spec(CHIPS, chip="v7x").tiling == V7X
    v6e = parse_spec(CHIPS, chip="v6e")  # not named: the plain keys'
    assert v6e.tiling == PLAIN and v6e.tiling_chip is None and v6e.tilings == plain.tilings
    for spec in (plain, v5e, v6e):
        assert [spec.tiling_for(c) for c in (None, "v5e", "v6e", "v7x")] == [PLAIN, V5E, PLAIN, V7X]
        assert [spec.tiling_source(c) for c in (None, "v5e", "v6e", "v7x")] == [
            "tiling",
            "tiling.v5e",
            "tiling",
            "tiling.v7x",
        ]


def test_a_chip_tiling_inherits_nothing_but_align():
    spec = parse_spec(_with_v5e("  v5e: {block_kv: 1024}\n"), chip="v5e")
    assert spec.tiling == Tiling(512, 1024, None, None, "nearest")  # defaults, not 2048 / 1024
    assert parse_spec(_with_v5e("  v5e: {}\n"), chip="v5e").tiling == Tiling(
        512, 512, align="nearest"
    )


def test_a_spec_without_chip_keys_reads_the_same_for_every_chip():
    import re

    shipped = (REPO / "specs" / "wan21_720p_spatial.yaml").read_text()
    text = re.sub(r", v5e: \{[^}]*\}", "", shipped)  # the shipped spec without its chip key
    assert text != shipped
    plain = parse_spec(text)
    assert plain.tilings == ()
    for chip in TPU_CHIPS:
        assert parse_spec(text, chip=chip) == plain


def test_load_spec_takes_the_chip(tmp_path):
    path = tmp_path / "chips.yaml"
    path.write_text(CHIPS)
    assert load_spec(path, chip="v5e").tiling == V5E
    assert load_spec(path).tiling == PLAIN


def test_an_unknown_chip_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown chip 'h100'"):
        parse_spec(CHIPS, chip="h100")


BAD = [
    (
        "align_in_a_chip",
        _with_v5e("  v5e: {block_q: 1024, align: exact}\n"),
        "chips.yaml:16:24: tiling.v5e.align: align is set once for all chips, at tiling.align: "
        "it changes the mask, which must not depend on the chip",
    ),
    (
        "not_a_mapping",
        _with_v5e("  v5e: 1024\n"),
        "chips.yaml:16:8: tiling.v5e: must be a mapping {block_q, block_kv, compute_q, "
        "compute_kv} (v5e's own tiling), got an integer (1024)",
    ),
    (
        "null",
        _with_v5e("  v5e:\n"),
        "chips.yaml:16:7: tiling.v5e: must be a mapping {block_q, block_kv, compute_q, "
        "compute_kv} (v5e's own tiling), got null",
    ),
    (
        "a_list",
        _with_v5e("  v5e: [1024, 1024]\n"),
        "chips.yaml:16:8: tiling.v5e: must be a mapping {block_q, block_kv, compute_q, "
        "compute_kv} (v5e's own tiling), got a list",
    ),
    (
        "unknown_key",
        _with_v5e("  v5e: {block_q: 1024, warps: 4}\n"),
        "chips.yaml:16:24: tiling.v5e.warps: unknown key 'warps'; allowed keys: block_q, "
        "block_kv, compute_q, compute_kv",
    ),
    (
        "a_chip_in_a_chip",
        _with_v5e("  v5e: {v6e: {block_q: 1024}}\n"),
        "chips.yaml:16:9: tiling.v5e.v6e: unknown key 'v6e'; allowed keys: block_q, "
        "block_kv, compute_q, compute_kv",
    ),
    (
        "bad_block",
        _with_v5e("  v5e: {block_q: 1000}\n"),
        "chips.yaml:16:18: tiling.v5e.block_q: block_q must be a multiple of 128 between 128 "
        "and 8192 (TPU tiles are 8x128 and the VMEM budget), got 1000",
    ),
    (
        "compute_not_dividing",
        _with_v5e("  v5e: {block_q: 1024, compute_q: 384}\n"),
        "chips.yaml:16:35: tiling.v5e.compute_q: compute_q must divide block_q (1024): a tile "
        "is cut into whole compute blocks, got 384",
    ),
    (
        "too_many_compute_blocks",
        _with_v5e("  v5e: {block_q: 1024, block_kv: 1024, compute_q: 128, compute_kv: 256}\n"),
        "chips.yaml:16:68: tiling.v5e.compute_kv: at most 16 compute blocks per tile (their "
        "kinds take 2 bits each of one SMEM word), got 8 x 4 = 32",
    ),
    (
        "a_gpu",
        _with_v5e("  h100: {block_q: 1024}\n"),
        "chips.yaml:16:3: tiling.h100: unknown key 'h100'; allowed keys: block_q, block_kv, "
        "compute_q, compute_kv, align, v5e, v6e, v7x",
    ),
    (
        "duplicate_chip",
        _with_v5e("  v5e: {block_q: 1024}\n  v5e: {block_q: 512}\n"),
        "chips.yaml:17:3: tiling.v5e: duplicate key 'v5e' (first given on line 16)",
    ),
]


@pytest.mark.parametrize("case,text,message", BAD, ids=[c for c, _, _ in BAD])
@pytest.mark.parametrize("chip", [None, "v5e", "v6e"])
def test_a_bad_chip_tiling_is_refused_where_it_is_written(case, text, message, chip):
    """Whichever chip the spec is read for: a spec read for one chip reads for every one."""
    with pytest.raises(SpecError) as info:
        parse_spec(text, source="chips.yaml", chip=chip)
    assert str(info.value) == message


def test_a_chip_tiling_is_checked_against_the_tile_grid():
    text = (
        "svgen: 1\nname: big\n"
        f"geometry: {{frames: 1, height: 1, width: {MAX_SEQ_LEN}}}\n"
        "attention: {heads: 1, head_dim: 64, dtype: float32}\nmask: {causal_frames: }\n"
        "tiling:\n  block_q: 1024\n  block_kv: 1024\n"
        "  v7x: {block_q: 512, block_kv: 512, compute_q: 128, compute_kv: 128}\n"
    )
    parse_spec(
        text.replace(
            "block_q: 512, block_kv: 512, compute_q: 128, compute_kv: 128", "block_q: 2048"
        )
    )
    for chip in (None, "v6e", "v7x"):
        with pytest.raises(SpecError) as info:
            parse_spec(text, source="big.yaml", chip=chip)
        assert (info.value.line, info.value.column, info.value.key) == (9, 8, "tiling.v7x")
        assert "MAX_TILE_PAIRS" in info.value.message


def test_a_chip_tiling_is_checked_against_the_kv_cache_chunks():
    text = (
        "svgen: 1\nname: chunks\ngeometry: {frames: 60, height: 45, width: 80}\n"
        "attention: {heads: 1, head_dim: 64, dtype: float32}\nmask: {causal_frames: }\n"
        "tiling:\n  block_q: 1024\n  block_kv: 1024\n"
        "  v5e: {block_q: 1024, block_kv: 1024, compute_kv: 128}\n"
        "runtime: {kv_cache: {chunk_frames: 3}}\n"
    )
    parse_spec(text.replace("compute_kv: 128", "compute_kv: 512"))  # chunks 16 rows apart: fits
    for chip in (None, "v5e", "v6e"):
        with pytest.raises(SpecError) as info:
            parse_spec(text, source="chunks.yaml", chip=chip)
        assert str(info.value).startswith(
            "chunks.yaml:10:10: runtime.kv_cache: with tiling.v5e: chunks of 10,800 tokens "
            "start 16 row(s) apart from the compute_q of 1024"
        )


def test_kv_cache_refuses_the_plain_align_for_every_chip():
    text = (
        "svgen: 1\nname: chunks\ngeometry: {frames: 6, height: 4, width: 4}\n"
        "attention: {heads: 1, head_dim: 64, dtype: float32}\nmask: {causal_frames: }\n"
        "tiling: {block_q: 128, block_kv: 128, align: balanced, v5e: {block_q: 256}}\n"
        "runtime: {kv_cache: {chunk_frames: 2}}\n"
    )
    with pytest.raises(SpecError, match="needs tiling.align: exact"):
        parse_spec(text, chip="v5e")


# ----------------------------------------------------------------------------- the digest


def test_digests_of_specs_without_chip_keys_are_unchanged():
    """The spec-sha256 of every committed generated module is its spec's digest, for every
    chip it could be read for."""
    for path in SPECS:
        spec = load_spec(path)
        module = (REPO / "generated" / f"{spec.name}.py").read_text()
        header = codegen.parse_header(module)
        assert header is not None and header.spec_digest == spec.digest, path.name
        assert load_spec(path, chip="v6e").digest == spec.digest  # the plain tiling is v6e's
        if not spec.tilings:
            assert {load_spec(path, chip=c).digest for c in TPU_CHIPS} == {spec.digest}


def test_the_digest_covers_the_chip_tilings_and_the_one_in_effect():
    digest = {c: parse_spec(CHIPS, chip=c).digest for c in (None, *TPU_CHIPS)}
    assert digest[None] == digest["v6e"]  # the same tiling in effect, the same spec
    assert len({digest[None], digest["v5e"], digest["v7x"]}) == 3
    without = "\n".join(
        line for line in CHIPS.splitlines() if "v5e" not in line and "v7x" not in line
    )
    assert parse_spec(without).digest != digest[None]  # naming chips changes it
    other = _with_v5e("  v5e: {block_q: 1024, block_kv: 2048}\n")
    assert parse_spec(other).digest != digest[None]  # v6e's module says which chips differ
    assert parse_spec(other, chip="v5e").digest != digest["v5e"]
    restyled = _with_v5e("  v5e:\n    block_kv: 1024   # kv\n    block_q: 1024\n")
    assert parse_spec(restyled, chip="v5e").digest == digest["v5e"]


# ----------------------------------------------------------------------------- the schema


def test_the_schema_takes_chip_tilings_and_refuses_align_in_them():
    validator = jsonschema.Draft202012Validator(spec_schema())
    validator.validate(yaml.safe_load(CHIPS))
    beyond = {"duplicate_chip", "compute_not_dividing", "too_many_compute_blocks"}
    for case, text, _ in BAD:
        if case not in beyond:  # duplicate keys, arithmetic between values: beyond JSON Schema
            assert not validator.is_valid(yaml.safe_load(text)), case


# ----------------------------------------------------------------------------- --apply


def test_rewrite_tiling_for_a_chip_keeps_comments_and_the_plain_keys():
    text, changes = rewrite_tiling(CHIPS, Candidate(2048, 1024, 1024, 512, "nearest"), chip="v5e")
    assert text == CHIPS.replace(
        "  v5e: {block_q: 1024, block_kv: 1024}\n",
        "  v5e: {block_q: 2048, block_kv: 1024, compute_q: 1024, compute_kv: 512}\n",
    )
    assert changes == [
        "v5e.block_q: 1024 -> 2048",
        "v5e.compute_q: (not given) -> 1024",
        "v5e.compute_kv: (not given) -> 512",
    ]
    back = parse_spec(text, chip="v5e")
    assert back.tiling == Tiling(2048, 1024, 1024, 512, "nearest")
    assert back.tiling_for(None) == PLAIN and back.tiling_for("v7x") == V7X


def test_rewrite_tiling_for_a_chip_the_spec_does_not_name():
    text, changes = rewrite_tiling(CHIPS, Candidate(512, 512, 512, 512, "nearest"), chip="v6e")
    assert text == CHIPS + "  v6e: {block_q: 512, block_kv: 512}\n"
    assert changes == ["v6e.block_q: (not given) -> 512", "v6e.block_kv: (not given) -> 512"]
    missing = SMALL_BAND.split("# the tiling")[0]
    text, _ = rewrite_tiling(missing, Candidate(1024, 1024, 1024, 1024, "exact"), chip="v5e")
    assert text.startswith(missing)
    assert text.endswith("tiling: {v5e: {block_q: 1024, block_kv: 1024}}\n")
    assert parse_spec(text, chip="v5e").tiling == Tiling(1024, 1024)
    assert parse_spec(text).tiling == Tiling(512, 512)


def test_rewrite_tiling_for_a_chip_writes_align_at_the_plain_level():
    text, changes = rewrite_tiling(CHIPS, Candidate(1024, 1024, 1024, 1024, "exact"), chip="v5e")
    assert changes == ["align: nearest -> exact"]
    assert "  align: exact\n" in text and "v5e: {block_q: 1024, block_kv: 1024}" in text
    assert parse_spec(text, chip="v7x").tiling.align == "exact"


def test_rewrite_tiling_for_a_chip_round_trips_unchanged():
    for chip in ("v5e", "v7x"):
        t = parse_spec(CHIPS, chip=chip).tiling
        same, changes = rewrite_tiling(
            CHIPS, Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align), chip=chip
        )
        assert same == CHIPS and changes == [], chip


def test_rewrite_tiling_refuses_an_anchored_chip_tiling():
    text = _with_v5e("  v5e: &small {block_q: 1024, block_kv: 1024}\n")
    with pytest.raises(SpecError) as info:
        rewrite_tiling(text, Candidate(512, 512, 512, 512, "nearest"), source="c.yaml", chip="v5e")
    assert (info.value.line, info.value.column, info.value.key) == (16, 3, "tiling.v5e")
    assert "&small" in info.value.message


def _spec_file(tmp_path, text=CHIPS):
    path = tmp_path / "chips.yaml"
    path.write_text(text)
    return path


def test_apply_writes_where_the_tuned_tiling_came_from(tmp_path):
    path = _spec_file(tmp_path)
    assert apply_chip(path, "v5e") == "v5e"
    assert apply_chip(path, "v6e") is None  # v6e has the plain keys: --apply rewrites them


def test_tune_apply_for_a_named_chip_rewrites_its_tiling_only(tmp_path, monkeypatch, capsys):
    path = _spec_file(tmp_path)
    monkeypatch.setattr(tune, "_compile_measure", lambda spec_path: fake_measure([]))
    assert cli.main(["tune", str(path), "--target", "v5e", "--apply"]) == 0
    err = capsys.readouterr().err
    new = path.read_text()
    changed = [(a, b) for a, b in zip(CHIPS.splitlines(), new.splitlines()) if a != b]
    assert len(new.splitlines()) == len(CHIPS.splitlines())
    assert [a for a, _ in changed] == ["  v5e: {block_q: 1024, block_kv: 1024}"], changed
    assert "tiling v5e.block_q" in err or "tiling v5e.block_kv" in err
    choice = tune.tune(str(tmp_path / "chips.yaml"), target="v5e", measure=fake_measure([]))
    c = choice.choice.candidate
    spec = load_spec(path, chip="v5e")
    assert (spec.tiling.block_q, spec.tiling.block_kv, spec.tiling.cq, spec.tiling.ckv) == (
        c.block_q,
        c.block_kv,
        c.compute_q,
        c.compute_kv,
    )
    assert spec.tiling_for(None) == PLAIN and spec.tiling_for("v7x") == V7X


def test_tune_reads_the_spec_for_its_target(tmp_path):
    path = _spec_file(tmp_path)
    result = tune.tune(str(path), target="v5e", measure=fake_measure([]))
    (current,) = [r.candidate for r in result.rows if r.current]
    assert current == Candidate(1024, 1024, 1024, 1024, "nearest")  # v5e's, not the plain
    assert result.spec.tiling_chip == "v5e"


def test_apply_measured_creates_the_chip_tiling(tmp_path, capsys):
    path = _spec_file(tmp_path, SMALL_BAND)
    apply_measured(str(path), (1024, 1024, 1024, 512), "exact", "v5e")
    text = path.read_text()
    assert text.startswith(SMALL_BAND.split("tiling:")[0])
    assert "# tuned later" in text and "# the tiling, as a flow mapping" in text
    spec = load_spec(path, chip="v5e")
    assert spec.tiling == Tiling(1024, 1024, 1024, 512)
    assert load_spec(path).tiling == Tiling(512, 512)  # the plain keys as they were
    assert "v5e.compute_kv: (not given) -> 512" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the commands
# The commands below carry the chip's tiling; the program-size count they would take (a libtpu
# compile of the kernel and its gradient, minutes at the plain 2048 x 4096 tiles) is
# tests/test_program_size.py's, so they leave it out.
UNCOUNTED = ("--no-size-check",)
QUIET = ("-q", *UNCOUNTED)


def test_plan_spec_picks_the_targets_tiling(tmp_path):
    path = str(_spec_file(tmp_path))
    plan = plan_spec(path, quiet=True, smem_budget=1 << 20, target="v5e", warn=False)
    assert (plan.grid.block_q, plan.grid.block_kv) == (1024, 1024)
    plan = plan_spec(path, quiet=True, smem_budget=1 << 20, target="v6e", warn=False)
    assert (plan.grid.block_q, plan.grid.block_kv) == (2048, 4096)
    plan = plan_spec(path, quiet=True, smem_budget=1 << 20, target="v7x", warn=False)
    assert (plan.grid.block_q, plan.grid.block_kv) == (512, 1024)


def test_the_module_and_inspect_say_which_tiling_is_in_effect(tmp_path, capsys):
    path = _spec_file(tmp_path)
    lines = {}
    for target in ("v5e", "v6e"):
        out = tmp_path / target
        assert cli.main(["compile", str(path), "--target", target, "--out", str(out), *QUIET]) == 0
        module = (out / "chips.py").read_text()
        lines[target] = [line for line in module.splitlines() if line.startswith("Target: ")]
    assert lines["v5e"][0].startswith("Target: v5e (tiling.v5e); VMEM ")
    assert lines["v6e"][0].startswith("Target: v6e (the plain tiling: no tiling.v6e); VMEM ")
    capsys.readouterr()
    assert cli.main(["inspect", str(path), "--target", "v5e", "--json", *UNCOUNTED]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["tiling_chip"], summary["tiling_from"], summary["block_q"]) == (
        "v5e",
        "tiling.v5e",
        1024,
    )
    assert cli.main(["inspect", str(path), "--json", *UNCOUNTED]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["tiling_chip"], summary["tiling_from"]) == ("v6e", "tiling")
    assert cli.main(["inspect", str(path), "--target", "v5e", *UNCOUNTED]) == 0
    assert "  Target: v5e (tiling.v5e); VMEM" in capsys.readouterr().out


def test_inspect_of_a_spec_without_chip_keys_has_no_tiling_source(tmp_path, capsys):
    path = tmp_path / "small_band.yaml"
    path.write_text(SMALL_BAND)
    assert cli.main(["inspect", str(path), "--target", "v5e", "--json", *UNCOUNTED]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert "tiling_chip" not in summary and "tiling_from" not in summary
    assert cli.main(["inspect", str(path), "--target", "v5e", *UNCOUNTED]) == 0
    assert "  Target: v5e; VMEM" in capsys.readouterr().out


def test_a_refusal_of_the_chips_tiling_points_at_it(tmp_path, capsys):
    path = _spec_file(tmp_path, _with_v5e("  v5e: {block_q: 8192, block_kv: 8192}\n"))
    out = tmp_path / "out"
    assert cli.main(["compile", str(path), "--target", "v5e", "--out", str(out), *QUIET]) == 2
    err = capsys.readouterr().err
    assert f"{path}:16:8: tiling.v5e: the kernel needs" in err and "on v5e" in err
    assert cli.main(["compile", str(path), "--target", "v6e", "--out", str(out), *QUIET]) == 0
