"""`svgen tune`: the search space, estimates from compiled probes, ranking, --apply.

Most tests replace the compile (libtpu, ~20 s a kernel) by a synthetic per-path cost of the
shape libtpu's schedules have; one small run compiles for real, in a subprocess (libtpu must
get its dump flags before it starts).
"""

import json
import os
import textwrap

from svgen import cli
from svgen.estimate import tune
from svgen.spec import parse_spec
from svgen.estimate.tune import Candidate, estimate_paths, rewrite_tiling
from helpers import run_python
from tune_helpers import SEQ_LEN, SPEC, fake_measure, synthetic_paths, write_spec


def test_search_space():
    spec = parse_spec(SPEC)
    space = tune.candidates(spec, ["exact", "balanced"])
    assert space[0] == Candidate(512, 512, 512, 512, "exact")  # the spec's own first
    assert len(space) == len(set(space))
    assert all(
        c.blocks <= 16 and c.block_q % c.compute_q == 0 and c.block_kv % c.compute_kv == 0
        for c in space
    )
    assert Candidate(2048, 4096, 1024, 512, "balanced") in space
    assert Candidate(4096, 4096, 512, 512, "exact") not in space  # 64 blocks per tile
    assert {c.align for c in space} == {"exact", "balanced"}


def test_wide_searches_8192_wide_kv_tiles(tmp_path):
    """--wide adds 8192-wide kv tiles (never q tiles) to the search, within 16 blocks a tile;
    without it none is tried; through the command line too."""
    spec = parse_spec(SPEC)
    plain = tune.candidates(spec, ["exact"])
    wide = tune.candidates(spec, ["exact"], wide=True)
    assert not any(8192 in (c.block_q, c.block_kv) for c in plain)
    assert set(plain) < set(wide)
    added = set(wide) - set(plain)
    assert Candidate(2048, 8192, 1024, 1024, "exact") in added
    assert Candidate(1024, 8192, 1024, 512, "exact") in added
    assert all(c.block_kv == 8192 and c.block_q < 8192 and c.blocks <= 16 for c in added)
    result = tune.tune(str(write_spec(tmp_path, SPEC)), measure=fake_measure([]), wide=True)
    seen = {r.candidate for r in result.rows} | {c for c, _ in result.dropped}
    assert any(c.block_kv == 8192 for c in seen)
    args = cli._parser().parse_args(["tune", "--wide", "spec.yaml"])
    assert args.wide and not cli._parser().parse_args(["tune", "spec.yaml"]).wide


def test_search_space_of_a_tiled_layout_has_whole_cubes():
    """Cubes of 3 x 8 x 16 = 384 tokens (STA's are 6 x 8 x 8): tiles of 1, 2, 4 and 8 cubes
    with one-cube compute blocks join the powers of two; compute blocks divide their tiles."""
    text = SPEC.replace("layout: frame_major", "layout: {tiled: {frames: 3, rows: 8, cols: 16}}")
    space = tune.candidates(parse_spec(text), ["exact"])
    assert Candidate(768, 1536, 384, 384, "exact") in space
    assert Candidate(384, 384, 384, 384, "exact") in space
    assert Candidate(3072, 3072, 384, 384, "exact") not in space  # 64 blocks per tile
    assert Candidate(768, 768, 512, 512, "exact") not in space  # 512 does not divide 768
    assert all(c.block_q % c.compute_q == 0 and c.block_kv % c.compute_kv == 0 for c in space)
    plain = tune.candidates(parse_spec(SPEC), ["exact"])
    assert not any(384 in (c.block_q, c.compute_q) for c in plain)


def test_a_narrow_pattern_searches_tiles_below_512(tmp_path):
    """A spec whose queries keep fewer than NARROW_KEYS keys each (a band of 40, 81 keys a
    query) adds 256-wide tiles and compute blocks to the search; a wider one (a band of 800
    and a prefix of 208: over 600 keys a query) does not."""
    narrow = SPEC.replace("band: {width: 200}", "band: {width: 40}").replace(
        "    - prefix: {tokens: 208}\n", ""
    )
    wide = SPEC.replace("band: {width: 200}", "band: {width: 800}")
    assert "prefix" not in narrow and "800" in wide
    for text, searched in ((narrow, True), (wide, False)):
        result = tune.tune(str(write_spec(tmp_path, text)), measure=fake_measure([]))
        seen = {r.candidate for r in result.rows} | {c for c, _ in result.dropped}
        assert (Candidate(256, 512, 256, 512, "exact") in seen) == searched, text
        assert any(c.compute_q == 256 for c in seen) == searched
        assert tune.candidates(parse_spec(text), ["exact"])[0] == Candidate(512, 512, 512, 512)


def test_estimates_are_exact_for_costs_of_the_modelled_form():
    points = [
        (c, synthetic_paths(c))
        for c in (Candidate(2048, 2048, 1024, 512), Candidate(2048, 4096, 1024, 512))
    ]
    for c in (
        Candidate(1024, 2048, 1024, 512),
        Candidate(4096, 2048, 1024, 512),
        Candidate(1024, 512, 1024, 512),
    ):
        got, want = estimate_paths(points, c, SEQ_LEN), synthetic_paths(c)
        assert got.full == want.full and got.mixed == want.mixed, c
        assert got.block == want.block and got.bookkeeping == want.bookkeeping, c
    one = estimate_paths(points[:1], Candidate(2048, 4096, 1024, 512), SEQ_LEN)
    assert one.full >= synthetic_paths(Candidate(2048, 4096, 1024, 512)).full  # r0 = 0: over


def test_tune_ranks_compiled_first_choices(tmp_path):
    compiled = []
    result = tune.tune(
        str(write_spec(tmp_path)),
        aligns=["exact", "nearest"],
        confirm=3,
        measure=fake_measure(compiled),
    )
    rows = result.rows
    assert [r.cycles for r in rows] == sorted(r.cycles for r in rows)
    assert all(r.exact for r in rows[:3]) and result.choice.exact
    assert any(not r.exact for r in rows)  # the rest estimated
    # One compile per kernel code: a tiling's exact and aligned kernels differ (an aligned one
    # has no mask code), its aligned modes share one.
    assert len(compiled) == len(set(compiled)) == result.compiles
    assert result.compiles < len({r.candidate.code_key for r in rows})
    assert any(aligned for *_, aligned in compiled) and not all(a for *_, a in compiled)
    # The synthetic costs have the modelled form: estimates equal exact costs, so the first
    # choice is the best of an exhaustive run.
    everything = tune.tune(
        str(write_spec(tmp_path)),
        aligns=["exact", "nearest"],
        exhaustive=True,
        measure=fake_measure([]),
    )
    assert all(r.exact for r in everything.rows)
    assert result.choice.cycles == everything.choice.cycles
    j = result.to_json()
    assert j["choice"]["cost"] == "compiled"
    nearest = [r for r in j["rows"] if r["align"] == "nearest"]
    assert nearest and all(0 < r["recall"] <= 1 and "exact_density" in r for r in nearest)
    assert sum(r["current"] for r in j["rows"]) == 1  # 512 x 512 exact: the spec's own
    assert any(line.startswith("| 1 |") for line in tune.format_table(result))


def test_over_budget_candidates_never_appear(tmp_path):
    budget = 40  # bytes of SMEM (2 heads, 1,040 tokens): small tiles have more table entries
    result = tune.tune(str(write_spec(tmp_path)), smem_budget=budget, measure=fake_measure([]))
    over = [why for _, why in result.dropped if "single grid step" not in why]
    assert over and all("SMEM" in why for why in over)
    assert all(r.plan.table_bytes <= budget for r in result.rows)
    dropped = {c for c, _ in result.dropped}
    assert not dropped & {r.candidate for r in result.rows}
    assert "over the SMEM budget" in "\n".join(tune.summary_lines(result))


def test_tune_drops_candidates_of_one_grid_step(tmp_path):
    """On a short sequence (1,040 tokens) tiles as long as it make kernels of a single grid
    step, which the cost model cannot read (`svgen cost` refuses them, naming `tiling:`): tune
    leaves them out, saying why, and ranks the rest, the spec's own tiling such a one too."""
    from svgen.estimate import cost

    def measure(plan):
        cost.check_costable(plan)  # what the real measure does before compiling
        return synthetic_paths(
            Candidate(
                plan.spec.tiling.block_q,
                plan.spec.tiling.block_kv,
                plan.spec.tiling.cq,
                plan.spec.tiling.ckv,
                plan.spec.tiling.align,
            ),
            len(plan.patterns),
        )

    for own in ("{block_q: 512, block_kv: 512}", "{block_q: 2048, block_kv: 2048}"):
        text = SPEC.replace("{block_q: 512, block_kv: 512}", own)
        result = tune.tune(str(write_spec(tmp_path, text)), measure=measure)
        one_step = {c for c, why in result.dropped if "single grid step" in why}
        assert Candidate(2048, 2048, 1024, 1024, "exact") in one_step
        assert (Candidate(2048, 2048, 2048, 2048, "exact") in one_step) == ("2048" in own)
        assert result.rows and all(r.plan.grid_steps > 1 for r in result.rows)
        assert any(line.startswith("| 1 |") for line in tune.format_table(result))
        assert "single grid step" in "\n".join(tune.summary_lines(result))


def test_tune_apply_keeps_comments_and_order(tmp_path, monkeypatch, capsys):
    path = write_spec(tmp_path)
    monkeypatch.setattr(tune, "_compile_measure", lambda spec_path: fake_measure([]))
    assert cli.main(["tune", str(path), "--align", "balanced", "--apply"]) == 0
    out, err = capsys.readouterr()
    assert "| 1 |" in out and "first choice" in out
    new = path.read_text()
    old_lines, new_lines = SPEC.splitlines(), new.splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
    assert len(changed) == 1 and changed[0][0].startswith("tiling:")  # only the tiling line
    # Flow style and the comment kept (pushed out one space when the line grew past it).
    assert changed[0][1].startswith("tiling: {") and changed[0][1].endswith("} # tuned later")
    assert "align: balanced" in changed[0][1]
    assert "tiling block_q: 512 ->" in err or "tiling block_kv: 512 ->" in err or "align" in err
    t = parse_spec(new).tiling
    choice = tune.tune(str(path), aligns=["balanced"], measure=fake_measure([])).choice
    assert (t.block_q, t.block_kv, t.cq, t.ckv, t.align) == (
        choice.candidate.block_q,
        choice.candidate.block_kv,
        choice.candidate.compute_q,
        choice.candidate.compute_kv,
        "balanced",
    )


def test_rewrite_tiling_in_block_style_and_when_missing():
    block = SPEC.replace(
        "tiling: {block_q: 512, block_kv: 512}  # tuned later\n",
        "tiling:\n  block_q: 512   # rows\n  block_kv: 512\n  align: nearest\n",
    )
    text, changes = rewrite_tiling(block, Candidate(2048, 1024, 1024, 512, "exact"))
    assert "  block_q: 2048  # rows\n" in text and "  align: exact\n" in text  # same column
    assert "  compute_q: 1024\n" in text and "  compute_kv: 512\n" in text
    assert changes == [
        "block_q: 512 -> 2048",
        "block_kv: 512 -> 1024",
        "compute_q: (not given) -> 1024",
        "compute_kv: (not given) -> 512",
        "align: nearest -> exact",
    ]
    missing = SPEC.split("# the tiling")[0]
    text, changes = rewrite_tiling(missing, Candidate(1024, 1024, 1024, 1024, "exact"))
    assert text.startswith(missing) and text.endswith("tiling: {block_q: 1024, block_kv: 1024}\n")
    same, none = rewrite_tiling(SPEC, Candidate(512, 512, 512, 512, "exact"))
    assert same == SPEC and none == []


def test_shipped_specs_round_trip_unchanged():
    """--apply of a spec's own tiling rewrites nothing: the round trip is byte-exact on the
    shipped specs' style."""
    from helpers import SPECS

    for path in SPECS:
        text = path.read_text()
        t = parse_spec(text).tiling
        same, changes = rewrite_tiling(text, Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align))
        assert same == text and changes == [], path.name


def test_a_small_real_tune(tmp_path):
    """One compile for real (the search space cut to one tiling), through the command."""
    spec = write_spec(tmp_path)
    script = textwrap.dedent(f"""
        import sys
        from svgen import cli
        from svgen.estimate import tune
        tune.TILE_SIZES, tune.COMPUTE_SIZES, tune.NARROW_SIZES = (512,), (512,), ()
        sys.exit(cli.main(["tune", {str(spec)!r}, "--json"]))
    """)
    env = {**os.environ, "SVGEN_CACHE_DIR": str(tmp_path / "cache")}
    result = run_python("-c", script, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["compiles"] == 1 and len(report["rows"]) == 1
    row = report["rows"][0]
    assert row["cost"] == "compiled" and row["current"] and row["cycles"] > 0
    assert row["speedup_vs_dense"] > 1  # the band skips tiles
