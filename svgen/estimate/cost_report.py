"""What `svgen cost` reports: the model's caveats (what its figures are against a chip's,
and what the chip showed for large programs), `CostReport` and its parts (`Utilisation`,
`ChunkReport`, `TrainingReport`), each as its JSON. The text is svgen.estimate.cost_text."""

from __future__ import annotations

import dataclasses

from svgen.estimate.measure import PolicyCost, TrainingPaths
from svgen.estimate.paths import PathCosts


def _v5e():
    """What the chip showed (svgen.analysis.targets.V5E_MEASURED): the figures quoted here."""
    from svgen.analysis.targets import V5E_MEASURED

    return V5E_MEASURED


def _model_caveat() -> str:
    m = _v5e()
    least, most, typical = m.model_typical
    return (
        "an estimate from libtpu's static schedule, not a measurement: on a TPU v5e the chip "
        f"took {least:.2f}-{most:.2f}x its figures in {typical} of {m.model_pairs} one-level "
        f"tilings of the shipped specs, but up to {m.model_worst:.1f}x where the kernel's "
        "program was large (docs/measured.md); time a spec on a chip with `svgen bench`"
    )


#: What every figure of `svgen cost` and `svgen tune` is, said beside them: the static model
#: is not calibrated to a chip, and this is its error measured on one.
MODEL_CAVEAT = _model_caveat()


def program_caveat(
    bundles: int, residual_masks: bool = False, straight_words: bool = False
) -> str | None:
    """What the chip showed for a program this large, or None (not read, or small enough);
    residual_masks / straight_words: the kernel has them, the code the static model chose
    that makes programs large (docs/measured.md, "The program-size cliff"). The model does
    not see a program's size."""
    m = _v5e()
    fine, slow = m.program_fast_bundles, m.program_slow_bundles
    if bundles <= fine:
        return None
    lo, hi = m.program_slowdown
    slower = f"{lo:.1f}-{hi:.1f}x slower than a smaller program of the same spec"
    seen = (
        f"programs of {slow:,} bundles or more ran {slower}"
        if bundles >= slow
        else f"programs of {fine:,} to {slow:,} bundles were not measured, larger ones ran "
        + slower
    )
    # svgen bench's --program (svgen.core.program.ProgramLimits): the module timed with that
    # code left out, each in turn.
    without = [
        f"--program {limit}"
        for limit, present in (
            ("whole_masks", residual_masks),
            ("straight_words=0", straight_words),
        )
        if present
    ]
    smaller = (
        f"; `svgen bench {' '.join(without)}` times it without the code that makes it large"
        if without
        else ""
    )
    return (
        f"the kernel's program is {bundles:,} bundles: on a TPU v5e {seen} (docs/measured.md, "
        f"the program-size cliff); time it with `svgen bench`, or take a smaller tiling{smaller}"
    )


@dataclasses.dataclass(frozen=True)
class CostReport:
    target: str
    clock_ghz: float
    paths: PathCosts
    steps: dict  # per kind over all heads: {"full": n, "mixed": n, "empty": n, "skipped": n}
    cycles: int
    cycles_by_path: dict
    dense_cycles: int | None
    vmem_bytes: int
    smem_bytes: int
    heads: int
    training: "TrainingReport | None" = None
    chunks: "ChunkReport | None" = None  # runtime.kv_cache: the chunked calls
    # select: the call's bounds, {"none": (cycles, steps), "all": (cycles, steps)}: nothing
    # selected (the mask alone) and every selectable block selected (the tables' maximum)
    select: dict | None = None
    utilisation: "Utilisation | None" = None  # None: a select spec (its work depends on a call)
    # attention.softmax: bounded: (cycles, dense cycles) if every q tile fell back to the
    # online softmax (the paths' `fallback`); `cycles` is every q tile within the bound.
    fallback: tuple[int, int] | None = None
    # select: the per-call selection program's counts and the cycles reading q and k once
    # at HBM bandwidth (measure_select_policy, pooling_floor)
    policy: tuple[PolicyCost, int] | None = None
    # attention.softmax: bounded: the XLA pass over k before the kernel (each row's largest
    # key norm, svgen.runtime.softmax.key_bound), in cycles at HBM bandwidth; not in `cycles`
    key_pass: int | None = None
    # The dense kernel (every pair kept) at the fastest of the spec's own tiling and
    # DENSE_TILINGS, by the model: (tiling (bq, bkv, cq, ckv), cycles, tilings modelled);
    # None: not searched
    dense_best: tuple[tuple[int, int, int, int], int, int] | None = None

    @property
    def call_cycles(self) -> int:
        """The call: the kernel and, for a bounded softmax, its pass over k."""
        return self.cycles + (self.key_pass or 0)

    @property
    def ms(self) -> float:
        return self.cycles / (self.clock_ghz * 1e6)

    @property
    def policy_cycles(self) -> int | None:
        """The selection program's cycles, pooling at least at HBM speed (None: no select)."""
        return None if self.policy is None else self.policy[0].cycles(self.policy[1])

    def to_json(self) -> dict:
        return {
            "estimate": MODEL_CAVEAT,
            "target": self.target,
            "clock_ghz": self.clock_ghz,
            "cycles": self.cycles,
            "ms": self.ms,
            "paths": self.paths.to_json(),
            "steps": self.steps,
            "cycles_by_path": self.cycles_by_path,
            "dense_cycles": self.dense_cycles,
            "dense_ms": None
            if self.dense_cycles is None
            else self.dense_cycles / (self.clock_ghz * 1e6),
            "vmem_bytes": self.vmem_bytes,
            "smem_bytes": self.smem_bytes,
            "heads": self.heads,
            "model": "static: libtpu's bundle schedule, no DMA stalls, clock assumed",
            **(
                {} if self.training is None else {"training": self.training.to_json(self.clock_ghz)}
            ),
            **({} if self.chunks is None else {"chunks": self.chunks.to_json(self.clock_ghz)}),
            **(
                {}
                if self.fallback is None
                else {
                    "fallback": {
                        "cycles": self.fallback[0],
                        "ms": self.fallback[0] / (self.clock_ghz * 1e6),
                        "dense_cycles": self.fallback[1],
                    }
                }
            ),
            **({} if self.utilisation is None else {"utilisation": self.utilisation.to_json(self)}),
            **({} if self.key_pass is None else {"key_pass_cycles": self.key_pass}),
            **(
                {}
                if self.dense_best is None
                else {
                    "dense_best": {
                        "tiling": list(self.dense_best[0]),
                        "cycles": self.dense_best[1],
                        "ms": self.dense_best[1] / (self.clock_ghz * 1e6),
                        "tilings_modelled": self.dense_best[2],
                    }
                }
            ),
            **(
                {}
                if self.select is None
                else {
                    "select": {
                        **{
                            bound: {"cycles": c, "ms": c / (self.clock_ghz * 1e6), "steps": st}
                            for bound, (c, st) in self.select.items()
                        },
                        **(
                            {}
                            if self.policy is None
                            else {
                                "policy": {
                                    "cycles": self.policy_cycles,
                                    "ms": self.policy_cycles / (self.clock_ghz * 1e6),
                                    "pooling_floor": self.policy[1],
                                    **self.policy[0].to_json(),
                                }
                            }
                        ),
                    }
                }
            ),
        }


@dataclasses.dataclass(frozen=True)
class Utilisation:
    """Useful work of one call over all heads against the chip's bf16 peak: 4 x head_dim
    FLOPs per pair the kernel's mask keeps (QK^T and PV, 2 x head_dim each; padding, masked
    entries of visited blocks and the softmax are not useful work), at the modelled time.

    The peak is the published one. On v6e the MXU issue rate in libtpu's schedule is 512
    bundles per 512 x 512 block at head_dim 128 (262,144 FLOP per bundle), which at the
    assumed 1.75 GHz is 458.8 TFLOP/s, half the published 918: a modelled kernel cannot show
    more than 50% there, and the clock the model assumes is likely low by up to 2x (cycle
    ratios, which every speedup is, do not depend on it)."""

    flops: int  # of the mask's kept pairs (a lower bound when `exact` is False)
    exact: bool  # every head's pattern has an exact pair count
    dense_flops: int  # every pair of every head: the work of the dense kernel
    peak_flops_per_s: float  # Target.bf16_flops_per_core_s

    def to_json(self, report: "CostReport") -> dict:
        rate = _flops_per_s(self.flops, report.cycles, report.clock_ghz)
        out = {
            "useful_flops": self.flops,
            "useful_flops_exact": self.exact,
            "useful_flops_per_s": rate,
            "peak_flops_per_s": self.peak_flops_per_s,
            "of_peak": rate / self.peak_flops_per_s,
        }
        if report.dense_cycles:
            dense = _flops_per_s(self.dense_flops, report.dense_cycles, report.clock_ghz)
            out["dense_of_peak"] = dense / self.peak_flops_per_s
        return out


def _flops_per_s(flops: int, cycles: int, clock_ghz: float) -> float:
    return flops * clock_ghz * 1e9 / cycles


@dataclasses.dataclass(frozen=True)
class ChunkReport:
    """The chunked calls of a `runtime.kv_cache` module (svgen.runtime.chunks): the chunk
    kernel's paths (it reads per-row tables and the chunk's first token), and per chunk
    position one call's steps and cycles over all heads."""

    chunk_frames: int
    paths: PathCosts
    steps: tuple[dict, ...]
    cycles: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.cycles)

    def to_json(self, clock_ghz: float) -> dict:
        return {
            "chunk_frames": self.chunk_frames,
            "paths": self.paths.to_json(),
            "positions": [
                {
                    "first_frame": i * self.chunk_frames,
                    "steps": steps,
                    "cycles": cycles,
                    "ms": cycles / (clock_ghz * 1e6),
                }
                for i, (steps, cycles) in enumerate(zip(self.steps, self.cycles))
            ],
            "total_cycles": self.total,
            "total_ms": self.total / (clock_ghz * 1e6),
        }


@dataclasses.dataclass(frozen=True)
class TrainingReport:
    """One forward + backward call (what a training step runs), from `svgen cost --backward`:
    cycles per kernel over all heads, the same kernels on a dense mask, their paths."""

    paths: TrainingPaths
    cycles: dict  # forward (with lse), dq, dkv
    steps: dict  # per kernel: steps per kind
    dense_cycles: dict

    @property
    def backward(self) -> int:
        return sum(v for k, v in self.cycles.items() if k != "forward")

    @property
    def total(self) -> int:
        return self.cycles["forward"] + self.backward

    def to_json(self, clock_ghz: float) -> dict:
        dense_total = sum(self.dense_cycles.values())
        return {
            "cycles": self.cycles,
            "backward_cycles": self.backward,
            "total_cycles": self.total,
            "total_ms": self.total / (clock_ghz * 1e6),
            "backward_over_forward": self.backward / self.cycles["forward"],
            "steps": self.steps,
            "dense_cycles": self.dense_cycles,
            "dense_total_cycles": dense_total,
            "paths": self.paths.to_json(),
        }
