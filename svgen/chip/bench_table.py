"""The table `svgen bench` prints: a Markdown row per spec and direction, from the results of
svgen.chip.chip_bench (svgen, dense Splash at its best blocks, Splash given the same mask at
its best and which configuration won, the speedups, the sampled rows' errors, and for an int8
spec its cosine similarity and relative L1 on both input kinds: svgen.chip.int8_error)."""

from __future__ import annotations

from svgen.chip import int8_error


def _splash_config(masked: dict) -> str:
    """Which Splash configuration won (svgen.chip.splash_peer.Config.label)."""
    return f" ({masked['label']})" if masked.get("label") else ""


def format_table(results: list[dict], chip: str) -> list[str]:
    """Markdown rows: one per (spec, direction)."""
    lines = [
        f"| spec ({chip}) | tiling | direction | svgen ms | first call s | dense Splash ms "
        "(blocks) | Splash given the mask, at its best ms (winner) | vs dense | vs same mask "
        "| max error |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t = r["tiling"]
        tiling = f"{t['block_q']}x{t['block_kv']}"
        if (t["compute_q"], t["compute_kv"]) != (t["block_q"], t["block_kv"]):
            tiling += f" / {t['compute_q']}x{t['compute_kv']}"
        if t["align"] != "exact":
            tiling += f" {t['align']}"
        for direction in ("forward", "backward"):
            mine = r.get(f"svgen_{direction}")
            if mine is None:
                continue
            dense = r.get(f"splash_dense_{direction}", {})
            masked = r.get(f"splash_mask_{direction}", {})
            lines.append(
                "| "
                + " | ".join(
                    [
                        r["spec"],
                        tiling,
                        direction,
                        _ms(mine),
                        f"{mine['first_call_s']:.1f}" if "first_call_s" in mine else "-",
                        _ms(dense)
                        + (
                            f" ({'/'.join(map(str, dense['blocks']))})"
                            if dense.get("blocks")
                            else ""
                        ),
                        _ms(masked) + _splash_config(masked),
                        _x(r.get(f"speedup_vs_splash_dense_{direction}")),
                        _x(r.get(f"speedup_vs_splash_mask_{direction}")),
                        _err(mine, masked),
                    ]
                )
                + " |"
            )
    return lines


def _ms(entry: dict) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return "failed: " + entry["error"][:60]
    return f"{entry['median_ms']:.2f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _err(mine: dict, masked: dict) -> str:
    parts = []
    for label, entry in (("svgen", mine), ("Splash", masked)):
        if "max_error" in entry:
            parts.append(f"{label} {entry['max_error']:.1e}{'' if entry['ok'] else ' FAIL'}")
    if "int8_error" in mine:  # attention.qk: int8 (svgen.chip.int8_error)
        parts.append("int8 vs float32: " + int8_error.error_words(mine["int8_error"]))
    return ", ".join(parts) or "-"
