"""svgen's GPU (Pallas Triton) forward kernel: what can be said about its speed, with and
without a GPU (issue 12).

    python bench/gpu_bench.py [--specs NAME,...] [--tiles 64x64,128x64]
    python bench/gpu_bench.py --time [--runs N] [--specs ...]        # needs a CUDA GPU
    python bench/gpu_bench.py --time --interpret --tiny [--specs ...]  # CPU, tests the script

Default (static, no GPU, no timing): for every shipped generated module (generated/*.py) and
GPU tile, the GPU tables `svgen.runtime.gpu.GpuTables` are built as the kernel builds them and
one markdown table is printed, one row per (spec, pattern, tile):

  density        kept pairs / seq_len^2 (the module docstring's "Kept pairs" line)
  FULL, BOUNDARY GPU tiles the kernel visits per head using the pattern (EMPTY: never)
  visited        visited GPU tiles / all GPU tiles (ceil(seq / block_q) x ceil(seq / block_kv))
  pairs visited  real (q, k) pairs inside visited tiles / seq_len^2: never below density
  BOUNDARY share BOUNDARY / visited (tiles evaluating the mask)
  CSR bytes      row_offsets + entries of the whole table (all patterns of the spec)

These are work counts, not times: no speed claim is made without a GPU.

--time (a CUDA GPU, e.g. one H200): per spec at full size, bf16, random q, k, v, batch 1, the
module's head assignment (HEAD_PATTERN, or head h -> pattern h % patterns), jit, warm-up,
`block_until_ready`, the median of --runs calls, side by side:

  svgen          gpu_attention_of(module, block_q, block_kv) (the per-head token reorder of
                 mixed specs is inside the timed call)
  dense mha      jax.experimental.pallas.ops.gpu.attention.mha (dense flash attention, Pallas
                 Triton), inputs [1, seq, heads, d] prepared outside the timed call; it needs
                 seq to be a multiple of its blocks (128), so the sequence is zero-padded to a
                 multiple of 128 (padding keys are attended: the dense kernel has no mask)
  masked XLA     jax.nn.dot_product_attention with the dense boolean mask [1, heads, seq, seq],
                 only where mask and f32 scores fit in device memory (else skipped, with a note)

--interpret --tiny runs the same timing code on the CPU in Pallas interpret mode, on the specs
scaled down to 520 video tokens (+ 40 text), 2 heads: it tests this script; its times mean
nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import re
import statistics
import sys
import tempfile
import time

import numpy as np

from svgen import libtpu_env

REPO = pathlib.Path(__file__).resolve().parent.parent

TINY_GEOMETRY = {"frames": 5, "height": 4, "width": 26}  # 520 video tokens
MHA_BLOCK = 128  # BlockSizes.get_default() of jax's Pallas Triton mha (block_q = block_k)


def import_file(path: pathlib.Path, name: str | None = None):
    spec = importlib.util.spec_from_file_location(name or f"_gpu_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shipped(names: list[str] | None) -> list[str]:
    all_names = sorted(p.stem for p in (REPO / "generated").glob("*.py"))
    if not names:
        return all_names
    unknown = sorted(set(names) - set(all_names))
    if unknown:
        raise SystemExit(f"unknown spec(s) {', '.join(unknown)}; shipped: {', '.join(all_names)}")
    return [n for n in all_names if n in names]


def kept_pairs(module, plan=None) -> list[tuple[int, int]]:
    """(kept pairs, total pairs) per pattern: the plan's, or the module docstring's."""
    if plan is not None:
        return [(p.classification.kept_pairs, p.total_pairs) for p in plan.patterns]
    found = re.findall(r"Kept pairs: ([\d,]+) of ([\d,]+)", module.__doc__ or "")
    if len(found) != len(module._PATTERNS):
        raise ValueError(f"{module.__name__}: no 'Kept pairs' line per pattern in its docstring")
    return [(int(a.replace(",", "")), int(b.replace(",", ""))) for a, b in found]


def default_head_pattern(module) -> np.ndarray:
    hp = getattr(module, "HEAD_PATTERN", None)
    if hp is None:
        return np.arange(module.HEADS) % len(module._PATTERNS)
    return np.asarray(hp)


# -- static mode ------------------------------------------------------------------------------


def pattern_stats(tables, pattern: int, seq_len: int) -> dict:
    from svgen.runtime.kinds import TileKind
    from svgen.runtime.tables import KIND_MASK, KV_BLOCK_SHIFT

    gq, gk = tables.num_q_tiles, tables.num_kv_tiles
    rows = tables.row_offsets[pattern * gq : (pattern + 1) * gq + 1].astype(np.int64)
    entries = tables.entries[rows[0] : rows[-1]].astype(np.int64)
    q_tile = np.repeat(np.arange(gq), np.diff(rows))
    kv_tile, kind = entries >> KV_BLOCK_SHIFT, entries & KIND_MASK
    q_len = np.minimum(tables.block_q, seq_len - q_tile * tables.block_q)
    kv_len = np.minimum(tables.block_kv, seq_len - kv_tile * tables.block_kv)
    visited = len(entries)
    return {
        "full": int(np.count_nonzero(kind == TileKind.FULL)),
        "boundary": int(np.count_nonzero(kind == TileKind.BOUNDARY)),
        "visited": visited,
        "tiles": gq * gk,
        "visited_pairs": int(np.sum(q_len * kv_len)),
    }


def static_rows(names: list[str], tiles: list[tuple[int, int]]) -> list[dict]:
    from svgen.runtime.gpu import GpuTables

    rows = []
    for name in names:
        module = import_file(REPO / "generated" / f"{name}.py")
        kept = kept_pairs(module)
        for bq, bkv in tiles:
            tables = GpuTables.from_runs([p.runs for p in module._PATTERNS], module.SHAPE, bq, bkv)
            csr_bytes = tables.row_offsets.nbytes + tables.entries.nbytes
            for index, pattern in enumerate(module._PATTERNS):
                s = pattern_stats(tables, index, module.SEQ_LEN)
                rows.append(
                    dict(
                        s,
                        spec=name,
                        pattern=pattern.name,
                        tile=f"{bq}x{bkv}",
                        kept=kept[index][0],
                        total_pairs=kept[index][1],
                        csr_bytes=csr_bytes,
                    )
                )
    return rows


def print_static(rows: list[dict]) -> None:
    print("## svgen GPU kernel: tiles visited vs density (static: tables only, no timing)")
    print()
    print(
        "Work counts from the GPU tables (svgen.runtime.gpu.GpuTables), per head using the "
        "pattern; no speed claim without a GPU (run `--time` on one)."
    )
    print()
    print(
        "| spec | pattern | GPU tile | density | FULL | BOUNDARY | visited | "
        "pairs visited | BOUNDARY share | CSR bytes (all patterns) |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['spec']} | {r['pattern']} | {r['tile']} | {r['kept'] / r['total_pairs']:.4f} "
            f"| {r['full']:,} | {r['boundary']:,} | {r['visited'] / r['tiles']:.4f} "
            f"| {r['visited_pairs'] / r['total_pairs']:.4f} "
            f"| {r['boundary'] / max(r['visited'], 1):.3f} | {r['csr_bytes']:,} |"
        )


# -- timing mode ------------------------------------------------------------------------------


def tiny_spec_text(path: pathlib.Path) -> str:
    """The spec at TINY_GEOMETRY (+ 40 text tokens if it has text), 2 heads, bf16, 128 x 128
    tiles; prefixes and band widths scaled with the video (as tests/conftest.py does)."""
    import yaml

    spec = yaml.safe_load(path.read_text())
    full = spec["geometry"]
    full_video = full["frames"] * full["height"] * full["width"]
    small = dict(full, **TINY_GEOMETRY)
    small_video = small["frames"] * small["height"] * small["width"]
    if full.get("text_tokens"):
        small["text_tokens"] = 40
    spec["geometry"] = small
    spec["attention"] = dict(spec["attention"], heads=2, dtype="bfloat16")
    spec["tiling"] = {"block_q": 128, "block_kv": 128}

    def scale(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "prefix":
                    value["tokens"] = value["tokens"] * small_video // full_video
                elif key == "band" and "width" in value:
                    value["width"] = value["width"] * small_video // full_video
                else:
                    scale(value)
        elif isinstance(node, list):
            for item in node:
                scale(item)

    scale(spec.get("mask", {}))
    scale(spec.get("patterns", {}))
    return yaml.safe_dump(spec, sort_keys=False)


def compile_tiny(name: str, out_dir: pathlib.Path):
    from svgen import codegen
    from svgen.analysis import analyze
    from svgen.spec import parse_spec

    spec = parse_spec(tiny_spec_text(REPO / "specs" / f"{name}.yaml"), source=f"{name}.yaml")
    plan = analyze(spec)
    for filename, data in codegen.render(plan, f"specs/{name}.yaml").items():
        (out_dir / filename).write_bytes(data)
    return plan, import_file(out_dir / codegen.module_filename(spec.name), f"_tiny_{name}")


def user_order_keep(pattern_plan) -> np.ndarray:
    """keep[q, k] in the user's token order (the IR mask evaluated on every pair)."""
    lay = pattern_plan.layout
    c = lay.coordinates(np.arange(lay.seq_len))
    keep = pattern_plan.mask.evaluate(c.reshape(-1, 1), c.reshape(1, -1))
    position = np.empty(lay.seq_len, np.int64)
    position[lay.original_index(np.arange(lay.seq_len))] = np.arange(lay.seq_len)
    return keep[np.ix_(position, position)]


def median_ms(fn, args, runs: int, warmup: int) -> tuple[float, object]:
    """(median ms of `runs` calls after compiling and `warmup` calls, the first output)."""
    out = fn(*args)
    out.block_until_ready()  # compile
    for _ in range(warmup):
        fn(*args).block_until_ready()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), out


def device_memory_bytes() -> int | None:
    import jax

    try:
        return int(jax.devices()[0].memory_stats()["bytes_limit"])
    except Exception:  # CPU devices have no memory_stats
        return None


def time_spec(name, module, plan, tiles, args, notes) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import mha

    from svgen.runtime.gpu import gpu_attention_of

    heads, seq, d = module.HEADS, module.SEQ_LEN, module.HEAD_DIM
    sm_scale = 1.0 / np.sqrt(d)
    head_pattern = default_head_pattern(module)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (heads, seq, d), jnp.bfloat16) for key in keys)
    hp = jnp.asarray(head_pattern, jnp.int32)
    rows = []

    # dense baselines (once per spec)
    padded = -(-seq // MHA_BLOCK) * MHA_BLOCK
    if padded != seq:
        notes.append(f"{name}: dense mha on seq {seq:,} zero-padded to {padded:,}")

    def to_mha(x):
        x = jnp.transpose(x, (1, 0, 2))[None]  # [1, seq, heads, d]
        return jnp.pad(x, ((0, 0), (0, padded - seq), (0, 0), (0, 0)))

    mq, mk, mv = (jax.block_until_ready(to_mha(x)) for x in (q, k, v))
    run_mha = jax.jit(
        lambda q, k, v: mha(q, k, v, None, sm_scale=sm_scale, interpret=args.interpret)
    )
    mha_ms, _ = median_ms(run_mha, (mq, mk, mv), args.runs, args.warmup)

    need = heads * seq * seq * (4 * 3 + 1)  # f32 scores, exp, probs + the bool mask
    limit = device_memory_bytes()
    xla_ms = xla_out = None
    if limit is not None and need > 0.8 * limit:
        notes.append(
            f"{name}: masked XLA skipped (needs ~{need / 2**30:,.0f} GiB, device has "
            f"{limit / 2**30:,.0f} GiB)"
        )
    else:
        if plan is None:
            from svgen.analysis import analyze
            from svgen.spec import load_spec

            plan = analyze(load_spec(REPO / "specs" / f"{name}.yaml"))
        keeps = [user_order_keep(p) for p in plan.patterns]
        mask = jnp.asarray(np.stack([keeps[p] for p in head_pattern.tolist()])[None])
        tq, tk, tv = (jnp.transpose(x, (1, 0, 2))[None] for x in (q, k, v))  # [1, seq, h, d]
        run_xla = jax.jit(
            lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m, scale=sm_scale)
        )
        xla_ms, xla_out = median_ms(run_xla, (tq, tk, tv, mask), args.runs, args.warmup)

    for bq, bkv in tiles:
        attention = gpu_attention_of(module, block_q=bq, block_kv=bkv)
        run = jax.jit(
            lambda q, k, v, hp, attention=attention: attention(
                q, k, v, head_pattern=hp, interpret=args.interpret
            )
        )
        ms, out = median_ms(run, (q, k, v, hp), args.runs, args.warmup)
        err = None
        if xla_out is not None:  # the sparse output checked against the masked dense one
            ref = jnp.transpose(xla_out[0], (1, 0, 2)).astype(jnp.float32)
            err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
        rows.append(
            dict(
                spec=name,
                tile=f"{bq}x{bkv}",
                seq=seq,
                heads=heads,
                svgen=ms,
                mha=mha_ms,
                xla=xla_ms,
                err=err,
            )
        )
    return rows


def print_timing(rows, notes, meaningless: bool) -> None:
    print("## svgen GPU kernel vs dense attention: forward time (bf16, batch 1, median)")
    print()
    if meaningless:
        print(
            "**CPU, Pallas interpret mode, scaled-down specs: these numbers are MEANINGLESS "
            "(they test the script only).**"
        )
        print()
    print(
        "| spec | seq | heads | GPU tile | svgen ms | dense mha ms | speedup vs mha "
        "| masked XLA ms | speedup vs XLA | max abs diff vs XLA |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        xla = "skipped" if r["xla"] is None else f"{r['xla']:.3f}"
        vs_xla = "-" if r["xla"] is None else f"{r['xla'] / r['svgen']:.2f}x"
        err = "-" if r["err"] is None else f"{r['err']:.1e}"
        print(
            f"| {r['spec']} | {r['seq']:,} | {r['heads']} | {r['tile']} | {r['svgen']:.3f} "
            f"| {r['mha']:.3f} | {r['mha'] / r['svgen']:.2f}x | {xla} | {vs_xla} | {err} |"
        )
    if notes:
        print()
        for note in notes:
            print(f"- {note}")


def timing(names, tiles, args) -> int:
    import jax

    if not args.interpret and not any(d.platform == "gpu" for d in jax.devices()):
        print(
            "gpu_bench --time needs a CUDA GPU (jax.devices() has none: "
            f"{', '.join(sorted({d.platform for d in jax.devices()}))}); "
            "use --interpret --tiny to test the script on the CPU",
            file=sys.stderr,
        )
        return 2
    if args.tiny and not args.interpret:
        print("--tiny is for --interpret (testing the script)", file=sys.stderr)
        return 2
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            plan = None
            if args.tiny:
                plan, module = compile_tiny(name, pathlib.Path(tmp))
            else:
                module = import_file(REPO / "generated" / f"{name}.py")
            rows += time_spec(name, module, plan, tiles, args, notes)
    print_timing(rows, notes, meaningless=args.interpret)
    return 0


def parse_tiles(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in t.split("x")) for t in text.split(",") if t]


def main(argv=None) -> int:
    libtpu_env.prepare()  # before JAX starts its backends (see svgen/libtpu_env.py)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default="", help="comma-separated spec names (default: all)")
    parser.add_argument("--tiles", default="64x64,128x64", help="GPU tiles, e.g. 64x64,128x64")
    parser.add_argument("--time", action="store_true", help="time on a CUDA GPU")
    parser.add_argument("--runs", type=int, default=20, help="timed calls (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU)")
    parser.add_argument("--tiny", action="store_true", help="scaled-down specs (with --interpret)")
    args = parser.parse_args(argv)
    names = shipped([n for n in args.specs.split(",") if n])
    tiles = parse_tiles(args.tiles)
    if args.time:
        if args.interpret:
            args.runs, args.warmup = min(args.runs, 2), min(args.warmup, 1)
        return timing(names, tiles, args)
    if args.interpret or args.tiny:
        parser.error("--interpret and --tiny go with --time")
    print_static(static_rows(names, tiles))
    return 0


if __name__ == "__main__":
    sys.exit(main())
