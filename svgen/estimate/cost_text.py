"""`svgen cost`'s text: a `CostReport` (svgen.estimate.cost) as the lines the command prints.

Apart from the model because it is presentation only: it computes nothing the JSON report
does not hold, and no other module reads it.
"""

from __future__ import annotations

import dataclasses

from svgen.estimate.cost import (
    MODEL_CAVEAT,
    CostReport,
    TrainingReport,
    key_bytes,
    program_caveat,
)
from svgen.estimate.paths import PathCosts, mean_rounded
from svgen.core.kinds import TileKind
from svgen.core.straight import word_glyphs


def format_report(report: CostReport, plan) -> list[str]:
    p, t = report.paths, plan.spec.tiling
    per_tile = t.block_q * t.block_kv / (512 * 512)
    per_block = t.cq * t.ckv / (512 * 512)
    lines = [
        f"{plan.spec.name}: static cost model on {report.target} (libtpu's schedule; no DMA "
        f"stalls; clock {report.clock_ghz} GHz assumed)",
        f"  every figure below is {MODEL_CAVEAT}",
        f"  tiles {t.block_q} x {t.block_kv}, compute blocks {t.cq} x {t.ckv}; "
        f"VMEM {report.vmem_bytes / 2**20:.1f} MiB, SMEM tables {report.smem_bytes:,} B",
        "  bundles per grid step (per 512x512-equivalent in brackets):",
        *_path_lines(p, plan, per_tile, per_block),
    ]
    steps = report.steps
    lines.append(
        f"  steps over {report.heads} heads: {steps['full']:,} FULL, "
        f"{steps['mixed']:,} BOUNDARY, {steps['empty']:,} zero-fill, "
        f"{steps['skipped']:,} skipped"
    )
    share = {k: v / report.cycles for k, v in report.cycles_by_path.items() if v}
    lines.append("  time by path: " + ", ".join(f"{k} {v:.1%}" for k, v in share.items()))
    if plan.assign is None:
        lines.append("  heads: assigned at run time; modelled with the candidates in turn")
    lines.append(f"  modelled: {report.cycles:,} cycles = {report.ms:.2f} ms per call")
    if report.dense_cycles:
        lines.append(
            f"  the same kernel on a dense mask: {report.dense_cycles:,} cycles = "
            f"{report.dense_cycles / (report.clock_ghz * 1e6):.2f} ms "
            f"({report.dense_cycles / report.cycles:.2f}x this kernel's time; at this spec's "
            f"tiling, {t.block_q} x {t.block_kv})"
        )
    if report.dense_best is not None:
        (bq, bkv, cq, ckv), cycles, modelled = report.dense_best
        lines.append(
            f"  the dense kernel at its best of {modelled} tiling(s) for this "
            f"geometry ({bq} x {bkv} / {cq} x {ckv}): {cycles:,} cycles = "
            f"{cycles / (report.clock_ghz * 1e6):.2f} ms ({cycles / report.cycles:.2f}x this "
            "kernel's time)"
        )
    if report.fallback is not None:
        lines += _fallback_lines(report, plan, per_tile, per_block)
    if report.utilisation is not None:
        lines.append(_utilisation_line(report))
    if report.training is not None:
        lines += _training_lines(report.training, plan, report.clock_ghz, per_tile, per_block)
    if report.chunks is not None:
        lines += _chunk_lines(report, plan, per_tile, per_block)
    if report.select is not None:
        lines += _select_lines(report, plan)
    return lines


def _fallback_lines(report: CostReport, plan, per_tile: float, per_block: float) -> list[str]:
    """attention.softmax: bounded: the figures above are q tiles within the bound; these
    are the online twins, what a q tile past it runs."""
    f = report.paths.fallback
    cycles, dense = report.fallback
    ms = cycles / (report.clock_ghz * 1e6)
    boundary = mean_rounded([b[1] for p in f.block for b in p])
    return [
        "  softmax: bounded (the figures above: every q tile within the bound); each q tile "
        "past it runs online:",
        f"    online FULL tile {f.full} ({(f.full - f.bookkeeping) / per_tile:.0f} body), "
        f"BOUNDARY block {boundary} ({boundary / per_block:.0f}); init {f.init[0]}",
        f"    every q tile online: {cycles:,} cycles = {ms:.2f} ms per call "
        f"({cycles / report.cycles:.3f}x); dense {dense:,} cycles "
        f"({dense / report.dense_cycles:.3f}x the bounded dense kernel)",
        f"  the pass over k the bound needs (XLA, before the kernel: reads k's "
        f"{key_bytes(plan) / 1e6:.1f} MB once at {plan.target.hbm_bytes_per_s / 1e12:.2f} "
        f"TB/s): {report.key_pass:,} cycles = {report.key_pass / (report.clock_ghz * 1e3):.0f} "
        f"us; the call with it: {report.call_cycles:,} cycles = "
        f"{report.call_cycles / (report.clock_ghz * 1e6):.2f} ms",
    ]


def _utilisation_line(report: CostReport) -> str:
    u = report.utilisation.to_json(report)
    at_least = "" if report.utilisation.exact else "at least "
    line = (
        f"  useful work (4 x head_dim per kept pair): {at_least}{u['useful_flops'] / 1e12:.2f} "
        f"TFLOP at {at_least}{u['useful_flops_per_s'] / 1e12:.1f} TFLOP/s = "
        f"{u['of_peak']:.1%} of {report.target}'s published bf16 peak "
        f"({u['peak_flops_per_s'] / 1e12:.1f} TFLOP/s per TensorCore)"
    )
    if "dense_of_peak" in u:
        line += f"; the dense kernel {u['dense_of_peak']:.1%}"
    return line


def _select_lines(report: CostReport, plan) -> list[str]:
    """A select spec's bounds: the call between nothing and everything selected."""
    ms = lambda cycles: cycles / (report.clock_ghz * 1e6)  # noqa: E731
    (none, none_steps), (every, all_steps) = report.select["none"], report.select["all"]
    lines = [
        f"  select ({plan.spec.select.rule}): the modelled call above is the mask alone's "
        "(static tables); a call walks its own selection's tables, between",
        f"    nothing selected: {none:,} cycles = {ms(none):.2f} ms "
        f"({none_steps['full'] + none_steps['mixed']:,} steps with work over all heads)",
        f"    every candidate block selected: {every:,} cycles = {ms(every):.2f} ms "
        f"({all_steps['full'] + all_steps['mixed']:,} steps with work)",
    ]
    if "sampled" in report.select:
        cycles, steps = report.select["sampled"]
        select = plan.spec.select
        lines.append(
            f"    at the spec's own {select.rule} = {select.default:g}, on the blocks it selects "
            f"from normal random q and k (seed 0; real activations select differently): "
            f"{cycles:,} cycles = {ms(cycles):.2f} ms "
            f"({steps['full'] + steps['mixed']:,} steps with work)"
        )
    if report.dense_cycles:
        lines.append(
            f"    dense / every-selected: {report.dense_cycles / every:.2f}x; dense / "
            f"nothing-selected: {report.dense_cycles / none:.2f}x"
        )
    if report.policy is not None:
        counts, floor = report.policy
        c = report.policy_cycles
        lines += [
            f"    selection per call (pooling, block scores, {plan.spec.select.rule}, tables; XLA "
            f"programs before the kernel): {c:,} cycles = {ms(c) * 1e3:.1f} us, "
            f"{c / every:.2%} .. {c / none:.2%} of the kernel (every .. nothing selected)",
            f"      {counts.programs} programs, {counts.bundles:,} bundles counted (pooling "
            f"{counts.pooling:,}; reading q and k once at HBM bandwidth: {floor:,} cycles)"
            + (f"; {counts.uncounted} uncounted" if counts.uncounted else "")
            + (f"; {counts.floors} with a run-time trip count (a floor)" if counts.floors else ""),
        ]
    p = report.paths
    if p.padded_block and any(any(b) for b in p.padded_block):
        plain = mean_rounded([b[0] for b in p.padded_block if any(b)])
        lines.append(
            f"    PADDED block (a selected block holding the end of the keys): {plain:,} bundles"
        )
    return lines


def _chunk_lines(report: CostReport, plan, per_tile: float, per_block: float) -> list[str]:
    """The chunked calls: their kernel's paths, then one line per chunk position."""
    chunks = report.chunks
    ms = lambda cycles: cycles / (report.clock_ghz * 1e6)  # noqa: E731
    cf = chunks.chunk_frames
    lines = [
        f"  KV-cache chunks of {cf} frame(s) against {plan.cache_words()} (attention(..., "
        "q_frame_offset=f)): the chunked call's bundles per grid step:",
        *("  " + line for line in _path_lines(chunks.paths, plan, per_tile, per_block)),
    ]
    for i, (steps, cycles) in enumerate(zip(chunks.steps, chunks.cycles)):
        lines.append(
            f"    frames {i * cf}-{i * cf + cf - 1}: {steps['full']:,} FULL, {steps['mixed']:,} "
            f"BOUNDARY, {steps['empty']:,} zero-fill, {steps['skipped']:,} skipped steps; "
            f"{cycles:,} cycles = {ms(cycles):.3f} ms"
        )
    lines.append(
        f"    all {len(chunks.cycles)} chunks: {ms(chunks.total):.2f} ms "
        f"({chunks.total / report.cycles:.2f}x one full-sequence call, {report.ms:.2f} ms)"
    )
    return lines


_KERNEL_LABELS = {
    "forward": "forward with lse",
    "dq": "dq",
    "dkv": "dk/dv",
    "dq_hbm": "dq read-modify-write in HBM",
}


def _training_lines(training: TrainingReport, plan, clock_ghz: float, per_tile, per_block):
    ms = lambda cycles: cycles / (clock_ghz * 1e6)  # noqa: E731
    c, dense = training.cycles, training.dense_cycles
    fused = training.paths.fused
    lines = [
        "  training (jax.grad: the forward saving lse, then "
        + ("dk, dv and dq in one walk of the transposed tables):" if fused else "dq and dk/dv):")
    ]
    kernels = [("dkv", "dk/dv" + (" + dq" if fused else "") + " kernel (transposed tables)")]
    if not fused:
        kernels.insert(0, ("dq", "dq kernel"))
    for name, label in kernels:
        lines.append(f"   {label}, bundles per grid step:")
        kernel_paths = getattr(training.paths, name)
        lines += ["  " + line for line in _path_lines(kernel_paths, plan, per_tile, per_block)]
    lines += [
        "    "
        + ", ".join(f"{_KERNEL_LABELS[k]} {v:,} cycles ({ms(v):.2f} ms)" for k, v in c.items()),
        f"    backward / forward {training.backward / c['forward']:.2f}; forward + backward "
        f"{training.total:,} cycles = {ms(training.total):.2f} ms per call",
        f"    the same kernels on a dense mask: {sum(dense.values()):,} cycles = "
        f"{ms(sum(dense.values())):.2f} ms ({sum(dense.values()) / training.total:.2f}x)",
    ]
    return lines


def _path_lines(p: PathCosts, plan, per_tile: float, per_block: float) -> list[str]:
    """One kernel's per-path bundles (see svgen.estimate.paths)."""
    lines = [f"    program: {p.program:,} bundles"] if p.program else []
    caveat = program_caveat(p.program, bool(p.residual_block), bool(p.straight))
    if caveat:
        lines.append(f"    warning: {caveat}")
    lines += [
        f"    bookkeeping (skipped step) {p.bookkeeping}",
        f"    FULL tile                  {p.full} ({(p.full - p.bookkeeping) / per_tile:.0f} "
        f"body + {p.bookkeeping / per_tile:.0f} bookkeeping)",
    ]
    for index, pattern in enumerate(plan.patterns):
        blocks = p.block[index]
        full_blocks = [f for f, _, _ in blocks if f]
        boundary_blocks = [b for _, b, _ in blocks]
        padded = max(padding for _, _, padding in blocks)
        label = "" if len(plan.patterns) == 1 else f" [{pattern.name}]"
        full, boundary = mean_rounded(full_blocks), mean_rounded(boundary_blocks)
        ratio = f", {boundary / full:.2f}x FULL" if full else ""
        lines.append(
            f"    BOUNDARY tile{label}: {p.mixed[index] - p.bookkeeping} branch overhead; per "
            f"compute block FULL {full} ({full / per_block:.0f}), "
            f"BOUNDARY {boundary} ({boundary / per_block:.0f}{ratio})"
            + (
                f"; {padded} with the padding test (one kv tile)"
                if padded > max(boundary_blocks)
                else ""
            )
        )
    for index, pattern in enumerate(plan.patterns[: len(p.residual_block)]):
        per_variant = list(zip(*p.residual_block[index]))  # [variant][block] (plain, padded)
        if not per_variant:
            continue
        label = "" if len(plan.patterns) == 1 else f" [{pattern.name}]"
        found = pattern.residuals
        cells = []
        for j, costs in enumerate(per_variant, 1):
            plain = mean_rounded([c for c, _ in costs])
            blocks = "" if found is None else f", {found.variants[j - 1].blocks:,} blocks"
            cells.append(f"{j}: {plain} ({plain / per_block:.0f}{blocks})")
        lines.append(f"    BOUNDARY block{label}, residual masks: " + "; ".join(cells))
    lines += _straight_lines(p, plan)
    for index, pattern in enumerate(plan.patterns[: len(p.segment_block)]):
        plain = mean_rounded([b for b, _ in p.segment_block[index]])
        padded = max(padding for _, padding in p.segment_block[index])
        label = "" if len(plan.patterns) == 1 else f" [{pattern.name}]"
        lines.append(
            f"    SEGMENT_BOUNDARY block{label} (across run-time segments): {plain} "
            f"({plain / per_block:.0f}); {padded} with the padding test"
        )
    init = ", ".join(str(i) for i in p.init) if len(set(p.init)) > 1 else str(p.init[0])
    lines.append(f"    init {init}, finalize {p.finalize} (per row tile)")
    return lines


def _straight_lines(p: PathCosts, plan) -> list[str]:
    """Per pattern with straight-line BOUNDARY tiles (svgen.core.straight): each word's
    step, against the same word through the per-block branches."""
    t = plan.spec.tiling
    branches = dataclasses.replace(p, straight=())
    lines = []
    for index, pattern in enumerate(plan.patterns[: len(p.straight)]):
        if not p.straight[index]:
            continue
        label = "" if len(plan.patterns) == 1 else f" [{pattern.name}]"
        cells = [
            f"{word_glyphs(word, t.q_blocks_per_tile, t.kv_blocks_per_tile)} {step} "
            f"(branches {branches.tile_cost(index, TileKind.BOUNDARY, word)})"
            for word, _, step in p.straight[index]
        ]
        lines.append(f"    BOUNDARY tile{label}, straight-line words: " + "; ".join(cells))
    return lines
