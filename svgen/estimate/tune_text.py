"""`svgen tune`'s text: a `TuneResult` (svgen.estimate.tune_rows) as the ranked table and the
summary lines the command prints."""

from __future__ import annotations

from svgen.estimate.tune_rows import TuneResult


def format_table(result: TuneResult) -> list[str]:
    """The ranked table (Markdown, so it pastes into a README), then a line per dropped kind."""
    ref = result.dense_reference
    aligned = any(r.candidate.align != "exact" for r in result.rows)
    head = (
        [
            "#",
            "tiles / compute blocks",
            "align",
            "steps",
            "visited",
            "SMEM B",
            "VMEM MiB",
            "cycles",
            "ms",
            "vs dense",
            "density",
        ]
        + (["recall"] if aligned else [])
        + ["cost"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, r in enumerate(result.rows, 1):
        j = r.to_json(ref)
        density, recall = _per_pattern(j, "density"), _per_pattern(j, "recall")
        cells = [
            str(rank),
            r.candidate.label() + (" (current)" if r.current else ""),
            r.candidate.align,
            f"{r.steps:,}",
            f"{j['visited_fraction']:.4f}",
            f"{j['smem_bytes']:,}",
            f"{j['vmem_bytes'] / 2**20:.0f}",
            f"{r.cycles:,}",
            f"{r.ms:.2f}",
            f"{j['speedup_vs_dense']:.2f}x",
            density,
        ]
        if aligned:
            cells.append(recall)
        cells.append(j["cost"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _per_pattern(row: dict, key: str) -> str:
    """A row's value of `key`, one per pattern (comma-separated) for several patterns."""
    values = [row] if "patterns" not in row else list(row["patterns"].values())
    return ", ".join(f"{v[key]:.4f}" for v in values if key in v)


def summary_lines(result: TuneResult) -> list[str]:
    from svgen.estimate.cost import MODEL_CAVEAT

    c = result.choice
    lines = [
        f"{result.spec.name}: {len(result.rows)} candidates costed on {result.target} "
        f"({result.compiles} kernels compiled or read from the cost cache, the rest "
        f"estimated from them), {len(result.dropped)} over a budget; "
        f"{result.seconds:.0f} s",
        f"vs dense: against the fastest dense (keep-everything) kernel among the compiled "
        f"candidates, {result.dense_reference:,} cycles",
        f"first choice: {c.candidate.label()}, align {c.candidate.align}: "
        f"{c.ms:.2f} ms (static model)",
        f"every figure here is {MODEL_CAVEAT}; `svgen tune --measure` times the candidates on "
        "an attached TPU",
    ]
    reasons: dict[str, int] = {}
    for _, why in result.dropped:
        kind = "VMEM" if "VMEM" in why else "SMEM" if "SMEM" in why or "scalar" in why else why
        reasons[kind] = reasons.get(kind, 0) + 1
    for kind, n in sorted(reasons.items()):
        lines.append(
            f"dropped: {n} candidate(s) over the {kind} budget"
            if kind in ("VMEM", "SMEM")
            else f"dropped: {n} candidate(s): {kind}"
        )
    return lines
