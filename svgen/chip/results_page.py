"""The chip's results as `svgen report` reads them: bench/results/*.json, each described by
bench/results/manifest.json (the commit that ran, the command, oldest first), and what they
say at HEAD.

The JSON files are what `svgen bench` and the bench scripts wrote on the chip; their own
`commit` field is often a TPU host's stale one, so the manifest names the commit that ran
(their `source_digest` names the code either way). From them this module picks, for each
shipped spec, the newest timing at the v5e tiling the spec carries at HEAD; the timings
against Splash given the same mask at its best (files whose options say `splash_blocks:
search`, svgen.chip.splash_peer: the only Splash figures presented as current); the
program-size cliff and the tilings a spec takes without a chip (with the forward programs'
bundles, bench/results/v5e_program_sizes.json); and the static model against the chip. It
also derives the figures that svgen's code quotes (`facts`), which `svgen report --check`
holds equal to the one place they are written by hand, svgen.analysis.targets.

Everything here is plain data: no JAX, no chip, byte-for-byte the same output for the same
files (svgen.chip.results_tables renders it).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import re

RESULTS = pathlib.Path("bench/results")
MANIFEST = RESULTS / "manifest.json"
CHIP = "v5e"
#: A kernel within this factor of the same work in a smaller program ran "at its work's
#: rate"; one at SLOW or more ran slowly (between the two: neither, and `facts` says so).
AT_RATE, SLOW = 1.10, 1.5

Tiling = tuple  # (block_q, block_kv, compute_q, compute_kv, align)


class ReportError(Exception):
    """The results cannot be read as the manifest says (the message says which and why)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One results file, as the manifest describes it; `order`: later is newer."""

    file: str
    commit: str
    command: str
    sections: tuple[str, ...]
    data: dict
    order: int

    @property
    def yardstick(self) -> bool:
        """Splash given the mask was timed at its best (svgen.chip.splash_peer's search)."""
        return self.data.get("options", {}).get("splash_blocks") == "search"

    @property
    def kind(self) -> str:
        if "variants" in self.data:
            return "kernel_ab"
        results = self.data.get("results")
        if isinstance(results, list) and "options" in self.data:
            return "svgen bench"
        return "other"

    def chip_words(self) -> str:
        """The chip and versions the file records ("TPU v5 lite, JAX 0.10.2, libtpu ...")."""
        v = self.data.get("versions") or self.data
        parts = [v.get("device_kind")]
        parts += [
            f"{name} {v[key]}" for name, key in (("JAX", "jax"), ("libtpu", "libtpu")) if v.get(key)
        ]
        return ", ".join(p for p in parts if p) or "-"


@dataclasses.dataclass(frozen=True)
class Timing:
    """One spec at one tiling in one `svgen bench` file."""

    source: Source
    result: dict

    @property
    def spec(self) -> str:
        return self.result["source"]

    @property
    def name(self) -> str:
        return self.result["spec"]

    @property
    def tiling(self) -> Tiling:
        return tiling_of(self.result["tiling"])

    @property
    def default_code(self) -> bool:
        """The module as compiled with nothing left out of its kernels: a result timed with
        `svgen bench --program` (straight-line bodies, whole masks, per-pattern kernels left
        out) is another kernel at the same tiling, never a spec's figure here."""
        return _default_program(self.result.get("program"))

    def ms(self, entry: str) -> float | None:
        """median_ms of an entry (svgen_forward, splash_mask_backward, ...), None if absent or
        failed."""
        value = self.result.get(entry)
        return value.get("median_ms") if isinstance(value, dict) else None


@dataclasses.dataclass(frozen=True)
class Variant:
    """One kernel of a kernel_ab file: a spec at a tiling with runtime constants set."""

    source: Source
    spec: str
    name: str
    tiling: Tiling
    runtime: tuple  # sorted (constant, value) pairs; () is the defaults
    ms: float


@dataclasses.dataclass(frozen=True)
class Results:
    sources: tuple[Source, ...]
    timings: tuple[Timing, ...]
    variants: tuple[Variant, ...]
    sizes: dict  # (spec, tiling, runtime) -> forward program bundles
    sizes_source: Source | None
    model: Source | None
    headline: str  # the spec whose figures the README quotes
    fingerprints: (
        dict  # source -> the reference fingerprint of HEAD's code (svgen.chip.fingerprint)
    )
    # Timings of kernels with code left out (`svgen bench --program`), never a spec's figure.
    left_out: tuple[Timing, ...] = ()


def _default_program(program) -> bool:
    if program in (None, "", "ProgramLimits()"):
        return True
    try:
        from svgen.core.program import ProgramLimits

        return program == ProgramLimits().source()
    except (ImportError, AttributeError):
        return False


def program_words(program: str) -> str:
    """What a result's `program` (ProgramLimits(...) as `svgen bench` records it) left out, in
    words."""
    from svgen.core.program import ProgramLimits

    values = {"True": True, "False": False, "None": None}
    fields = {}
    for item in re.findall(r"(\w+)=(\w+)", program or ""):
        name, text = item
        fields[name] = values[text] if text in values else int(text)
    return ProgramLimits(**fields).words() or "nothing"


def tiling_of(t: dict) -> Tiling:
    return (t["block_q"], t["block_kv"], t["compute_q"], t["compute_kv"], t.get("align", "exact"))


def parse_tiling(text: str) -> Tiling:
    """`BQxBKV` or `BQxBKV/CQxCKV` (as the bench scripts write them), exact."""
    tile, _, compute = text.replace(" ", "").partition("/")
    bq, bkv = (int(x) for x in tile.split("x"))
    cq, ckv = (int(x) for x in compute.split("x")) if compute else (bq, bkv)
    return (bq, bkv, cq, ckv, "exact")


def tiling_words(t: Tiling) -> str:
    text = f"{t[0]}x{t[1]}"
    if (t[2], t[3]) != (t[0], t[1]):
        text += f" / {t[2]}x{t[3]}"
    return text + ("" if t[4] == "exact" else f" {t[4]}")


def runtime_key(settings: dict) -> tuple:
    return tuple(sorted(settings.items()))


def runtime_of_label(label: str) -> dict:
    """kernel_ab's variant label (`straight.MAX_WORDS=6`, comma-separated) as settings."""
    out = {}
    for part in label.split(","):
        name, _, value = part.partition("=")
        out[name.strip()] = ast.literal_eval(value.strip())
    return out


# ----------------------------------------------------------------------------- reading
def load(root: pathlib.Path) -> Results:
    """The results under root/bench/results as the manifest describes them. ReportError where
    a listed file is missing or unreadable, or a JSON file there is not listed."""
    folder = root / RESULTS
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"cannot read {MANIFEST}: {exc}") from None
    listed = [entry["file"] for entry in manifest["files"]]
    unlisted = sorted(
        p.name for p in folder.glob("*.json") if p.name not in listed and p.name not in _NOT_RESULTS
    )
    if unlisted:
        raise ReportError(
            f"{', '.join(unlisted)}: in {RESULTS} but not in {MANIFEST} (add each with the "
            "commit that ran and the command)"
        )
    sources = []
    for order, entry in enumerate(manifest["files"]):
        try:
            data = json.loads((folder / entry["file"]).read_text())
        except (OSError, ValueError) as exc:
            raise ReportError(f"{MANIFEST} lists {entry['file']}, which cannot be read: {exc}")
        sources.append(
            Source(
                entry["file"],
                entry["commit"],
                entry.get("command", ""),
                tuple(entry.get("sections", ())),
                data if isinstance(data, dict) else {"rows": data},
                order,
            )
        )
    # The spec's own kernels apart from those with code left out: see Timing.default_code.
    every = tuple(
        t
        for s in sources
        if s.kind == "svgen bench"
        for t in (Timing(s, r) for r in s.data["results"] if "tiling" in r and "source" in r)
    )
    timings = tuple(t for t in every if t.default_code)
    variants = tuple(v for s in sources if s.kind == "kernel_ab" for v in _variants(s))
    sizes_source = next((s for s in sources if "sizes" in s.sections), None)
    sizes = {}
    for row in sizes_source.data["results"] if sizes_source else ():
        key = (row["source"], parse_tiling(row["tiling"]), runtime_key(row.get("runtime", {})))
        sizes[key] = row["bundles"]
    model = next((s for s in sources if "model" in s.sections), None)
    try:
        fingerprints = json.loads((folder / "fingerprints.json").read_text())["specs"]
    except (OSError, ValueError, KeyError):
        fingerprints = {}
    return Results(
        tuple(sources),
        timings,
        variants,
        sizes,
        sizes_source,
        model,
        manifest["headline"],
        fingerprints,
        tuple(t for t in every if not t.default_code),
    )


#: JSON files in bench/results that are not chip results.
_NOT_RESULTS = {"manifest.json", "fingerprints.json"}


def _variants(source: Source):
    for spec in source.data["specs"]:
        tiling = tiling_of(spec["tiling"])
        default = spec.get("svgen_forward", {}).get("median_ms")
        if default is not None:
            yield Variant(source, spec["source"], spec["spec"], tiling, (), default)
        for label, timed in spec.get("variants", {}).items():
            ms = timed.get("forward", {}).get("median_ms")
            if ms is None or (label == "before" and source.data.get("settings_before")):
                continue  # untimed, or a kernel of other module constants: no size to key
            runtime = (
                source.data.get("runtime_before", {})
                if label == "before"
                else runtime_of_label(label)
            )
            yield Variant(source, spec["source"], spec["spec"], tiling, runtime_key(runtime), ms)


# ----------------------------------------------------------------------------- choosing
def newest(results: Results, spec: str, tiling: Tiling, entry: str) -> Timing | None:
    """The newest timing of `spec` at `tiling` that has `entry` (a figure, not a failure)."""
    found = [t for t in results.timings if t.spec == spec and t.tiling == tiling and t.ms(entry)]
    return max(found, key=lambda t: t.source.order, default=None)


def newest_splash(results: Results, spec: str, direction: str) -> Timing | None:
    """The newest timing of `spec` whose file timed Splash given the mask at its best in
    `direction` (an exact spec's Splash figures hold for every svgen tiling)."""
    found = [
        t
        for t in (*results.timings, *results.left_out)
        if t.spec == spec and t.source.yardstick and t.ms(f"splash_mask_{direction}")
    ]
    return max(found, key=lambda t: t.source.order, default=None)


def kernel_status(results: Results, timing: Timing, direction: str) -> str:
    """Whether `timing` timed the kernels HEAD's code makes: its recorded fingerprint against
    the reference (bench/results/fingerprints.json) of the same spec at the same tiling."""
    recorded = timing.result.get("fingerprint", {}).get(direction)
    if not recorded:
        return "not recorded"
    reference = results.fingerprints.get(timing.spec)
    if reference is None or tiling_of(reference["tiling"]) != timing.tiling:
        return "no reference"
    return "HEAD's" if reference.get(direction) == recorded else "changed since"


def bundles(results: Results, spec: str, tiling: Tiling, runtime: tuple = ()) -> int | None:
    return results.sizes.get((spec, tiling, runtime))


def budget() -> int:
    from svgen.analysis.targets import TARGETS

    return TARGETS[CHIP].program_bundles


def head_tiling(root: pathlib.Path, spec: str) -> Tiling:
    """The tiling `spec` (a path under root) takes on the chip at HEAD."""
    from svgen.spec import load_spec

    t = load_spec(root / spec, chip=CHIP).tiling
    return (t.block_q, t.block_kv, t.cq, t.ckv, t.align)


@dataclasses.dataclass(frozen=True)
class CliffRow:
    label: str
    spec: str
    tiling: Tiling
    runtime: tuple
    bundles: int
    ms: float
    commit: str
    reference: tuple[float, Tiling, tuple, str] | None  # ms, tiling, runtime, commit

    @property
    def slowdown(self) -> float | None:
        return None if self.reference is None else self.ms / self.reference[0]


def cliff_rows(results: Results) -> list[CliffRow]:
    """Every forward kernel of a `cliff` file whose program was counted, smallest first, with
    the fastest kernel of the same spec whose program fits the budget: at the same tiling where
    one was timed (the same work), else at any."""
    timed = [
        (v.spec, v.name, v.tiling, v.runtime, v.ms, v.source)
        for v in results.variants
        if "cliff" in v.source.sections
    ]
    timed += [
        (t.spec, t.name, t.tiling, (), t.ms("svgen_forward"), t.source)
        for t in results.timings
        if "cliff" in t.source.sections and t.ms("svgen_forward")
    ]
    fitting = _fitting_kernels(results)
    rows = []
    for spec, name, tiling, runtime, ms, source in timed:
        count = bundles(results, spec, tiling, runtime)
        if count is None:
            continue
        same = [f for f in fitting if f[0] == spec and f[2] == tiling]
        pool = same or [f for f in fitting if f[0] == spec]
        best = min(pool, key=lambda f: f[1], default=None)
        reference = None if best is None else (best[1], best[2], best[3], best[4])
        label = name + (f" ({runtime_words(runtime)})" if runtime else "")
        rows.append(CliffRow(label, spec, tiling, runtime, count, ms, source.commit, reference))
    return sorted(rows, key=lambda r: (r.bundles, r.label))


def _fitting_kernels(results: Results) -> list[tuple]:
    """(spec, ms, tiling, runtime, commit) of the newest timing of each counted kernel whose
    program fits the budget."""
    newest_of: dict = {}
    # kernel_ab files of the cliff only: older ones ran other defaults (straight.MAX_WORDS 8)
    for v in results.variants:
        if "cliff" in v.source.sections:
            newest_of[(v.spec, v.tiling, v.runtime)] = (v.source.order, v.ms, v.source.commit)
    for t in results.timings:
        ms = t.ms("svgen_forward")
        key = (t.spec, t.tiling, ())
        if ms and (key not in newest_of or newest_of[key][0] < t.source.order):
            newest_of[key] = (t.source.order, ms, t.source.commit)
    limit = budget()
    out = []
    for (spec, tiling, runtime), (_, ms, commit) in sorted(newest_of.items(), key=repr):
        count = bundles(results, spec, tiling, runtime)
        if count is not None and count <= limit:
            out.append((spec, ms, tiling, runtime, commit))
    return out


def runtime_words(runtime: tuple) -> str:
    return ", ".join(f"{name}={value}" for name, value in runtime)


#: Straight-line bodies left out, as kernel_size's --runtime names it: the one shrink step of
#: svgen.chip.program_size.chip_free that the counted programs cover.
WITHOUT_STRAIGHT = (("straight.MAX_WORDS", 0),)


def chip_free_pick(results: Results, spec: str, patterns: int = 1) -> tuple[Tiling, tuple] | None:
    """(tiling, runtime settings) that `svgen compile --target v5e` takes for a spec that
    gives none, from the counted programs: the first of V5E_TILINGS whose default program
    fits the budget, or fits with its straight-line bodies left out
    (svgen.chip.program_size.chip_free). None where a count it needs was not taken, and where
    a tiling is over the budget with both: the compiler's further steps there (one kernel per
    pattern, whole masks) are not counted in the results. With several `patterns`, one kernel
    per pattern is the compiler's first step: past the default program, nothing is counted."""
    from svgen.chip.program_size import V5E_TILINGS

    limit = budget()
    for tiling in V5E_TILINGS:
        t = (*tiling, "exact")
        for runtime in ((), WITHOUT_STRAIGHT) if patterns < 2 else ((),):
            count = bundles(results, spec, t, runtime)
            if count is None:
                return None
            if count <= limit:
                return t, runtime
        return None
    return None


# ----------------------------------------------------------------------------- facts
def facts(results: Results) -> dict:
    """The chip figures svgen's code quotes, as the results give them: the program-size
    cliff (the largest program that ran at its work's rate, the smallest that ran slowly, how
    much slower) and the static model's error (svgen.analysis.targets.ChipMeasured)."""
    rows = [r for r in cliff_rows(results) if r.slowdown is not None]
    fast = [r for r in rows if r.slowdown < AT_RATE]
    slow = [r for r in rows if r.slowdown >= SLOW]
    out = {
        "program_fast_bundles": max((r.bundles for r in fast), default=None),
        "program_slow_bundles": min((r.bundles for r in slow), default=None),
        "program_slowdown": (
            (round(min(r.slowdown for r in slow), 1), round(max(r.slowdown for r in slow), 1))
            if slow
            else None
        ),
    }
    if results.model is not None:
        ratios = sorted(r["chip_ms"] / r["model_ms"] for r in results.model.data["rows"])
        typical = [x for x in ratios if x < SLOW]
        out["model_pairs"] = len(ratios)
        out["model_typical"] = (round(typical[0], 2), round(typical[-1], 2), len(typical))
        out["model_worst"] = round(ratios[-1], 1)
    return out


def fact_mismatches(found: dict) -> list[str]:
    """Each figure of svgen.analysis.targets' v5e record that the results do not give."""
    from svgen.analysis.targets import TARGETS

    measured = TARGETS[CHIP].measured
    lines = []
    for name, value in sorted(found.items()):
        written = getattr(measured, name, None)
        if written is None:
            continue
        if _normal(written) != _normal(value):
            lines.append(
                f"svgen/analysis/targets.py: {CHIP}'s measured.{name} is {written!r}, the "
                f"results give {value!r}"
            )
    return lines


def _normal(value):
    return list(value) if isinstance(value, (tuple, list)) else value
