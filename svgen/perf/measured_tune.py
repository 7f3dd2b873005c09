"""`svgen tune --measure`: a spec's tiling chosen by timing candidates on the attached TPU.

The static model (svgen.perf.tune) ranks tilings differently from a v5e (docs/measured.md:
it chose 2048 x 4096 two-level tiles that the chip runs 2.4x slower than 1024 x 1024 ones),
so here nothing is ranked by it: each candidate is compiled for the chip and timed
(svgen.perf.chip_bench, without Splash), forward and, for a spec used in training, forward
plus backward. A candidate that fails to compile or to run, or whose output misses the
float32 reference on sampled rows, is infeasible, never slow. Each measurement is cached on
disk under (chip, jax/libtpu versions, spec digest, tiling, direction), so tuning again after
an interruption times only what is missing. A budget of seconds stops the search between
candidates; what was not timed is listed as such.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Callable

from svgen.core.safe_io import read_json_cache, write_json_cache
from svgen.perf import chip_bench

#: (block_q, block_kv, compute_q, compute_kv), in the order they are timed. First 1024 x 2048
#: tiles of eight 512 x 512 compute blocks: on a v5e the fastest of the tilings timed for the
#: blog, spatial and both Self-Forcing specs, forward and forward + backward (the blog spec
#: 69.94 ms against 71.99 at 1024 x 2048 / 1024 x 512 and 75.65 at 1024 x 1024 / 1024 x 512;
#: docs/measured.md, fourth session). Then tiles of 1024 x 1024 keys split into two compute
#: blocks (straight-line code overlaps one block's softmax with the other's matmuls: the FULL
#: path ran 1.10x faster than unsplit), the other 1024 x 2048 tiles where the program stays
#: small, then one-level tiles (1.2-5x faster than the two-level tiles of large programs that
#: the static model chose), the largest first.
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


@dataclasses.dataclass(frozen=True)
class Trial:
    tiling: tuple[int, int, int, int]
    ms: float | None  # the median over directions' sum (forward, or forward + backward)
    per_direction: dict
    error: str | None = None
    cached: bool = False

    def label(self) -> str:
        bq, bkv, cq, ckv = self.tiling
        tile = f"{bq}x{bkv}"
        return tile if (cq, ckv) == (bq, bkv) else f"{tile} / {cq}x{ckv}"


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
    tiling), per_direction (direction -> ms) and error (text, or None)."""

    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    return (
        isinstance(value, dict)
        and (value.get("ms") is None or number(value["ms"]))
        and isinstance(value.get("per_direction"), dict)
        and all(number(ms) for ms in value["per_direction"].values())
        and (value.get("error") is None or isinstance(value["error"], str))
    )


def _store(key: str, value: dict) -> None:
    """Add one measurement to the cache file (rewritten whole; where it cannot be written,
    tuning runs on without it)."""
    data = _load_cache()
    data[key] = value
    write_json_cache(_cache_file(), data, indent=1)


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
    """Every candidate's Trial, fastest first, infeasible and untimed ones last."""
    options = options or chip_bench.Options(warmup=1, iters=5, check_rows=64)
    options = dataclasses.replace(options, backward=backward, splash=False)
    env = env if env is not None else chip_bench.versions()
    cache = _load_cache() if use_cache else {}
    start = time.monotonic()
    trials = []
    tilings = candidates(spec, tilings)[0 if own else 1 :]
    for i, tiling in enumerate(tilings):
        key = json.dumps([chip, env, spec.digest, list(tiling), backward])
        label = Trial(tiling, None, {}).label()
        if key in cache:
            trials.append(
                Trial(
                    tiling,
                    cache[key]["ms"],
                    cache[key]["per_direction"],
                    cache[key].get("error"),
                    cached=True,
                )
            )
            continue
        if time.monotonic() - start > budget_s:
            trials.append(
                Trial(tiling, None, {}, f"not timed: the {budget_s:.0f} s budget ran out")
            )
            continue
        progress(f"[{i + 1}/{len(tilings)}] {spec.name} {label}")
        trial = _trial(spec, tiling, chip, options, clock)
        trials.append(trial)
        if use_cache and not (trial.error or "").startswith("not timed"):
            _store(
                key, {"ms": trial.ms, "per_direction": trial.per_direction, "error": trial.error}
            )
    return sorted(trials, key=lambda t: (t.ms is None, t.ms or 0.0))


def _trial(spec, tiling, chip, options, clock) -> Trial:
    from svgen.spec.errors import SpecError

    try:
        result = chip_bench.bench_spec(with_tiling(spec, tiling), chip, options, clock=clock)
    except SpecError as exc:  # the compiler refuses the tiling (VMEM, SMEM, tile grid)
        return Trial(tiling, None, {}, f"refused by svgen: {exc}")
    per = {}
    total = 0.0
    for direction in ("forward", "backward"):
        entry = result.get(f"svgen_{direction}")
        if entry is None:
            continue
        if "error" in entry:
            return Trial(tiling, None, per, f"{direction}: {entry['error']}")
        if entry.get("ok") is False:
            return Trial(
                tiling,
                None,
                per,
                f"{direction}: output off the reference (max error {entry['max_error']:.2e})",
            )
        per[direction] = entry["median_ms"]
        total = entry["median_ms"]  # backward's call runs the forward too
    return Trial(tiling, total, per)


def format_table(trials: list[Trial], chip: str, backward: bool) -> list[str]:
    what = "forward + backward" if backward else "forward"
    lines = [f"| tiling | {what} ms on {chip} | |", "|---|---:|---|"]
    best = next((t.ms for t in trials if t.ms is not None), None)
    for t in trials:
        if t.ms is None:
            lines.append(f"| {t.label()} | - | {t.error} |")
        else:
            note = "cached" if t.cached else ""
            rel = f"{t.ms / best:.2f}x the best" if best else ""
            lines.append(f"| {t.label()} | {t.ms:.2f} | {', '.join(x for x in (rel, note) if x)} |")
    return lines
