"""`svgen tune --measure`: a spec's tiling chosen by timing candidates on the attached TPU.

The static model (svgen.estimate.tune) ranks tilings differently from a v5e (docs/measured.md:
it chose 2048 x 4096 two-level tiles that the chip runs 2.4x slower than 1024 x 1024 ones),
so here nothing is ranked by it: each candidate is compiled for the chip and timed
(svgen.chip.chip_bench, without Splash), forward and, for a spec used in training, forward
plus backward. A candidate that fails to compile or to run, or whose output misses the
float32 reference on sampled rows, is infeasible, never slow.

Nothing stale is acted on, and nothing noisy without saying so:
- each measurement is cached on disk under (chip, jax/libtpu versions, spec digest, the
  digest of every source file the kernels import, tiling, direction): an edit to a kernel
  times every candidate again, and tuning again after an interruption times only what is
  missing;
- a failure is cached with its reason and retried once by a later run (a chip can fail a
  call once for reasons of its own); a second failure stays cached, with both reasons;
- each candidate keeps the fastest of its runs beside the median, and so its spread;
- the winner comes with its margin over the runner-up against the two's spread (`Verdict`),
  and a margin inside that spread is called a tie within noise (`--apply` still writes the
  fastest, and says it was a tie).

A budget of seconds stops the search between candidates; what was not timed is listed as such.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Callable

from svgen.core.safe_io import read_json_cache, write_json_cache
from svgen.chip import chip_bench
from svgen.estimate import measure

#: (block_q, block_kv, compute_q, compute_kv), in the order they are timed. First 1024 x 2048
#: tiles of eight 512 x 512 compute blocks: on a v5e the fastest of the tilings timed for the
#: blog, spatial and both Self-Forcing specs, forward and forward + backward (docs/measured.md,
#: "A tiling without a chip"). Then tiles of 1024 x 1024 keys split into two compute blocks
#: (straight-line code overlaps one block's softmax with the other's matmuls: the FULL path
#: ran faster than unsplit), the other 1024 x 2048 tiles where the program stays small, then
#: one-level tiles (faster than the two-level tiles of large programs that the static model
#: chose), the largest first.
MEASURED_TILINGS = (
    (1024, 2048, 512, 512),
    (1024, 1024, 1024, 512),
    (1024, 1024, 512, 1024),
    (1024, 2048, 1024, 512),
    (1024, 1024, 1024, 1024),
    (512, 1024, 512, 512),
    (1024, 1024, 512, 512),
    (512, 1024, 512, 1024),
    (1024, 2048, 1024, 1024),
    (2048, 1024, 2048, 1024),
    (512, 512, 512, 512),
)
DEFAULT_BUDGET_S = 540.0


#: Attempts a failing candidate gets, each in its own run: a chip can fail a call once for
#: reasons of its own (a busy host, a runtime hiccup), so one failure is not the last word.
MAX_ATTEMPTS = 2


@dataclasses.dataclass(frozen=True)
class Trial:
    tiling: tuple[int, int, int, int]
    ms: float | None  # the median of the timed calls (forward, or forward + backward)
    per_direction: dict
    error: str | None = None
    cached: bool = False
    min_ms: float | None = None  # the fastest of the same calls
    runs: int | None = None
    failures: tuple[str, ...] = ()  # the reason of each failed attempt, oldest first

    def label(self) -> str:
        bq, bkv, cq, ckv = self.tiling
        tile = f"{bq}x{bkv}"
        return tile if (cq, ckv) == (bq, bkv) else f"{tile} / {cq}x{ckv}"

    @property
    def spread(self) -> float | None:
        """(median - fastest) / median: how far the median sits above the best run, a
        fraction. None where it says nothing: no timing, or one run (its own minimum)."""
        if self.ms is None or self.min_ms is None or (self.runs or 0) < 2 or self.ms <= 0:
            return None
        return (self.ms - self.min_ms) / self.ms

    @property
    def final(self) -> bool:
        """Whether a cached result stands: a timing, or a failure out of attempts."""
        return self.ms is not None or len(self.failures) >= MAX_ATTEMPTS

    def note(self) -> str:
        """Why an infeasible candidate is one, with its attempts; a timed one's earlier
        failure, if it had one."""
        if self.ms is not None:
            return f"failed once before: {self.failures[0]}" if self.failures else ""
        if not self.failures:
            return self.error or ""
        if len(self.failures) < MAX_ATTEMPTS:
            return f"{self.failures[0]} (retried on the next run)"
        first, last = self.failures[0], self.failures[-1]
        if first == last:
            return f"{last} (failed twice)"
        return f"{first}; retried: {last}"


def candidates(spec, tilings=MEASURED_TILINGS) -> list[tuple[int, int, int, int]]:
    """The spec's own tiling, then MEASURED_TILINGS, without repeats or tilings whose tiles
    are longer than the padded sequence needs (one tile would hold it all twice)."""
    t = spec.tiling
    own = (t.block_q, t.block_kv, t.cq, t.ckv)
    seq = spec.geometry.seq_len
    out = []
    for tiling in (own, *tilings):
        if tiling in out:
            continue
        if tiling != own and min(tiling[0], tiling[1]) >= 2 * max(seq, 128):
            continue
        out.append(tiling)
    return out


def _cache_file():
    return chip_bench.cache_dir() / "measured.json"


def _load_cache() -> dict:
    """The measurements cached so far, by key: the well-formed entries of the cache file
    (svgen.core.safe_io.read_json_cache: a file that is not a JSON object is ignored, said
    in one line, and rewritten by the next `_store`; so is a malformed entry)."""
    path = _cache_file()
    entries = read_json_cache(path, _entries)
    if entries is None:
        return {}
    good = {key: value for key, value in entries.items() if _is_entry(value)}
    if len(good) < len(entries):
        print(
            f"svgen: ignoring {len(entries) - len(good)} malformed entr"
            f"{'y' if len(entries) - len(good) == 1 else 'ies'} of the cache file {path}; "
            "it will be rewritten",
            file=sys.stderr,
        )
    return good


def _entries(value) -> dict:
    if not isinstance(value, dict):
        raise TypeError("the measured cache is a JSON object")
    return value


def _is_entry(value) -> bool:
    """A measurement as `_store` writes it: ms (a number, or None for an infeasible
    tiling), per_direction (direction -> ms) and error (text, or None); and, where present,
    min_ms (a number or None), runs (a whole number or None) and failures (a list of texts)."""

    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    def optional(key, kind) -> bool:
        return value.get(key) is None or kind(value[key])

    return (
        isinstance(value, dict)
        and optional("ms", number)
        and isinstance(value.get("per_direction"), dict)
        and all(number(ms) for ms in value["per_direction"].values())
        and optional("error", lambda x: isinstance(x, str))
        and optional("min_ms", number)
        and optional("runs", lambda x: isinstance(x, int) and not isinstance(x, bool))
        and optional(
            "failures", lambda x: isinstance(x, list) and all(isinstance(r, str) for r in x)
        )
    )


def _entry(trial: Trial) -> dict:
    """What the cache keeps of a trial."""
    return {
        "ms": trial.ms,
        "min_ms": trial.min_ms,
        "runs": trial.runs,
        "per_direction": trial.per_direction,
        "error": trial.error,
        "failures": list(trial.failures),
    }


def _cached_trial(tiling, entry: dict) -> Trial:
    """The trial a cache entry records. An infeasible entry without its failures (written
    before they were counted) counts as one failure: it is retried once more."""
    failures = tuple(entry.get("failures") or ())
    if entry["ms"] is None and not failures:
        failures = (entry.get("error") or "failed",)
    return Trial(
        tiling,
        entry["ms"],
        entry["per_direction"],
        entry.get("error"),
        cached=True,
        min_ms=entry.get("min_ms"),
        runs=entry.get("runs"),
        failures=failures,
    )


def _cache_key(chip: str, env: dict, spec, tiling, backward: bool) -> str:
    """What a measurement depends on. The kernels' source digest is in it so that no timing
    of an older kernel outlives an edit to one (svgen.estimate.measure.kernel_source_digest:
    svgen.runtime.kernel and every svgen module it imports)."""
    kernels = measure.kernel_source_digest()
    return json.dumps([chip, env, spec.digest, kernels, list(tiling), backward])


def _store(key: str, value: dict) -> None:
    """Add one measurement to the cache file (rewritten whole; where it cannot be written,
    tuning runs on without it)."""
    data = _load_cache()
    data[key] = value
    write_json_cache(_cache_file(), data, indent=1)


def parse_tiling(text: str) -> tuple[int, int, int, int]:
    """`BQxBKV` or `BQxBKV/CQxCKV` (an argparse type)."""
    import argparse

    try:
        tile, _, compute = text.partition("/")
        bq, bkv = (int(x) for x in tile.split("x"))
        cq, ckv = (int(x) for x in compute.split("x")) if compute else (bq, bkv)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected BQxBKV or BQxBKV/CQxCKV (such as 1024x1024), got {text!r}"
        ) from None
    return bq, bkv, cq, ckv


def with_tiling(spec, tiling: tuple[int, int, int, int]):
    """The spec with another tiling (its align kept); its digest names the spec, the tiling
    is part of every cache key beside it."""
    from svgen.spec import Tiling

    bq, bkv, cq, ckv = tiling
    return dataclasses.replace(
        spec,
        tiling=Tiling(
            bq, bkv, cq if cq != bq else None, ckv if ckv != bkv else None, spec.tiling.align
        ),
    )


def tune(
    spec,
    chip: str,
    *,
    backward: bool,
    budget_s: float = DEFAULT_BUDGET_S,
    options: chip_bench.Options | None = None,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[str], None] = lambda line: None,
    env: dict | None = None,
    use_cache: bool = True,
    tilings=MEASURED_TILINGS,
    own: bool = True,
) -> list[Trial]:
    """Every candidate's Trial, fastest first, infeasible and untimed ones last. A cached
    timing, or a failure out of attempts, is used as cached; a cached first failure is timed
    again while the budget lasts."""
    options = options or chip_bench.Options(warmup=1, iters=5, check_rows=64)
    options = dataclasses.replace(options, backward=backward, splash=False)
    env = env if env is not None else chip_bench.versions()
    cache = _load_cache() if use_cache else {}
    start = time.monotonic()
    trials = []
    tilings = candidates(spec, tilings)[0 if own else 1 :]
    for i, tiling in enumerate(tilings):
        key = _cache_key(chip, env, spec, tiling, backward)
        earlier = _cached_trial(tiling, cache[key]) if key in cache else None
        if earlier is not None and earlier.final:
            trials.append(earlier)
            continue
        if time.monotonic() - start > budget_s:
            trials.append(earlier or _untimed(tiling, budget_s))
            continue
        again = "again " if earlier is not None else ""
        progress(f"[{i + 1}/{len(tilings)}] {spec.name} {again}{Trial(tiling, None, {}).label()}")
        trial = _trial(spec, tiling, chip, options, clock)
        trial = dataclasses.replace(
            trial, failures=(earlier.failures if earlier else ()) + trial.failures
        )
        trials.append(trial)
        if use_cache:
            _store(key, _entry(trial))
    return sorted(trials, key=lambda t: (t.ms is None, t.ms or 0.0))


def _untimed(tiling, budget_s: float) -> Trial:
    return Trial(tiling, None, {}, f"not timed: the {budget_s:.0f} s budget ran out")


def _trial(spec, tiling, chip, options, clock) -> Trial:
    """One candidate timed: its median and fastest run, or why it is infeasible (one entry
    in `failures`)."""
    from svgen.spec.errors import SpecError

    try:
        result = chip_bench.bench_spec(with_tiling(spec, tiling), chip, options, clock=clock)
    except SpecError as exc:  # the compiler refuses the tiling (VMEM, SMEM, tile grid)
        return _failed(tiling, {}, f"refused by svgen: {exc}")
    per = {}
    last = None
    for direction in ("forward", "backward"):
        entry = result.get(f"svgen_{direction}")
        if entry is None:
            continue
        if "error" in entry:
            return _failed(tiling, per, f"{direction}: {entry['error']}")
        if entry.get("ok") is False:
            why = f"output off the reference (max error {entry['max_error']:.2e})"
            return _failed(tiling, per, f"{direction}: {why}")
        per[direction] = entry["median_ms"]
        last = entry  # backward's call runs the forward too: its time is the total
    if last is None:
        return _failed(tiling, per, "no direction was timed")
    return Trial(tiling, last["median_ms"], per, min_ms=last.get("min_ms"), runs=last.get("runs"))


def _failed(tiling, per_direction: dict, reason: str) -> Trial:
    return Trial(tiling, None, per_direction, reason, failures=(reason,))


# ----------------------------------------------------------------------------- the verdict
@dataclasses.dataclass(frozen=True)
class Verdict:
    """The fastest candidate against the runner-up. margin: the share of the runner-up's
    time the winner saves. noise: the two's spreads added, since either median may sit that
    far from its calls' best, in opposite directions; None where a spread is unknown."""

    winner: Trial | None
    runner_up: Trial | None = None
    margin: float | None = None
    noise: float | None = None

    @property
    def tie(self) -> bool | None:
        """Whether the margin is inside the noise (None: no runner-up or no spread)."""
        if self.margin is None or self.noise is None:
            return None
        return self.margin <= self.noise

    def sentence(self) -> str:
        if self.winner is None:
            return "no candidate compiled and ran"
        first = f"#1 ({self.winner.label()})"
        if self.runner_up is None:
            return f"{first} is the only candidate that ran: nothing to beat"
        beats = f"{first} beats #2 ({self.runner_up.label()}) by {_percent(self.margin)}"
        if self.noise is None:
            return f"{beats}, not weighed against noise: a spread needs two runs of each"
        if self.tie:
            return (
                f"{beats}, inside the {_percent(self.noise)} spread of the two: a tie within noise"
            )
        return f"{beats}, outside the {_percent(self.noise)} spread of the two"

    def to_json(self) -> dict:
        return {
            "winner": self.winner.label() if self.winner else None,
            "runner_up": self.runner_up.label() if self.runner_up else None,
            "margin": self.margin,
            "noise": self.noise,
            "tie_within_noise": self.tie,
            "says": self.sentence(),
        }


def verdict(trials: list[Trial]) -> Verdict:
    """The fastest two of `trials` (as `tune` returns them, fastest first) weighed."""
    timed = [t for t in trials if t.ms is not None]
    if len(timed) < 2:
        return Verdict(timed[0] if timed else None)
    winner, runner_up = timed[0], timed[1]
    margin = (runner_up.ms - winner.ms) / runner_up.ms
    spreads = (winner.spread, runner_up.spread)
    noise = None if None in spreads else sum(spreads)
    return Verdict(winner, runner_up, margin, noise)


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.2f} %"


def format_table(trials: list[Trial], chip: str, backward: bool) -> list[str]:
    """The trials as a Markdown table (median, fastest run and spread of each), then the
    verdict on the winner."""
    what = "forward + backward" if backward else "forward"
    lines = [
        f"| tiling | {what} ms on {chip} (median) | fastest run ms | spread | |",
        "|---|---:|---:|---:|---|",
    ]
    best = next((t.ms for t in trials if t.ms is not None), None)
    for t in trials:
        if t.ms is None:
            lines.append(f"| {t.label()} | - | - | - | {t.note()} |")
            continue
        fastest = "-" if t.min_ms is None else f"{t.min_ms:.2f}"
        spread = "-" if t.spread is None else _percent(t.spread)
        rel = f"{t.ms / best:.2f}x the best" if best else ""
        notes = (rel, "cached" if t.cached else "", t.note())
        lines.append(
            f"| {t.label()} | {t.ms:.2f} | {fastest} | {spread} | "
            f"{', '.join(x for x in notes if x)} |"
        )
    return lines + ["", verdict(trials).sentence()]
