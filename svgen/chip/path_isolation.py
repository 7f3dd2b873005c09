"""Where a spec's forward time goes on the attached TPU: its kernel timed with the tables
rewritten to isolate each path, all in one process.

    python -m svgen.chip.path_isolation SPEC[@BQxBKV[/CQxCKV]]... [--iters N] [--json FILE]
        [--variants shipped,unmasked,steps,dense] [--interpret]

Variants of one compiled module (same tiling, same grid walk):

  shipped   the module as `svgen compile` writes it (its output checked on sampled rows);
  unmasked  every BOUNDARY compute block run as FULL, EMPTY ones still skipped: no mask
            computed, same steps, tiles and blocks (shipped - unmasked = what computing
            and applying the mask costs);
  steps     every visited tile's kind set to EMPTY: the grid walks the same steps and DMAs
            the same blocks, each q tile is initialized and finalized, and nothing else
            (the bookkeeping and data-movement floor of this walk);
  dense     every tile of the grid visited as FULL: dense attention at this tiling (the
            FULL path's rate, per tile).

Outputs of the rewritten variants are not the spec's and are not checked. A table goes to
stdout with per-tile figures; `--json` keeps every figure with the chip, versions and
commit, saved after each spec. Without a TPU it stops with one line (exit 2), unless
`--interpret` (Pallas's interpreter on the CPU: checks the script, times nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import tempfile
import time

import jax
import numpy as np

from svgen.chip import chip_bench, measured_tune
from svgen.chip.kernel_ab import parse_item
from svgen.chip.splash_mask import head_patterns
from svgen.core import tables
from svgen.spec import load_spec

VARIANTS = ("shipped", "unmasked", "steps", "dense")
EMPTY, BOUNDARY, FULL = 0, 1, 2


def rewritten_runs(runs, variant: str, q_tiles: int, kv_tiles: int) -> np.ndarray:
    """The pattern's runs [n, 5] as the variant walks them (see the module docstring)."""
    runs = tables.as_runs(runs).copy()
    if variant == "unmasked":
        for i in np.flatnonzero(runs[:, 3] == BOUNDARY):
            runs[i, 3], runs[i, 4] = unmasked_word(int(runs[i, 4]))
    elif variant == "steps":
        runs[:, 3] = EMPTY
        runs[:, 4] = 0
    elif variant == "dense":
        runs = np.array([(q, 0, kv_tiles, FULL, 0) for q in range(q_tiles)], np.int64)
    return runs


def unmasked_word(blocks: int) -> tuple[int, int]:
    """(kind, blocks) of a BOUNDARY tile run unmasked: each BOUNDARY compute block of its
    word made FULL, its EMPTY blocks still skipped (a word of FULL blocks only, or a tile
    of one compute block, becomes a FULL tile)."""
    if blocks == 0:
        return FULL, 0
    fields, word = [], blocks
    while word:
        fields.append(word & ((1 << tables.BITS_PER_BLOCK) - 1))
        word >>= tables.BITS_PER_BLOCK
    fields = [FULL if kind == BOUNDARY else kind for kind in fields]
    return BOUNDARY, sum(kind << (tables.BITS_PER_BLOCK * i) for i, kind in enumerate(fields))


def variant_attention(module, variant: str):
    """The module's attention with each pattern's tables rewritten for `variant`."""
    if variant == "shipped":
        return module.attention
    shape = module.SHAPE
    q_tiles = shape.padded_seq_len // shape.block_q
    kv_tiles = shape.padded_seq_len // shape.block_kv
    patterns = tuple(
        dataclasses.replace(
            p,
            runs=rewritten_runs(p.runs, variant, q_tiles, kv_tiles),
            residual_masks=(),
            run_variants=None,
        )
        for p in module._PATTERNS
    )
    return module.kernel.make_attention(
        shape=shape,
        patterns=patterns,
        slots=module.SLOTS_PER_PIECE,
        default_head_pattern=module.HEAD_PATTERN,
        dtype=module.DTYPE,
    )


def tile_counts(module, assignment) -> dict:
    """Visited tiles of each kind and grid steps walked, summed over the heads."""
    counts = {"full": 0, "boundary": 0}
    for head_pattern in assignment:
        runs = tables.as_runs(module._PATTERNS[head_pattern].runs)
        counts["full"] += int(runs[runs[:, 3] == FULL, 2].sum())
        counts["boundary"] += int(runs[runs[:, 3] == BOUNDARY, 2].sum())
    shape = module.SHAPE
    counts["grid_tiles"] = (
        len(assignment)
        * (shape.padded_seq_len // shape.block_q)
        * (shape.padded_seq_len // shape.block_kv)
    )
    return counts


def bench_item(spec, chip: str, variants, options, progress) -> dict:
    result = {"spec": spec.name, "tiling": chip_bench.tiling_json(spec.tiling)}
    with tempfile.TemporaryDirectory(prefix="paths-on-chip-") as folder:
        progress(f"{spec.name}: compile for {chip}")
        plan, module = chip_bench.compile_module(spec, chip, pathlib.Path(folder))
        if spec.select is not None or not hasattr(module, "_PATTERNS"):
            return {**result, "error": "a select spec chooses its tiles per call: not rewritten"}
        assignment = head_patterns(module)
        result["tiles"] = tile_counts(module, assignment)
        q, k, v = chip_bench.draw_inputs(module, options.seed)
        rows = chip_bench.sampled_rows(int(module.SEQ_LEN), options.check_rows, options.seed)
        heads = np.asarray(assignment, np.int32)
        for variant in variants:
            attention = variant_attention(module, variant)

            @jax.jit
            def forward(q, k, v, attention=attention):
                return attention(
                    q, k, v, head_pattern=heads, token_order="kernel", interpret=options.interpret
                )

            progress(f"{spec.name}: {variant}")
            try:
                timing, out = chip_bench.time_calls(
                    forward,
                    (q, k, v),
                    warmup=options.warmup,
                    iters=options.iters,
                    clock=time.perf_counter,
                )
            except Exception as exc:  # a variant that fails is recorded, the others still run
                result[variant] = {"error": chip_bench._short(exc)}
                continue
            entry = timing.to_json()
            if variant == "shipped" and options.check_rows:
                reference = chip_bench.reference_rows(plan, assignment, q, k, v, rows)
                entry["max_error"] = chip_bench.max_error(out, reference, rows)
            result[variant] = entry
    return result


def table(results) -> list[str]:
    def ms(r, variant):
        value = r.get(variant, {}).get("median_ms")
        return f"{value:.2f}" if value is not None else "-"

    def per_tile(r, variant, tiles):
        value = r.get(variant, {}).get("median_ms")
        return f"{value * 1e3 / tiles:.2f}" if value is not None and tiles else "-"

    lines = [
        "| spec | tiling | FULL / BOUNDARY tiles | shipped ms | unmasked ms | steps ms | dense ms "
        "| dense us/tile | unmasked - steps us/visited tile | shipped - unmasked us/BOUNDARY tile |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['spec']} | | {r['error']} |")
            continue
        t = r["tiles"]
        visited = t["full"] + t["boundary"]
        tiling = r["tiling"]
        name = (
            f"{tiling['block_q']}x{tiling['block_kv']}/{tiling['compute_q']}x{tiling['compute_kv']}"
        )

        def diff(a, b, tiles):
            x, y = r.get(a, {}).get("median_ms"), r.get(b, {}).get("median_ms")
            return (
                f"{(x - y) * 1e3 / tiles:.2f}" if x is not None and y is not None and tiles else "-"
            )

        lines.append(
            f"| {r['spec']} | {name} | {t['full']} / {t['boundary']} | {ms(r, 'shipped')} "
            f"| {ms(r, 'unmasked')} | {ms(r, 'steps')} | {ms(r, 'dense')} "
            f"| {per_tile(r, 'dense', t['grid_tiles'])} | {diff('unmasked', 'steps', visited)} "
            f"| {diff('shipped', 'unmasked', t['boundary'])} |"
        )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("items", nargs="+", type=parse_item, metavar="SPEC[@TILING]")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--check-rows", type=int, default=64)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--target", default=None, help="the chip to compile for (--interpret only)")
    parser.add_argument("--interpret", action="store_true")
    args = parser.parse_args(argv)
    variants = tuple(args.variants.split(","))
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    chip = chip_bench.script_chip("path_isolation", args.interpret, args.target)
    if chip is None:
        return 2
    options = chip_bench.Options(
        iters=args.iters,
        warmup=0 if args.interpret else 2,
        check_rows=args.check_rows,
        interpret=args.interpret,
    )
    progress = chip_bench.script_progress("path_isolation")
    report = {
        "chip": chip,
        "commit": chip_bench.commit(),
        "source_digest": chip_bench.source_digest(),
        "results": [],
    }
    report.update({} if args.interpret else {"versions": chip_bench.versions()})
    for path, tiling in args.items:
        spec = load_spec(path, chip=chip)
        if tiling is not None:
            spec = measured_tune.with_tiling(spec, tiling)
        report["results"].append(bench_item(spec, chip, variants, options, progress))
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    for line in table(report["results"]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
