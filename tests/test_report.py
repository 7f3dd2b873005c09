"""`svgen report`: docs/measured.md's tables and the README's headline come from the chip's
results (bench/results), byte for byte. The committed pages must be what the committed results
give; on small synthetic results every figure must land where it belongs, the newest timing
must win, and Splash figures of the older harness must never be shown as current."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from helpers import REPO
from svgen.cli import main
from svgen.chip import results_page as rp
from svgen.chip import results_tables as rt

REGENERATE = "run `svgen report` (after adding the results file to bench/results/manifest.json)"


# ----------------------------------------------------------------------------- the real pages
def test_the_committed_pages_are_what_the_committed_results_give():
    for page, (now, wanted) in rt.pages(REPO).items():
        assert now == wanted, f"{page} is behind bench/results: {REGENERATE}"


def test_the_chip_figures_svgen_quotes_are_what_the_results_give():
    found = rp.facts(rp.load(REPO))
    assert rp.fact_mismatches(found) == [], "update svgen.analysis.targets.V5E_MEASURED"
    # the cliff is a cliff: nothing that ran at its work's rate is larger than a slow program
    assert found["program_fast_bundles"] < found["program_slow_bundles"]


def test_the_page_stays_a_current_page():
    assert len((REPO / rt.PAGE).read_text().splitlines()) <= 600


def test_report_check_passes_on_the_checkout(capsys):
    assert main(["report", "--check", "--root", str(REPO)]) == 0


# ----------------------------------------------------------------------------- synthetic
SPEC = "specs/tiny.yaml"
# The results page's generated sections, each an empty pair of markers.
PAGE = "# Measured\n\n" + "".join(
    f"<!-- svgen report: {name} (generated) -->\n<!-- svgen report: end of {name} -->\n"
    for name in ("at-head", "vs-splash", "cliff", "tilings", "left-out", "model", "files")
)
README = """# svgen

<!-- svgen report: headline (generated) -->
<!-- svgen report: end of headline -->
"""
T128 = {"block_q": 128, "block_kv": 128, "compute_q": 128, "compute_kv": 128, "align": "exact"}
T256 = {"block_q": 128, "block_kv": 256, "compute_q": 128, "compute_kv": 128, "align": "exact"}


def _bench(results: list[dict], search: bool) -> dict:
    return {
        "chip": "v5e",
        "versions": {"jax": "0.10.2", "libtpu": "0.0.42.1", "device_kind": "TPU v5 lite"},
        "commit": "stale+",
        "source_digest": "0123456789abcdef",
        "complete": True,
        "options": {"splash_blocks": "search" if search else [1024, 1024, 512]},
        "results": results,
    }


def _result(tiling: dict, svgen: float, splash: float | None = None, backward=None) -> dict:
    out = {"spec": "tiny", "source": SPEC, "tiling": tiling, "svgen_forward": {"median_ms": svgen}}
    if backward is not None:
        out["svgen_backward"] = {"median_ms": backward}
    if splash is not None:
        out["splash_mask_forward"] = {"median_ms": splash, "label": "data 1024/1024/512"}
        out["splash_dense_forward"] = {"median_ms": 4 * splash, "blocks": [2048, 1024, 1024]}
    return out


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    """A checkout of one spec (the README's first kernel, 128 x 128 tiles), its pages and
    four results: an old run with the older harness's Splash, a newer one with Splash at its
    best, a kernel_ab run of the cliff and the programs' sizes."""
    (tmp_path / "specs").mkdir()
    shutil.copy(REPO / "examples" / "first_kernel.yaml", tmp_path / SPEC)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "measured.md").write_text(PAGE)
    (tmp_path / "README.md").write_text(README)
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    files = {
        "old.json": _bench([_result(T128, 2.0, splash=20.0, backward=7.0)], search=False),
        "new.json": _bench([_result(T128, 1.5, splash=1.8), _result(T256, 9.0)], search=True),
        "cliff.json": {
            "source_digest": "0123456789abcdef",
            "runtime_before": {"straight.MAX_WORDS": 0},
            "variants": ["before", "straight.MAX_WORDS=6"],
            "specs": [
                {
                    "spec": "tiny",
                    "source": SPEC,
                    "tiling": T256,
                    "svgen_forward": {"median_ms": 1.2},
                    "variants": {
                        "before": {"forward": {"median_ms": 1.25}},
                        "straight.MAX_WORDS=6": {"forward": {"median_ms": 3.0}},
                    },
                }
            ],
        },
        "sizes.json": {
            "source_digest": "0123456789abcdef",
            "results": [
                {"source": SPEC, "tiling": "128x256/128x128", "runtime": {}, "bundles": 50_000},
                {
                    "source": SPEC,
                    "tiling": "128x256/128x128",
                    "runtime": {"straight.MAX_WORDS": 0},
                    "bundles": 40_000,
                },
                {
                    "source": SPEC,
                    "tiling": "128x256/128x128",
                    "runtime": {"straight.MAX_WORDS": 6},
                    "bundles": 90_000,
                },
            ],
        },
    }
    for name, data in files.items():
        (results / name).write_text(json.dumps(data))
    manifest = {
        "headline": SPEC,
        "files": [
            {"file": "old.json", "commit": "aaaaaaa", "command": "svgen bench old"},
            {"file": "new.json", "commit": "bbbbbbb", "command": "svgen bench new"},
            {
                "file": "cliff.json",
                "commit": "ccccccc",
                "command": "kernel_ab",
                "sections": ["cliff"],
            },
            {
                "file": "sizes.json",
                "commit": "ddddddd",
                "command": "kernel_size",
                "sections": ["sizes"],
            },
        ],
    }
    (results / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path


@pytest.fixture
def targets_as_measured(monkeypatch):
    """svgen.analysis.targets' v5e record as the synthetic results give it."""
    import dataclasses

    from svgen.analysis import targets

    measured = dataclasses.replace(
        targets.V5E_MEASURED,
        program_fast_bundles=50_000,
        program_slow_bundles=90_000,
        program_slowdown=(2.5, 2.5),
    )
    v5e = dataclasses.replace(targets.TARGETS["v5e"], measured=measured)
    monkeypatch.setitem(targets.TARGETS, "v5e", v5e)


def _section(text: str, name: str) -> list[str]:
    start = text.index(f"<!-- svgen report: {name} (")
    end = text.index(f"<!-- svgen report: end of {name} -->")
    return text[start:end].splitlines()[1:]


def _page(root) -> str:
    return rt.pages(root)[rt.PAGE][1]


def test_at_head_takes_the_newest_timing_at_the_specs_tiling(root):
    (row,) = [line for line in _section(_page(root), "at-head") if line.startswith("| tiny")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "128x128"  # the spec's tiling, read from the spec at HEAD
    assert cells[2] == "1.50" and cells[3].startswith("bbbbbbb, [new.json]")  # the newer run
    # the backward was timed only by the old run: its figure stays, labelled with its commit
    assert cells[4] == "7.00" and cells[5].startswith("aaaaaaa, [old.json]")
    assert cells[6] == "not recorded"  # no fingerprint in these results


def test_splash_figures_come_from_the_yardstick_alone(root):
    rows = [line for line in _section(_page(root), "vs-splash") if line.startswith("| tiny")]
    (row,) = rows  # the old run's Splash (20 ms, a 10x ratio) is not shown
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:6] == ["1.50", "1.80 (data 1024/1024/512)", "1.20x"]
    assert cells[6:8] == ["7.20 (2048/1024/1024)", "4.80x"]
    assert cells[8] == "the spec's"
    assert "10.00x" not in _page(root)


def test_a_wrong_figure_fails_the_check(root, targets_as_measured):
    text = rt.pages(root)[rt.PAGE][1].replace("| 1.20x |", "| 1.25x |")
    (root / rt.PAGE).write_text(text)
    (root / rt.README).write_text(rt.pages(root)[rt.README][1])
    assert main(["report", "--check", "--root", str(root)]) == 1
    assert main(["report", "--root", str(root)]) == 0  # rewrites the page from the results
    assert main(["report", "--check", "--root", str(root)]) == 0
    assert "| 1.20x |" in (root / rt.PAGE).read_text()


def test_the_output_is_the_same_bytes_every_time(root, targets_as_measured):
    assert main(["report", "--root", str(root)]) == 0
    first = [(root / p).read_bytes() for p in (rt.PAGE, rt.README)]
    assert main(["report", "--root", str(root)]) == 0
    assert [(root / p).read_bytes() for p in (rt.PAGE, rt.README)] == first


def test_the_cliff_rows_and_what_they_say(root):
    rows = rp.cliff_rows(rp.load(root))
    # sorted by program size; each against the fastest kernel of the same tiling that fits
    assert [(r.bundles, r.ms) for r in rows] == [(40_000, 1.25), (50_000, 1.2), (90_000, 3.0)]
    assert [round(r.slowdown, 3) for r in rows] == [1.042, 1.0, 2.5]
    found = rp.facts(rp.load(root))
    assert found["program_fast_bundles"] == 50_000 and found["program_slow_bundles"] == 90_000
    assert found["program_slowdown"] == (2.5, 2.5)
    assert "every one of 90,000 or more ran 2.5-2.5x slower" in " ".join(_page(root).split())


def test_facts_that_disagree_with_the_targets_are_named(root):
    found = rp.facts(rp.load(root))
    lines = rp.fact_mismatches(found)
    assert any("program_fast_bundles is 64358, the results give 50000" in line for line in lines)
    assert main(["report", "--check", "--root", str(root)]) == 1


def test_the_readme_headline_is_the_specs_newest_yardstick_figure(root):
    line = " ".join(_section(rt.pages(root)[rt.README][1], "headline"))
    assert "`specs/tiny.yaml`" in line and "in 1.50 ms: 1.20x over Splash" in line
    assert "(1.80 ms)" in line and "commit bbbbbbb" in line and "`svgen bench new`" in line


def test_a_results_file_the_manifest_does_not_name_is_an_error(root, capsys):
    (root / "bench" / "results" / "stray.json").write_text("{}")
    assert main(["report", "--check", "--root", str(root)]) == 2
    assert "stray.json" in capsys.readouterr().err


def test_missing_markers_are_an_error(root, capsys):
    (root / rt.PAGE).write_text("# Measured\n")
    assert main(["report", "--root", str(root)]) == 2
    assert "no markers for at-head" in capsys.readouterr().err


def test_links_into_the_page_name_its_sections():
    """Other pages link to docs/measured.md's sections instead of repeating its figures: every
    such link must land on a heading (GitHub's anchors: lower case, punctuation dropped)."""
    import re

    page = (REPO / rt.PAGE).read_text()
    anchors = {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in page.splitlines()
        if line.startswith("#")
    }
    docs = [REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md")]
    for doc in docs:
        for anchor in re.findall(r"measured\.md#([\w-]+)", doc.read_text()):
            assert anchor in anchors, f"{doc.name} links to measured.md#{anchor}, not a heading"


def test_a_timing_with_code_left_out_is_not_the_specs_figure(root):
    """`svgen bench --program` times another kernel at the same tiling: not the spec's."""
    path = root / "bench" / "results" / "new.json"
    data = json.loads(path.read_text())
    data["results"][0]["program"] = "ProgramLimits(straight_words=0)"
    path.write_text(json.dumps(data))
    (row,) = [line for line in rt.at_head(rp.load(root), root) if line.startswith("| tiny")]
    assert "| 2.00 | aaaaaaa" in row  # the old run's figure: the new one left code out


def test_a_timing_with_code_left_out_has_its_own_row(root):
    """The left-out table: what was left out, in words, beside Splash at its best (the same
    spec's newest yardstick figure) and the spec's fastest kernel with its default code."""
    path = root / "bench" / "results" / "new.json"
    data = json.loads(path.read_text())
    data["results"].append(dict(_result(T256, 1.2), program="ProgramLimits(pattern_calls=True)"))
    path.write_text(json.dumps(data))
    rows = [line for line in _section(_page(root), "left-out") if line.startswith("| tiny")]
    (row,) = rows
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "128x256 / 128x128" and cells[2] == "one forward kernel per pattern"
    assert cells[3] == "1.20" and cells[4] == "1.80" and cells[5] == "1.50x"
    assert cells[6].startswith("1.50 (128x128; bbbbbbb)") and cells[7] == "1.25x"
    assert rp.program_words("ProgramLimits(straight_words=0, residual_masks=False)") == (
        "no straight-line BOUNDARY bodies; whole masks on BOUNDARY blocks (no residual-mask "
        "variants)"
    )
