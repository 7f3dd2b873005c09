"""svgen's GPU (Pallas Triton) forward kernel: what can be said about its speed, with and
without a GPU (issue 12).

    python -m svgen.chip.gpu_bench [--specs NAME,...] [--tiles 64x64,128x64]
    python -m svgen.chip.gpu_bench --compile [--target h100|h200] [--specs ...] [--tiles ...]
    python -m svgen.chip.gpu_bench --time [--runs N] [--specs ...]        # needs a CUDA GPU
    python -m svgen.chip.gpu_bench --time --interpret --tiny [--specs ...]  # CPU, tests it

Every mode works from what `svgen compile SPEC --target h100` produces: for each shipped spec
(the checkout's specs/*.yaml, named by --specs) and GPU tile, the GPU plan `analyze(spec,
target_name="h100")` with the spec's `gpu` tiles set to that tile (classified at the GPU tiles
themselves), its CSR tables (`plan.tables`, svgen.core.gpu_tables.GpuTables) and, for
--compile and --time, the `<name>_gpu.py` module rendered from it into a scratch directory.

Default (static, no GPU, no timing): one markdown table, one row per (spec, pattern, tile):

  density        kept pairs / seq_len^2 (the plan's classification)
  FULL, BOUNDARY GPU tiles the kernel visits per head using the pattern (EMPTY: never)
  visited        visited GPU tiles / all GPU tiles (ceil(seq / block_q) x ceil(seq / block_kv))
  pairs visited  real (q, k) pairs inside visited tiles / seq_len^2: never below density
  BOUNDARY share BOUNDARY / visited (tiles evaluating the mask)
  CSR bytes      row_offsets + entries of the whole table (all patterns of the spec)

These are work counts, not times: no speed claim is made without a GPU.

--compile (no GPU; the toolchain of `.gpu-aot`, see svgen/chip/gpu_aot.py): per spec, the
deviceless compile facts for --target of svgen's GPU module at the spec's own `gpu` tiling (or
at each --tiles tile when given), from `svgen.chip.gpu_aot.compile_module`: grid, threads,
shared memory, registers, spills (ptxas), wgmma instructions in the PTX; beside it JAX's dense
Pallas Triton flash attention (`jax.experimental.pallas.ops.gpu.attention.mha`, its default
128 x 128 blocks) compiled the same way, in a child process (this module with --dense-child)
against the same target description, on [1, seq, heads, d] bf16 inputs with seq zero-padded to
a multiple of 128, its launch facts read from XLA's dump the same way. Also per row: the tiles a
head visits (svgen: its pattern's visited tiles; dense: all of them) and the score entries
that makes relative to dense. Compile facts, not times.

--time (a CUDA GPU, e.g. one H200): per spec at full size, bf16, random q, k, v, batch 1, the
module's head assignment (HEAD_PATTERN, or head h -> pattern h % patterns), jit, warm-up,
`block_until_ready`, the median of --runs calls, side by side:

  svgen          the GPU module's `attention` at that tile (the per-head token reorder of mixed
                 specs is inside the timed call)
  dense mha      jax.experimental.pallas.ops.gpu.attention.mha (dense flash attention, Pallas
                 Triton), inputs [1, seq, heads, d] prepared outside the timed call; it needs
                 seq to be a multiple of its blocks (128), so the sequence is zero-padded to a
                 multiple of 128 (padding keys are attended: the dense kernel has no mask)
  dense cuDNN    jax.nn.dot_product_attention(implementation="cudnn"), no mask: cuDNN's fused
                 flash attention, the fastest dense kernel JAX reaches on Hopper (GPU only; a
                 call it refuses is noted, not fatal)
  masked XLA     jax.nn.dot_product_attention with the dense boolean mask [1, heads, seq, seq],
                 only where mask and f32 scores fit in device memory (else skipped, with a note)
  max abs diff   svgen's output against a float32 masked softmax on the device, on 256 evenly
                 spaced query rows of every head (every row of a smaller spec); a select
                 spec's mask is the call's own selection, made by the module on the same q, k

--interpret --tiny runs the same timing code on the CPU in Pallas interpret mode, on the specs
scaled down to 520 video tokens (+ 40 text), 2 heads: it tests this module; its times mean
nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from svgen.chip import gpu_aot
from svgen.runtime import libtpu_env

REPO = pathlib.Path(__file__).resolve().parents[2]  # the checkout: its specs/ and .gpu-aot

TINY_GEOMETRY = {"frames": 5, "height": 4, "width": 26}  # 520 video tokens
TINY_VIDEO_TOKENS = 520
MHA_BLOCK = 128  # BlockSizes.get_default() of jax's Pallas Triton mha (block_q = block_k)
DEFAULT_TILES = "64x64,128x64"
CHECKED_ROWS = 256  # query rows per head --time checks against a float32 reference
DENSE_TIMEOUT_S = 900


def import_file(path: pathlib.Path, name: str | None = None):
    spec = importlib.util.spec_from_file_location(name or f"_gpu_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shipped(names: list[str] | None) -> list[str]:
    all_names = sorted(p.stem for p in (REPO / "specs").glob("*.yaml"))
    if not names:
        return all_names
    unknown = sorted(set(names) - set(all_names))
    if unknown:
        raise SystemExit(f"unknown spec(s) {', '.join(unknown)}; shipped: {', '.join(all_names)}")
    return [n for n in all_names if n in names]


def load(name: str):
    from svgen.spec import load_spec

    return load_spec(REPO / "specs" / f"{name}.yaml")


def gpu_plan(spec, tile: tuple[int, int] | None, target: str = "h100"):
    """The GPU plan of `spec` (what `svgen compile --target` analyzes) with its `gpu` tiles
    set to `tile` (warps and stages kept); None: the spec's own `gpu` tiling."""
    from svgen.analysis import analyze

    if tile is not None:
        gpu = dataclasses.replace(spec.gpu_tiling, block_q=tile[0], block_kv=tile[1])
        spec = dataclasses.replace(spec, gpu=gpu)
    return analyze(spec, target_name=target)


def write_gpu_module(plan, name: str, out_dir: pathlib.Path) -> pathlib.Path:
    """Renders the plan's GPU module (and its tables file) into out_dir; its path."""
    from svgen import codegen

    out_dir.mkdir(parents=True, exist_ok=True)
    for filename, data in codegen.render(plan, f"specs/{name}.yaml").items():
        (out_dir / filename).write_bytes(data)
    return out_dir / codegen.module_filename(plan.spec.name, "gpu")


def classified_note(name: str, plan) -> str | None:
    grid, gpu = plan.grid, plan.kernel.tiling
    if (grid.block_q, grid.block_kv) == (gpu.block_q, gpu.block_kv):
        return None
    return (
        f"{name} at {gpu.block_q}x{gpu.block_kv}: classified at {grid.block_q}x{grid.block_kv} "
        f"(the GPU tiles' grid would exceed MAX_TILE_PAIRS); each GPU tile has its block's kind"
    )


def default_head_pattern(module) -> np.ndarray:
    hp = getattr(module, "HEAD_PATTERN", None)
    if hp is None:
        return np.arange(module.HEADS) % len(module._PATTERNS)
    return np.asarray(hp)


def tile_words(tile: tuple[int, int]) -> str:
    return f"{tile[0]}x{tile[1]}"


# -- static mode ------------------------------------------------------------------------------


def pattern_stats(tables, pattern: int, seq_len: int) -> dict:
    from svgen.core.kinds import TileKind
    from svgen.core.tables import KIND_MASK, KV_BLOCK_SHIFT

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


def static_rows(names: list[str], tiles: list[tuple[int, int]], notes: list[str]) -> list[dict]:
    rows = []
    for name in names:
        spec = load(name)
        for tile in tiles:
            plan = gpu_plan(spec, tile)
            note = classified_note(name, plan)
            if note:
                notes.append(note)
            tables = plan.tables
            for index, pattern in enumerate(plan.patterns):
                s = pattern_stats(tables, index, pattern.layout.seq_len)
                rows.append(
                    dict(
                        s,
                        spec=name,
                        pattern=pattern.name,
                        tile=tile_words(tile),
                        kept=pattern.classification.kept_pairs,
                        total_pairs=pattern.total_pairs,
                        csr_bytes=tables.nbytes,
                    )
                )
    return rows


def print_static(rows: list[dict], notes: list[str]) -> None:
    print("## svgen GPU kernel: tiles visited vs density (static: tables only, no timing)")
    print()
    print(
        "Work counts from the GPU plan's CSR tables (`svgen compile --target h100`: "
        "classified at the GPU tiles), per head using the pattern; no speed claim without "
        "a GPU (run `--time` on one)."
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
    print_notes(notes)


def print_notes(notes: list[str]) -> None:
    if notes:
        print()
        for note in notes:
            print(f"- {note}")


# -- compile mode -----------------------------------------------------------------------------


def use_repo_toolchain() -> None:
    """Where neither $SVGEN_GPU_TOOLCHAIN nor the working directory names a toolchain, the
    repository's `.gpu-aot` (so the module runs from any directory)."""

    local = pathlib.Path(gpu_aot.DEFAULT_TOOLCHAIN_DIR) / "jax_cuda12_plugin"
    repo = REPO / gpu_aot.DEFAULT_TOOLCHAIN_DIR
    if gpu_aot.TOOLCHAIN_ENV not in os.environ and not local.is_dir():
        if (repo / "jax_cuda12_plugin").is_dir():
            os.environ[gpu_aot.TOOLCHAIN_ENV] = str(repo)


def dense_child(target: str, seq: int, heads: int, head_dim: int) -> dict:
    """In a child process (toolchain on PYTHONPATH, JAX_PLATFORMS=cpu): JAX's dense Pallas
    Triton mha compiled for `target` without a GPU, as svgen.chip.gpu_aot compiles svgen's kernel
    (the same topology, target description and dump), on [1, seq, heads, head_dim] bf16."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import mha

    from svgen.analysis.targets import gpu_target

    chip = gpu_target(target)
    sharding = gpu_aot.target_sharding(chip)
    x = jax.ShapeDtypeStruct((1, seq, heads, head_dim), jnp.bfloat16, sharding=sharding)
    sm_scale = 1.0 / float(np.sqrt(head_dim))
    fn = jax.jit(lambda q, k, v: mha(q, k, v, None, sm_scale=sm_scale))
    with tempfile.TemporaryDirectory() as tmp:
        dump = pathlib.Path(tmp)
        start = time.perf_counter()
        fn.lower(x, x, x).compile(compiler_options={"xla_dump_to": str(dump)})
        seconds = time.perf_counter() - start
        launch = gpu_aot.kernel_launch(dump, "mha")
        ptx = gpu_aot.kernel_ptx(dump, launch["kernel"])
        return {
            "target": chip.name,
            **launch,
            "shared_memory_limit": chip.shared_memory_per_block,
            "wgmma": ptx.read_text().count("wgmma.mma_async"),
            **gpu_aot.kernel_registers(ptx, launch["kernel"], dump),
            "compile_s": round(seconds, 2),
        }


def compile_dense(target: str, seq: int, heads: int, head_dim: int) -> dict:
    """dense_child's facts, from this module re-run with --dense-child in a child process."""

    command = [sys.executable, "-m", "svgen.chip.gpu_bench", "--dense-child"]
    command += ["--target", target, "--seq", str(seq), "--heads", str(heads)]
    command += ["--head-dim", str(head_dim)]
    try:
        done = subprocess.run(
            command,
            env=gpu_aot.child_env(gpu_aot.toolchain_dir()),
            capture_output=True,
            text=True,
            timeout=DENSE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise gpu_aot.GpuCompileError(
            f"the dense mha compile ran past {DENSE_TIMEOUT_S} s"
        ) from None
    try:
        facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise gpu_aot.GpuCompileError(
            f"the dense mha compile ended with status {done.returncode} and no result:\n{tail}"
        ) from None
    if "error" in facts:
        raise gpu_aot.GpuCompileError(f"the dense mha compile failed: {facts['message']}")
    return facts


def compile_rows(names, tiles, target: str, notes: list[str]) -> tuple[list[dict], int]:
    """Per spec: svgen's rows (one per tile) and one dense mha row; and the failures."""

    rows, failures, dense = [], 0, {}
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        for name in names:
            spec = load(name)
            seq = spec.geometry.seq_len
            padded = -(-seq // MHA_BLOCK) * MHA_BLOCK
            for tile in tiles or [None]:
                plan = gpu_plan(spec, tile, target)
                gpu, tables = plan.kernel.tiling, plan.tables
                words = tile_words((gpu.block_q, gpu.block_kv))
                note = classified_note(name, plan)
                if note:
                    notes.append(note)
                path = write_gpu_module(plan, name, pathlib.Path(tmp) / f"{name}_{words}")
                try:
                    facts = gpu_aot.compile_module(path, target)
                except gpu_aot.GpuCompileError as err:
                    notes.append(f"{name} at {words}: svgen's compile failed: {err}")
                    failures += 1
                    continue
                all_tiles = tables.num_q_tiles * tables.num_kv_tiles
                visited = {p.name: tables.visited(i) for i, p in enumerate(plan.patterns)}
                rows.append(
                    dict(
                        facts,
                        spec=name,
                        kernel="svgen",
                        tile=f"{words}, {gpu.num_warps} warps, {gpu.num_stages} stages",
                        visited=visited,
                        all_tiles=all_tiles,
                        vs_dense={
                            p: n * gpu.block_q * gpu.block_kv / padded**2
                            for p, n in visited.items()
                        },
                    )
                )
            key = (padded, spec.attention.heads, spec.attention.head_dim)
            if key not in dense:
                try:
                    dense[key] = compile_dense(target, *key)
                except gpu_aot.GpuCompileError as err:
                    dense[key] = None
                    notes.append(f"{name}: {err}")
                    failures += 1
            if dense[key] is not None:
                all_tiles = (padded // MHA_BLOCK) ** 2
                rows.append(
                    dict(
                        dense[key],
                        spec=name,
                        kernel="dense mha",
                        tile=f"{MHA_BLOCK}x{MHA_BLOCK}",
                        visited={"": all_tiles},
                        all_tiles=all_tiles,
                        vs_dense={"": 1.0},
                    )
                )
                if padded != seq:
                    notes.append(f"{name}: dense mha on seq {seq:,} zero-padded to {padded:,}")
    return rows, failures


def per_pattern(values: dict, fmt) -> str:
    """One value, or `pattern value` per pattern of a mixed spec."""
    if len(values) == 1:
        return fmt(next(iter(values.values())))
    return "; ".join(f"{p} {fmt(v)}" for p, v in values.items())


def print_compile(rows: list[dict], notes: list[str], target: str) -> None:
    from svgen.analysis.targets import gpu_target

    chip = gpu_target(target)
    print(
        f"## svgen GPU kernel vs JAX's dense Pallas flash attention: compile facts for "
        f"{chip.description} (deviceless, no timing)"
    )
    print()
    print(
        "These are compile facts, not times: what XLA, Triton and ptxas produce for the chip "
        "on this host without a GPU (svgen.chip.gpu_aot); shared memory of the "
        f"{chip.shared_memory_per_block:,} bytes a block may use. Tiles per head: svgen's "
        "visited tiles (of all its tiles), dense mha's all; vs dense: the score entries a "
        "head computes, over dense mha's. No speed claim without a GPU (run `--time` on one)."
    )
    print()
    print(
        "| spec | kernel | tile | grid | threads | shared memory | registers "
        "| spills (store / load bytes) | wgmma | tiles per head (of all) | vs dense |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        registers = f"{r['registers']}" if "registers" in r else "?"
        spills = (
            f"{r['spill_store_bytes']:,} / {r['spill_load_bytes']:,}"
            if "spill_store_bytes" in r
            else "?"
        )
        tiles = per_pattern(r["visited"], lambda n: f"{n:,} ({n / r['all_tiles']:.4f})")
        print(
            f"| {r['spec']} | {r['kernel']} | {r['tile']} | {r['grid']} | {r['threads']} "
            f"| {r['shared_memory']:,} | {registers} | {spills} | {r['wgmma']} "
            f"| {tiles} | {per_pattern(r['vs_dense'], lambda x: f'{x:.4f}')} |"
        )
    print_notes(notes)


def compile_mode(names, tiles, target: str) -> int:

    use_repo_toolchain()
    try:
        gpu_aot.toolchain_dir()
    except gpu_aot.GpuCompileError as err:
        print(f"gpu_bench --compile: {err}", file=sys.stderr)
        return 2
    notes: list[str] = []
    start = time.perf_counter()
    rows, failures = compile_rows(names, tiles, target, notes)
    notes.append(f"compiled in {time.perf_counter() - start:.1f} s on this host")
    print_compile(rows, notes, target)
    return 1 if failures else 0


# -- timing mode ------------------------------------------------------------------------------


def scale_mask_terms(spec: dict, small_video: int, full_video: int) -> None:
    """Scale, in place, the terms of a spec's masks and patterns that count video tokens (a
    prefix's tokens, a band's width) from a video of `full_video` tokens to one of
    `small_video`: the same pattern at a smaller size (a spec read as YAML data)."""

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


def tiny_spec_text(path: pathlib.Path) -> str:
    """The spec at TINY_GEOMETRY (+ 40 text tokens if it has text), 2 heads, bf16; prefixes
    and band widths scaled with the video (scale_mask_terms, as tests/helpers.py's
    scaled_spec_text does)."""
    import yaml

    spec = yaml.safe_load(path.read_text())
    full = spec["geometry"]
    full_video = full["frames"] * full["height"] * full["width"]
    if "kv_cache" in (spec.get("runtime") or {}):
        # A KV-cache spec's frame counts (chunk, sink, window, the mask's frames) must still
        # divide and fit: keep its frames and shrink each frame to as many tokens instead.
        per_frame = TINY_VIDEO_TOKENS // full["frames"]
        small = dict(full, height=2, width=max(1, per_frame // 2))
    else:
        small = dict(full, **TINY_GEOMETRY)
    small_video = small["frames"] * small["height"] * small["width"]
    if full.get("text_tokens"):
        small["text_tokens"] = 40
    spec["geometry"] = small
    spec["attention"] = dict(spec["attention"], heads=2, dtype="bfloat16")
    spec["tiling"] = {"block_q": 128, "block_kv": 128}
    scale_mask_terms(spec, small_video, full_video)
    return yaml.safe_dump(spec, sort_keys=False)


def tiny_spec(name: str):
    from svgen.spec import parse_spec

    return parse_spec(tiny_spec_text(REPO / "specs" / f"{name}.yaml"), source=f"{name}.yaml")


def gpu_modules(name: str, spec, tiles, out_dir: pathlib.Path) -> list[tuple]:
    """(tile, plan, module) per tile: the GPU module `svgen compile --target h100
    --no-gpu-check` writes for the spec at that GPU tile, imported."""
    kernels = []
    for tile in tiles:
        plan = gpu_plan(spec, tile)
        words = tile_words(tile)
        path = write_gpu_module(plan, name, out_dir / f"{name}_{words}")
        kernels.append((tile, plan, import_file(path, f"_gpu_bench_{name}_{words}")))
    return kernels


def reference_keeps(plan, module, q, k, head_pattern, sm_scale, rows=None) -> np.ndarray:
    """bool [heads, len(rows), seq] in user order: each head's mask on the query rows `rows`
    (user indices; all rows when None). A select spec's (one pattern, one layout) is the
    always-kept mask plus the compute blocks this call selects, chosen by the module's own
    selection on these q and k (the kernel's tests check the selection itself against a
    float64 reference)."""
    seq = plan.patterns[0].layout.seq_len
    rows = np.arange(seq) if rows is None else np.asarray(rows)

    def keep_rows(pattern) -> np.ndarray:  # [len(rows), seq], user order both ways
        lay = pattern.layout
        at = lay.kernel_position.astype(np.int64)
        cq, ck = lay.coordinates(at[rows]), lay.coordinates(at)
        return pattern.mask.evaluate(cq.reshape(-1, 1), ck.reshape(1, -1))

    select = getattr(module.attention, "select", None)
    if select is None:
        keeps = {p: keep_rows(plan.patterns[p]) for p in sorted(set(head_pattern.tolist()))}
        return np.stack([keeps[p] for p in head_pattern.tolist()])
    pattern = plan.patterns[0]
    qk, kk = (module.attention.to_kernel_order(x) for x in (q, k))
    amount = select.amount(None, None)  # the spec's default, as the timed call uses
    chosen = np.asarray(select.select(qk, kk, sm_scale, amount).blocks)
    at, shape = pattern.layout.kernel_position.astype(np.int64), module.SHAPE
    row_block, col_block = at[rows] // shape.cq, at // shape.ckv
    always = keep_rows(pattern)
    return np.stack([always | c[row_block][:, col_block] for c in chosen])


def sampled_rows_error(out, q, k, v, keeps, rows, sm_scale) -> float:
    """max |out - reference| over the query rows `rows` of every head: float32 masked
    softmax attention on the device, q, k, v [heads, seq, d] in user order, keeps bool
    [heads, len(rows), seq] (reference_keeps); a row with no key is 0, as the kernel's."""
    import jax.numpy as jnp

    rows = jnp.asarray(rows)
    qs = q[:, rows].astype(jnp.float32)
    s = jnp.einsum("hqd,hkd->hqk", qs, k.astype(jnp.float32)) * sm_scale
    keep = jnp.asarray(keeps)
    s = jnp.where(keep, s, -jnp.inf)
    top = jnp.max(s, axis=-1, keepdims=True)
    e = jnp.where(keep, jnp.exp(s - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    ref = jnp.einsum("hqk,hkd->hqd", e / jnp.where(total > 0, total, 1.0), v.astype(jnp.float32))
    return float(jnp.max(jnp.abs(out[:, rows].astype(jnp.float32) - ref)))


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


def time_spec(name, kernels, args, notes) -> list[dict]:
    """kernels: (tile, plan, module) per GPU tile (gpu_modules)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import mha

    _, plan, module = kernels[0]
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
    tq, tk, tv = (jnp.transpose(x, (1, 0, 2))[None] for x in (q, k, v))  # [1, seq, h, d]
    cudnn_ms = None
    if not args.interpret:
        run_cudnn = jax.jit(
            lambda q, k, v: jax.nn.dot_product_attention(
                q, k, v, scale=sm_scale, implementation="cudnn"
            )
        )
        try:
            cudnn_ms, _ = median_ms(run_cudnn, (tq, tk, tv), args.runs, args.warmup)
        except Exception as err:  # noqa: BLE001 - a baseline that does not run is reported
            notes.append(f"{name}: dense cuDNN failed: {type(err).__name__}: {str(err)[:200]}")

    need = heads * seq * seq * (4 * 3 + 1)  # f32 scores, exp, probs + the bool mask
    limit = device_memory_bytes()
    xla_ms = None
    if limit is not None and need > 0.8 * limit:
        notes.append(
            f"{name}: masked XLA skipped (needs ~{need / 2**30:,.0f} GiB, device has "
            f"{limit / 2**30:,.0f} GiB)"
        )
    else:
        mask = jnp.asarray(reference_keeps(plan, module, q, k, head_pattern, sm_scale)[None])
        run_xla = jax.jit(
            lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m, scale=sm_scale)
        )
        xla_ms, _ = median_ms(run_xla, (tq, tk, tv, mask), args.runs, args.warmup)
        del mask
    # the check: CHECKED_ROWS query rows (all of a small spec's) of every head
    checked = np.unique(np.linspace(0, seq - 1, min(seq, CHECKED_ROWS)).astype(np.int64))

    for tile, _, module in kernels:
        run = jax.jit(
            lambda q, k, v, hp, attention=module.attention: attention(
                q, k, v, head_pattern=hp, interpret=args.interpret
            )
        )
        ms, out = median_ms(run, (q, k, v, hp), args.runs, args.warmup)
        # a select module's mask is its own call's choice, at its own tile's grain
        keeps = reference_keeps(plan, module, q, k, head_pattern, sm_scale, checked)
        err = sampled_rows_error(out, q, k, v, keeps, checked, sm_scale)
        rows.append(
            dict(
                spec=name,
                tile=tile_words(tile),
                seq=seq,
                heads=heads,
                svgen=ms,
                mha=mha_ms,
                cudnn=cudnn_ms,
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
        "| dense cuDNN ms | speedup vs cuDNN "
        "| masked XLA ms | speedup vs XLA | max abs diff vs f32 |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        xla = "skipped" if r["xla"] is None else f"{r['xla']:.3f}"
        vs_xla = "-" if r["xla"] is None else f"{r['xla'] / r['svgen']:.2f}x"
        err = "-" if r["err"] is None else f"{r['err']:.1e}"
        cudnn = "-" if r["cudnn"] is None else f"{r['cudnn']:.3f}"
        vs_cudnn = "-" if r["cudnn"] is None else f"{r['cudnn'] / r['svgen']:.2f}x"
        print(
            f"| {r['spec']} | {r['seq']:,} | {r['heads']} | {r['tile']} | {r['svgen']:.3f} "
            f"| {r['mha']:.3f} | {r['mha'] / r['svgen']:.2f}x | {cudnn} | {vs_cudnn} "
            f"| {xla} | {vs_xla} | {err} |"
        )
    print_notes(notes)


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
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        for name in names:
            spec = tiny_spec(name) if args.tiny else load(name)
            kernels = gpu_modules(name, spec, tiles, pathlib.Path(tmp))
            rows += time_spec(name, kernels, args, notes)
    print_timing(rows, notes, meaningless=args.interpret)
    return 0


def parse_tiles(text: str) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in t.split("x")) for t in text.split(",") if t]


def main(argv=None) -> int:
    libtpu_env.prepare()  # before JAX starts its backends (see svgen/runtime/libtpu_env.py)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default="", help="comma-separated spec names (default: all)")
    parser.add_argument(
        "--tiles",
        default=None,
        help=f"GPU tiles, e.g. {DEFAULT_TILES} (the default; with --compile: each spec's own "
        "`gpu` tiling)",
    )
    parser.add_argument(
        "--compile", action="store_true", help="deviceless compile facts, svgen vs dense mha"
    )
    parser.add_argument("--target", default="h100", choices=("h100", "h200"), help="--compile's")
    parser.add_argument("--time", action="store_true", help="time on a CUDA GPU")
    parser.add_argument("--runs", type=int, default=20, help="timed calls (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--interpret", action="store_true", help="Pallas interpret mode (CPU)")
    parser.add_argument("--tiny", action="store_true", help="scaled-down specs (with --interpret)")
    # the dense mha compile, in the child process that --compile starts
    parser.add_argument("--dense-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--heads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--head-dim", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dense_child:
        try:
            facts = dense_child(args.target, args.seq, args.heads, args.head_dim)
        except Exception as err:  # XLA raises its own error types; the text says what failed
            lines = [line for line in str(err).strip().splitlines() if line.strip()]
            facts = {"error": "compile", "message": " | ".join(lines[-6:])}
        print(json.dumps(facts, sort_keys=True))
        return 0 if "error" not in facts else 1
    names = shipped([n for n in args.specs.split(",") if n])
    if args.compile:
        if args.time or args.interpret or args.tiny:
            parser.error("--compile goes without --time, --interpret and --tiny")
        return compile_mode(names, parse_tiles(args.tiles or ""), args.target)
    tiles = parse_tiles(args.tiles or DEFAULT_TILES)
    if args.time:
        if args.interpret:
            args.runs, args.warmup = min(args.runs, 2), min(args.warmup, 1)
        return timing(names, tiles, args)
    if args.interpret or args.tiny:
        parser.error("--interpret and --tiny go with --time")
    notes: list[str] = []
    print_static(static_rows(names, tiles, notes), notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
