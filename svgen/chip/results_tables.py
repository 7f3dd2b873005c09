"""The generated parts of docs/measured.md and the README's headline, from the chip's results
(svgen.chip.results_page), and how they are written into their pages: between marker
comments, byte for byte the same for the same results, so that `svgen report --check` can
tell a page that is behind its results.

Every figure of a generated section comes from a JSON file; the prose around the sections
explains them and quotes none of them.
"""

from __future__ import annotations

import pathlib
import re
import textwrap

from svgen.chip import results_page as rp

PAGE = pathlib.Path("docs/measured.md")
README = pathlib.Path("README.md")
BEGIN = "<!-- svgen report: {name} (generated from bench/results: edit the results, not this) -->"
END = "<!-- svgen report: end of {name} -->"
_BLOCK = re.compile(
    r"<!-- svgen report: (?P<name>[\w-]+) \(generated[^\n]*-->\n(?P<body>.*?)"
    r"<!-- svgen report: end of (?P=name) -->",
    re.S,
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _x(mine: float | None, theirs: float | None) -> str:
    return "-" if not mine or not theirs else f"{theirs / mine:.2f}x"


def _file(source: rp.Source) -> str:
    return f"[{source.file}](../{rp.RESULTS.as_posix()}/{source.file})"


def _when(timing: rp.Timing | None) -> str:
    return "-" if timing is None else f"{timing.source.commit}, {_file(timing.source)}"


def _table(header: list[str], align: str, rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


# ----------------------------------------------------------------------------- sections
def _head_timings(results: rp.Results, root: pathlib.Path) -> list[tuple]:
    """(spec path, v5e tiling at HEAD, newest forward timing, newest backward timing) of
    every shipped spec."""
    out = []
    for path in sorted(p.relative_to(root).as_posix() for p in (root / "specs").glob("*.yaml")):
        tiling = rp.head_tiling(root, path)
        forward = rp.newest(results, path, tiling, "svgen_forward")
        out.append((path, tiling, forward, rp.newest(results, path, tiling, "svgen_backward")))
    return out


def at_head(results: rp.Results, root: pathlib.Path) -> list[str]:
    """Per shipped spec: the newest times at the v5e tiling it carries at HEAD."""
    rows = []
    for path, tiling, forward, backward in _head_timings(results, root):
        name = pathlib.Path(path).stem
        if forward is None and backward is None:
            rows.append([name, rp.tiling_words(tiling), "not timed at this tiling", "", "", "", ""])
            continue
        first = forward.result["svgen_forward"].get("first_call_s") if forward else None
        rows.append(
            [
                name,
                rp.tiling_words(tiling),
                _ms(forward and forward.ms("svgen_forward")),
                _when(forward),
                _ms(backward and backward.ms("svgen_backward")),
                _when(backward),
                rp.kernel_status(results, forward, "forward") if forward else "-",
            ]
        )
        if first is not None:
            rows[-1][2] += f" (first call {first:.1f} s)"
    header = [
        "spec",
        "v5e tiling at HEAD",
        "forward ms",
        "timed at (commit, results)",
        "forward + backward ms",
        "timed at",
        "kernel timed",
    ]
    return _table(header, ["---", "---", "--:", "---", "--:", "---", "---"], rows)


def vs_splash(results: rp.Results, root: pathlib.Path) -> list[str]:
    """Every timing against Splash given the same mask at its best, and dense Splash at its
    best blocks, timed in the same process."""
    rows = []
    for t in results.timings:
        if not t.source.yardstick:
            continue
        for direction, words in (("forward", "forward"), ("backward", "forward + backward")):
            mine = t.ms(f"svgen_{direction}")
            masked = t.result.get(f"splash_mask_{direction}", {})
            dense = t.result.get(f"splash_dense_{direction}", {})
            if not mine or not masked.get("median_ms"):
                continue
            blocks = dense.get("blocks")
            rows.append(
                [
                    t.name,
                    rp.tiling_words(t.tiling),
                    words,
                    _ms(mine),
                    f"{_ms(masked['median_ms'])} ({masked.get('label', '-')})",
                    _x(mine, masked["median_ms"]),
                    _ms(dense.get("median_ms"))
                    + (f" ({'/'.join(map(str, blocks))})" if blocks else ""),
                    _x(mine, dense.get("median_ms")),
                    _at_head(results, root, t),
                    _when(t),
                ]
            )
    header = [
        "spec",
        "tiling",
        "direction",
        "svgen ms",
        "Splash given the mask, at its best ms (winner)",
        "svgen over it",
        "dense Splash at its best ms (blocks)",
        "svgen over it",
        "tiling at HEAD",
        "timed at",
    ]
    return _table(header, ["---"] * 3 + ["--:"] * 5 + ["---"] * 2, rows)


def _at_head(results: rp.Results, root: pathlib.Path, t: rp.Timing) -> str:
    from svgen.spec import load_spec

    if load_spec(root / t.spec, chip=rp.CHIP).tiling_given:
        return "the spec's" if rp.head_tiling(root, t.spec) == t.tiling else "another"
    pick = rp.chip_free_pick(results, t.spec, _patterns(root, t.spec))
    return "the chip-free pick" if pick == (t.tiling, ()) else "another"


def _patterns(root: pathlib.Path, spec: str) -> int:
    """How many patterns the spec's heads choose among (1 for one mask)."""
    from svgen.spec import load_spec

    return max(1, len(load_spec(root / spec, chip=rp.CHIP).patterns))


def cliff(results: rp.Results, root: pathlib.Path) -> list[str]:
    """Forward kernels by program size against the same spec's fastest program within the
    budget, and what they say (svgen.chip.results_page.facts)."""
    rows = []
    for r in rp.cliff_rows(results):
        reference = "-"
        if r.reference is not None:
            ms, tiling, runtime, commit = r.reference
            same = tiling == r.tiling
            where = "the same tiling" if same else rp.tiling_words(tiling)
            if runtime:
                where += f", {rp.runtime_words(runtime)}"
            reference = f"{_ms(ms)} ({where}; {commit})"
        rows.append(
            [
                r.label,
                rp.tiling_words(r.tiling),
                f"{r.bundles:,}",
                _ms(r.ms),
                reference,
                "-" if r.slowdown is None else f"{r.slowdown:.2f}x",
                r.commit,
            ]
        )
    header = [
        "kernel",
        "tiling",
        "forward program bundles",
        "forward ms",
        "the same spec's fastest program within the budget, ms",
        "slower by",
        "timed at",
    ]
    lines = _table(header, ["---", "---", "--:", "--:", "---", "--:", "---"], rows)
    f = rp.facts(results)
    if f["program_fast_bundles"] and f["program_slow_bundles"]:
        lo, hi = f["program_slowdown"]
        lines += [""] + textwrap.wrap(
            f"Every program of up to {f['program_fast_bundles']:,} bundles ran within "
            f"{rp.AT_RATE:.2f}x of its spec's fastest program within the budget; every one of "
            f"{f['program_slow_bundles']:,} or more ran {lo:.1f}-{hi:.1f}x slower. The v5e "
            f"budget is {rp.budget():,} bundles (svgen.analysis.targets).",
            width=95,
        )
    return lines


def tilings(results: rp.Results, root: pathlib.Path) -> list[str]:
    """Forward ms per spec at each tiling a chip-free compile may take, the fastest measured,
    the spec's v5e tiling at HEAD and the pick from the counted programs."""
    from svgen.chip.program_size import V5E_TILINGS
    from svgen.spec import load_spec

    candidates = [(*t, "exact") for t in V5E_TILINGS]
    specs = sorted({t.spec for t in results.timings if "tilings" in t.source.sections})
    rows = []
    for spec in specs:
        cells, timed = [], {}
        for tiling in candidates:
            t = rp.newest(results, spec, tiling, "svgen_forward")
            if t is not None:
                timed[tiling] = t.ms("svgen_forward")
            cells.append(f"{_ms(t.ms('svgen_forward'))} ({t.source.commit})" if t else "")
        fastest = _fastest(results, spec)
        pick = _pick_words(results, root, spec)
        given = load_spec(root / spec, chip=rp.CHIP).tiling_given
        splash = rp.newest_splash(results, spec, "forward")
        rows.append(
            [
                pathlib.Path(spec).stem,
                *cells,
                fastest,
                rp.tiling_words(rp.head_tiling(root, spec)) if given else "none given",
                pick,
                _ms(splash.ms("splash_mask_forward")) if splash else "-",
            ]
        )
    header = [
        "spec",
        *(rp.tiling_words(t) + " ms" for t in candidates),
        "fastest measured",
        "v5e tiling at HEAD",
        "chip-free pick",
        "Splash at its best ms",
    ]
    return _table(header, ["---"] + ["--:"] * len(candidates) + ["---"] * 3 + ["--:"], rows)


def left_out(results: rp.Results, root: pathlib.Path) -> list[str]:
    """Kernels timed with code left out (`svgen bench --program`: one kernel per pattern,
    straight-line bodies, whole masks), each beside Splash at its best and the fastest kernel
    of the same spec with its default code."""
    rows = []
    for t in sorted(results.left_out, key=lambda t: (t.name, t.tiling, t.source.order)):
        mine = t.ms("svgen_forward")
        if not mine:
            continue
        splash = rp.newest_splash(results, t.spec, "forward")
        theirs = splash.ms("splash_mask_forward") if splash else None
        default = [d for d in results.timings if d.spec == t.spec and d.ms("svgen_forward")]
        best = min(default, key=lambda d: d.ms("svgen_forward"), default=None)
        first = t.result["svgen_forward"].get("first_call_s")
        rows.append(
            [
                t.name,
                rp.tiling_words(t.tiling),
                rp.program_words(t.result.get("program")),
                _ms(mine) + (f" (first call {first:.1f} s)" if first else ""),
                _ms(theirs) if theirs else "-",
                _x(mine, theirs),
                (
                    f"{_ms(best.ms('svgen_forward'))} ({rp.tiling_words(best.tiling)}; "
                    f"{best.source.commit})"
                    if best
                    else "-"
                ),
                _x(mine, best.ms("svgen_forward")) if best else "-",
                _when(t),
            ]
        )
    header = [
        "spec",
        "tiling",
        "left out",
        "svgen forward ms",
        "Splash at its best ms",
        "svgen over it",
        "the spec's fastest with its default code, ms",
        "this over that",
        "timed at",
    ]
    return _table(header, ["---"] * 3 + ["--:"] * 5 + ["---"], rows)


def _fastest(results: rp.Results, spec: str) -> str:
    """The spec's fastest forward kernel measured at any tiling, with code left out or not."""
    timed = [
        t for t in (*results.timings, *results.left_out) if t.spec == spec and t.ms("svgen_forward")
    ]
    if not timed:
        return "-"
    best = min(timed, key=lambda t: t.ms("svgen_forward"))
    words = rp.tiling_words(best.tiling)
    if not best.default_code:
        words += f", {rp.program_words(best.result.get('program'))}"
    return f"{words} ({_ms(best.ms('svgen_forward'))})"


def _pick_words(results: rp.Results, root: pathlib.Path, spec: str) -> str:
    """The chip-free pick, its program's bundles, and whether that kernel was timed."""
    pick = rp.chip_free_pick(results, spec, _patterns(root, spec))
    if pick is None:
        return "not counted"
    tiling, runtime = pick
    words = rp.tiling_words(tiling)
    if runtime:
        words += f" with {rp.runtime_words(runtime)}"
    words += f" ({rp.bundles(results, spec, tiling, runtime):,} bundles)"
    if runtime:  # the bench files time the default code only
        timed = any(
            v.spec == spec and v.tiling == tiling and v.runtime == runtime for v in results.variants
        )
        words += "" if timed else ", not timed"
    return words


def model(results: rp.Results, root: pathlib.Path) -> list[str]:
    """The static model (`svgen cost --target v5e`) against the chip, one-level tilings."""
    if results.model is None:
        return ["(no model-against-chip results)"]
    rows = [
        [
            r["spec"],
            rp.tiling_words((*r["tiling"], "exact")),
            _ms(r["chip_ms"]),
            _ms(r["model_ms"]),
            f"{r['chip_ms'] / r['model_ms']:.2f}",
        ]
        for r in results.model.data["rows"]
    ]
    header = ["spec", "tiling", "chip ms", "model ms", "chip / model"]
    lines = _table(header, ["---", "---", "--:", "--:", "--:"], rows)
    f = rp.facts(results)
    lo, hi, n = f["model_typical"]
    lines += [""] + textwrap.wrap(
        f"The chip took {lo:.2f}-{hi:.2f}x the model's time on {n} of {f['model_pairs']} pairs and "
        f"up to {f['model_worst']:.1f}x on the rest (commit {results.model.commit}, "
        f"{_file(results.model)}).",
        width=95,
        break_on_hyphens=False,
    )
    return lines


def files(results: rp.Results, root: pathlib.Path) -> list[str]:
    """Every results file: the commit that ran, the chip, the command, and what reads it."""
    used: dict[str, list[str]] = {}

    def use(source, section: str) -> None:
        if source is not None and section not in used.setdefault(source.file, []):
            used[source.file].append(section)

    for _, _, forward, backward in _head_timings(results, root):
        use(forward and forward.source, "at HEAD")
        use(backward and backward.source, "at HEAD")
    for t in results.timings:
        if t.source.yardstick and (t.ms("splash_mask_forward") or t.ms("splash_mask_backward")):
            use(t.source, "vs Splash")
    for t in results.left_out:
        use(t.source, "code left out")
    for s in results.sources:
        for section in s.sections:
            use(s, section)
    rows = []
    for s in results.sources:
        what = ", ".join(used.get(s.file, [])) or "history"
        if s.kind == "svgen bench":
            what += "; Splash at its best" if s.yardstick else "; Splash: the older harness"
        if s.data.get("complete") is False:
            what += "; stopped part way"
        digest = s.data.get("source_digest") or "-"
        rows.append([_file(s), s.commit, digest, s.chip_words(), s.command or "-", what])
    header = ["file", "commit", "source digest", "chip", "command", "used in"]
    return _table(header, ["---"] * 6, rows)


def headline(results: rp.Results, root: pathlib.Path) -> list[str]:
    """The README's one sentence: the headline spec against Splash at its best."""
    spec = results.headline
    t = rp.newest_splash(results, spec, "forward")
    if t is None:
        raise rp.ReportError(f"no timing of {spec} against Splash at its best")
    mine, masked = t.ms("svgen_forward"), t.ms("splash_mask_forward")
    dense = t.ms("splash_dense_forward")
    density = _density(root / spec)
    return textwrap.wrap(
        f"On a TPU v5e ({t.source.chip_words()}), `{spec}` ({density} of the pairs kept) runs "
        f"its forward in {_ms(mine)} ms: {_x(mine, masked)} over Splash Attention given the "
        f"same mask at its best ({_ms(masked)} ms), {_x(mine, dense)} over dense Splash at its "
        f"best blocks ({_ms(dense)} ms); `{t.source.command}`, commit {t.source.commit}. "
        "Every spec, the commands and what is not yet met: "
        "[docs/measured.md](docs/measured.md).",
        width=95,
        break_on_hyphens=False,
    )


def _density(spec: pathlib.Path) -> str:
    from svgen.analysis import analyze
    from svgen.spec import load_spec

    plan = analyze(load_spec(spec, chip=rp.CHIP), target_name=rp.CHIP)
    return f"{plan.patterns[0].density:.1%}"


PAGE_SECTIONS = {
    "at-head": at_head,
    "vs-splash": vs_splash,
    "cliff": cliff,
    "tilings": tilings,
    "left-out": left_out,
    "model": model,
    "files": files,
}
README_SECTIONS = {"headline": headline}


# ----------------------------------------------------------------------------- the pages
def render(text: str, sections: dict, results: rp.Results, root: pathlib.Path, page) -> str:
    """`text` with each marked section's body replaced by what the results give; ReportError
    where a section's markers are missing or a marked section is unknown."""
    found = {m.group("name") for m in _BLOCK.finditer(text)}
    missing = sorted(set(sections) - found)
    unknown = sorted(found - set(sections))
    if missing or unknown:
        raise rp.ReportError(
            f"{page}: "
            + "; ".join(
                [f"no markers for {', '.join(missing)}"] * bool(missing)
                + [f"unknown sections {', '.join(unknown)}"] * bool(unknown)
            )
            + f" (a section is {BEGIN.format(name='NAME')} ... {END.format(name='NAME')})"
        )

    def body(match: re.Match) -> str:
        name = match.group("name")
        lines = sections[name](results, root)
        return BEGIN.format(name=name) + "\n" + "\n".join(lines) + "\n" + END.format(name=name)

    return _BLOCK.sub(body, text)


def pages(root: pathlib.Path) -> dict[pathlib.Path, tuple[str, str]]:
    """{page: (text now, text the results give)} for docs/measured.md and the README."""
    results = rp.load(root)
    out = {}
    for page, sections in ((PAGE, PAGE_SECTIONS), (README, README_SECTIONS)):
        now = (root / page).read_text()
        out[page] = (now, render(now, sections, results, root, page))
    return out
