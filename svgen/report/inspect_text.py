"""`svgen inspect` as text for people: the same facts as `--json`, in words and rounded numbers.

Lines are built from the JSON summaries (`Plan.summary`, `PatternPlan.summary`), each known key
consumed by the line that words it; a key added later still prints, generically, so text and
JSON never disagree about what is reported.

A density the analysis only bounded (a user predicate past its evaluation budget,
`density_is_exact` false) is never reported as the density: `density` is then null and the
bounds are `density_lower` and `density_upper`.
"""

from __future__ import annotations

from svgen.analysis import Plan
from svgen.codegen.tilemap import render_tile_map

KIND_ORDER = ("full", "boundary", "empty")


def inspect_lines(plan: Plan, spec_file: str) -> list[str]:
    """The whole text report: the kernel, then per pattern its statistics and tile map."""
    patterns = [p.summary() for p in plan.patterns]
    pattern_keys = set(patterns[0]) if len(plan.patterns) == 1 else set()
    summary = {k: v for k, v in plan.summary().items() if k not in pattern_keys}
    lines = [f"{plan.spec.name} ({spec_file})"]
    lines += [f"  {line}" for line in _kernel_lines(summary)]
    for pattern, s in zip(plan.patterns, patterns):
        lines += ["", f"  pattern {pattern.name}: {pattern.mask.describe()}"]
        lines += [f"    {line}" for line in _pattern_lines(s)]
        lines += [f"    {line}" for line in render_tile_map(pattern.kinds)]
    return lines


def _kernel_lines(s: dict) -> list[str]:
    s = dict(s)
    for key in ("name", "patterns"):
        s.pop(key, None)
    if "gpu" in s:
        return _gpu_kernel_lines(s)
    lines = [
        f"tokens: {_count(s.pop('seq_len'))} (padded to {_count(s.pop('padded_seq_len'))})",
        f"tiles: {s.pop('block_q')} x {s.pop('block_kv')}, a {s.pop('num_q_blocks')} x "
        f"{s.pop('num_kv_blocks')} grid; compute blocks {s.pop('compute_q')} x "
        f"{s.pop('compute_kv')}{_align(s.pop('align'))}",
        f"target: {s.pop('target')}; VMEM {_bytes(s.pop('vmem_bytes'))} "
        f"(limit {_bytes(s.pop('vmem_limit_bytes'))})",
        f"SMEM tables: {_bytes(s.pop('table_bytes'))}; {_count(s.pop('grid_steps'))} grid "
        f"steps per head; {_plural(s.pop('slots_per_piece'), 'tile slot')} per piece",
    ]
    if "assign" in s:
        lines.append(f"heads: {_assignment(s.pop('assign'))}")
    if "kv_cache" in s:
        chunks = s.pop("kv_cache")
        steps = ", ".join(_count(n) for n in chunks["chunk_steps"])
        lines.append(
            f"KV-cache chunks of {_plural(chunks['chunk_frames'], 'frame')}: grid steps per head "
            f"of each chunk position's call: {steps}"
        )
        if "window_frames" in chunks:
            lines.append(
                f"  rolling cache: {_plural(chunks['sink_frames'], 'sink frame')} and a ring "
                f"of {_plural(chunks['window_frames'], 'frame')}"
            )
    return lines + _generic_lines(s)


def _gpu_kernel_lines(s: dict) -> list[str]:
    gpu = dict(s.pop("gpu"))
    s.pop("table_bytes")
    for key in ("compute_q", "compute_kv"):  # the classification tiles: no compute blocks
        s.pop(key)
    lines = [
        f"tokens: {_count(s.pop('seq_len'))} (padded to {_count(s.pop('padded_seq_len'))})",
        f"classified at {s.pop('block_q')} x {s.pop('block_kv')} tiles, a "
        f"{s.pop('num_q_blocks')} x {s.pop('num_kv_blocks')} grid{_align(s.pop('align'))}",
        f"target: {s.pop('target')} (GPU, Pallas Triton): tiles {gpu.pop('block_q')} x "
        f"{gpu.pop('block_kv')}, a {_count(gpu.pop('num_q_tiles'))} x "
        f"{_count(gpu.pop('num_kv_tiles'))} grid; {gpu.pop('num_warps')} warps, "
        f"{gpu.pop('num_stages')} stages; CSR tables {_bytes(gpu.pop('table_bytes'))}",
    ]
    if "assign" in s:
        lines.append(f"heads: {_assignment(s.pop('assign'))}")
    return lines + _generic_lines(dict(s, **{f"gpu {k}": v for k, v in gpu.items()}))


def _pattern_lines(s: dict) -> list[str]:
    s = dict(s)
    layout = s.pop("layout")
    if "anchor_frames" in s:
        layout += f", {_plural(s.pop('anchor_frames'), 'anchor frame')}"
    if "cube" in s:
        layout += ", cubes of {} x {} x {} (frames x rows x cols)".format(*s.pop("cube"))
    lines = [
        f"layout: {layout}",
        f"tiles: {_kinds(s.pop('tiles'))}; visited fraction "
        f"{_fraction(s.pop('visited_fraction'))} ({_count(s.pop('visited_steps'))} grid steps)",
        f"compute blocks: {_kinds(s.pop('compute_blocks'))}",
        _density(s),
    ]
    if "exact_density" in s:
        lines[-1] = lines[-1].replace("(exact)", "(exact count, aligned mask)")
        lines.append(_budget(s))
    for variant in s.pop("residual_masks", ()):
        lines.append(
            f"residual mask {variant['variant']}: {_count(variant['blocks'])} BOUNDARY "
            f"compute blocks, ~{variant['ops']} full-block operations: {variant['mask']}"
        )
    unproven = s.pop("unproven_boundary_tiles")
    if unproven:
        lines.append(
            f"unproven boundary tiles: {_count(unproven)} (left BOUNDARY: interval "
            f"arithmetic could not decide them)"
        )
    return lines + _generic_lines(s)


def _density(s: dict) -> str:
    """The density line (consumes the density keys of `s`)."""
    density = s.pop("density")
    if s.pop("density_is_exact"):
        return f"density: {_fraction(density)} of token pairs kept (exact)"
    return f"density: {density_bounds_words(s.pop('density_lower'), s.pop('density_upper'))}"


def density_bounds_words(low: float, high: float) -> str:
    """A bounded density in words (`svgen inspect` and the compile summary)."""
    return (
        f"between {_fraction(low)} and {_fraction(high)} of token pairs kept (bounds, not "
        f"the density: a user predicate was not evaluated everywhere)"
    )


def _align(mode: str) -> str:
    return "" if mode == "exact" else f"; aligned ({mode}: BOUNDARY blocks made FULL or EMPTY)"


def _budget(s: dict) -> str:
    """What aligning changed (consumes the pair-budget keys of `s`)."""
    return (
        f"aligned mask: exact density {_fraction(s.pop('exact_density'))}; "
        f"{_count(s.pop('pairs_added'))} pairs added, {_count(s.pop('pairs_dropped'))} "
        f"dropped; recall {_fraction(s.pop('recall'))}, precision "
        f"{_fraction(s.pop('precision'))}; {_plural(s.pop('rows_emptied'), 'row')} emptied"
    )


def _assignment(assign) -> str:
    """'runtime', or per-head names grouped into ranges: 'heads 0-3 spatial, 4 temporal'."""
    if assign == "runtime":
        return "each head's pattern is chosen at run time (profile())"
    groups: list[list] = []
    for head, name in enumerate(assign):
        if groups and groups[-1][2] == name:
            groups[-1][1] = head
        else:
            groups.append([head, head, name])
    return ", ".join(f"{a} {name}" if a == b else f"{a}-{b} {name}" for a, b, name in groups)


def _generic_lines(s: dict) -> list[str]:
    return [f"{key.replace('_', ' ')}: {_value(value)}" for key, value in s.items()]


def _kinds(counts: dict) -> str:
    order = [k for k in KIND_ORDER if k in counts] + [k for k in counts if k not in KIND_ORDER]
    return ", ".join(f"{_count(counts[k])} {k}" for k in order)


def _value(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return _count(value)
    if isinstance(value, float):
        return _fraction(value)
    if isinstance(value, dict):
        return ", ".join(f"{key.replace('_', ' ')} {_value(v)}" for key, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_value(v) for v in value)
    return str(value)


def _count(n: int) -> str:
    return f"{n:,}"


def _plural(n: int, noun: str) -> str:
    return f"{_count(n)} {noun}{'' if n == 1 else 's'}"


def _fraction(x: float) -> str:
    """Four decimals; small values in significant digits, so that they do not read as 0."""
    return f"{x:.4f}" if x == 0 or x >= 0.001 else f"{x:.3g}"


def _bytes(n: int) -> str:
    """Bytes up to 10 KiB, then KiB and MiB to one decimal (--json has the exact count)."""
    if n < 10 * 1024:
        return f"{_count(n)} bytes"
    if n < 2**20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 2**20:,.1f} MiB"
