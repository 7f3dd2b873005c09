"""What `tiling.align` does to outputs, next to what it gains in modelled time.

    .venv/bin/python bench/aligned_quality.py [--rows N] [--specs NAME...] [--seed S]

For every shipped spec and every align mode: the pair budget (density, recall, precision,
rows emptied, exact from the analysis), the modelled time of one call (`svgen cost`, v6e
static model) against the exact mask's and against dense Splash at the spec's geometry
(`bench/splash_cost.py`), and the relative L2 error of the aligned attention output against
the exact one,

    || o_aligned - o_exact || / || o_exact ||   over sampled query rows of every head,

on two inputs: random q, k, v (standard normal) and the activations of the example DiT layer
(`examples/video_dit_layer.py`: LayerNorm'd tokens carrying a frame code and a place code, Q/K
projections reading the frame code for spatial heads and the place code for temporal ones)
at the spec's geometry.

Why sampled rows of a float reference, not the kernels: at 45K-119K tokens the kernels run
only on a TPU (interpret mode on this 2-core CPU would take hours); each kernel is exact for its
own mask (tests/test_align.py checks the aligned kernel against the float64 reference of the
aligned mask, tests/test_kernels.py the exact one), so the difference of the two references
is the difference of the two kernels up to bf16 rounding. Rows are sampled uniformly (the
same rows for every mode); scores in float32, softmax and sums in float64.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from svgen.estimate import tpu_schedule  # noqa: E402

tpu_schedule.ensure_dump_flags()  # before anything starts libtpu

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from splash_cost import dense_splash_cost  # noqa: E402
from svgen.estimate import cost  # noqa: E402
from svgen.analysis import analyze  # noqa: E402
from svgen.core.kinds import TileKind  # noqa: E402
from svgen.spec import ALIGN_MODES, parse_spec  # noqa: E402

SPECS = sorted((REPO / "specs").glob("*.yaml"))
ROWS_AT_ONCE = 64  # query rows per batch: bounds the [rows, seq_len] score arrays


def load_example():
    path = REPO / "examples" / "video_dit_layer.py"
    spec = importlib.util.spec_from_file_location("video_dit_layer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def aligned_plan(path: pathlib.Path, mode: str):
    data = yaml.safe_load(path.read_text())
    data["tiling"] = dict(data.get("tiling") or {}, align=mode)
    return analyze(parse_spec(yaml.safe_dump(data, sort_keys=False), source=str(path)))


def head_kinds(plan, head_pattern) -> list[str]:
    """The planted kind of each head of the DiT layer: temporal for a temporal pattern."""
    return [
        "temporal"
        if "temporal" in plan.patterns[p].name or "temporal" in plan.spec.name
        else "spatial"
        for p in head_pattern
    ]


def inputs(plan, kinds, which: str, rng, example):
    """q, k, v [heads, seq_len, head_dim] float32 in the user's order."""
    heads, d, n = plan.spec.attention.heads, plan.spec.attention.head_dim, plan.layout.seq_len
    if which == "random":
        return tuple(rng.standard_normal((heads, n, d), dtype=np.float32) for _ in range(3))
    x = example.tokens(plan, rng)
    h = (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-6)
    wq, wk, wv, _ = (np.asarray(w, np.float32) for w in example.layer_weights(kinds, d, rng))
    return tuple(np.einsum("sm,hmd->hsd", h, w).astype(np.float32) for w in (wq, wk, wv))


def aligned_keep(pattern, rows: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """The aligned mask's keep [rows, seq_len] of kernel-order query rows, from the compute
    blocks' kinds (an exact pattern's BOUNDARY blocks take the exact keep; an aligned one has
    none)."""
    lay, grid = pattern.layout, pattern.compute_grid
    kinds = pattern.compute_kinds[rows // grid.block_q][:, np.arange(lay.seq_len) // grid.block_kv]
    return np.where(kinds == TileKind.FULL, True, np.where(kinds == TileKind.EMPTY, False, exact))


def exact_keep(pattern, rows: np.ndarray) -> np.ndarray:
    """keep [rows, seq_len] of the mask as written, from the IR oracle."""
    lay = pattern.layout
    return pattern.mask.evaluate(
        lay.coordinates(rows).reshape(-1, 1), lay.coordinates(np.arange(lay.seq_len)).reshape(1, -1)
    )


def attend(scores: np.ndarray, keep: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Softmax attention of score rows under `keep` (rows without a key give zeros)."""
    s = np.where(keep, scores.astype(np.float64), -np.inf)
    m = np.max(s, axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.where(keep, np.exp(s - m), 0.0)
    total = p.sum(axis=1, keepdims=True)
    out = (p.astype(np.float32) @ v).astype(np.float64)
    return np.where(total > 0, out / np.where(total > 0, total, 1.0), 0.0)


def output_errors(plans: dict, rows_per_head: int, rng, example) -> dict:
    """{mode: {input: relative L2 error}} over sampled rows (the same rows for every mode)."""
    exact_plan = plans["exact"]
    head_pattern = cost.model_head_pattern(exact_plan)
    kinds = head_kinds(exact_plan, head_pattern)
    scale = 1.0 / np.sqrt(exact_plan.spec.attention.head_dim)
    sums = {mode: {} for mode in plans}
    for which in ("random", "dit"):
        q, k, v = inputs(exact_plan, kinds, which, rng, example)
        num = {mode: 0.0 for mode in plans}
        den = 0.0
        for head, index in enumerate(head_pattern):
            lay = exact_plan.patterns[index].layout
            order = lay.original_index(np.arange(lay.seq_len))  # kernel position -> user token
            sample = np.sort(rng.choice(lay.seq_len, rows_per_head, replace=False))
            qh, kh, vh = q[head][order], k[head][order], v[head][order]
            for rows in np.array_split(sample, -(-sample.size // ROWS_AT_ONCE)):
                scores = (qh[rows] * scale) @ kh.T
                exact = exact_keep(exact_plan.patterns[index], rows)  # one mask for all modes
                reference = attend(scores, exact, vh)
                den += float(np.sum(reference**2))
                for mode, plan in plans.items():
                    if mode != "exact":
                        out = attend(scores, aligned_keep(plan.patterns[index], rows, exact), vh)
                        num[mode] += float(np.sum((out - reference) ** 2))
        for mode in plans:
            sums[mode][which] = (num[mode] / den) ** 0.5 if den else 0.0
    return sums


def budget_cells(plan) -> tuple[str, str, str, str]:
    """density (exact -> aligned), recall, precision, rows emptied; ' / ' between patterns."""

    def each(fn):
        return " / ".join(fn(p) for p in plan.patterns)

    if plan.patterns[0].budget is None:
        return each(lambda p: f"{p.density:.4f}"), "1", "1", "0"
    return (
        each(lambda p: f"{p.budget.exact_density:.4f} → {p.budget.density:.4f}"),
        each(lambda p: f"{p.budget.recall:.4f}"),
        each(lambda p: f"{p.budget.precision:.4f}"),
        each(lambda p: f"{p.budget.rows_emptied:,}"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128, help="sampled query rows per head")
    parser.add_argument("--specs", nargs="+", metavar="NAME", help="spec names (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    example = load_example()
    paths = [p for p in SPECS if not args.specs or p.stem in args.specs]
    splash_cache: dict[tuple, int] = {}
    print(
        "| spec | align | density (exact → aligned) | recall | precision | rows emptied | "
        "ms | vs exact | vs dense Splash | rel. L2, random | rel. L2, DiT layer |"
    )
    print("|" + "---|" * 11)
    for path in paths:
        plans = {mode: aligned_plan(path, mode) for mode in ALIGN_MODES}
        a = plans["exact"].spec.attention
        geometry = (plans["exact"].layout.seq_len, a.heads, a.head_dim)
        if geometry not in splash_cache:
            splash_cache[geometry] = dense_splash_cost(
                seq_len=geometry[0], heads=geometry[1], head_dim=geometry[2]
            )["cycles"]
        cycles = {mode: cost.cost_plan(plan, str(path)).cycles for mode, plan in plans.items()}
        errors = output_errors(plans, args.rows, np.random.default_rng(args.seed), example)
        for mode, plan in plans.items():
            density, recall, precision, emptied = budget_cells(plan)
            ms = cycles[mode] / (plan.target.clock_ghz * 1e6)
            print(
                f"| {path.stem} | {mode} | {density} | {recall} | {precision} | {emptied} | "
                f"{ms:.1f} | {cycles['exact'] / cycles[mode]:.2f}x | "
                f"{splash_cache[geometry] / cycles[mode]:.2f}x | "
                f"{errors[mode]['random']:.2e} | {errors[mode]['dit']:.2e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
