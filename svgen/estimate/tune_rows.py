"""What `svgen tune` ranks: a candidate tiling (`Candidate`), a candidate costed (`Row`) and
the ranked search (`TuneResult`), each as its JSON."""

from __future__ import annotations

import dataclasses

from svgen.analysis import Plan
from svgen.spec import Spec


@dataclasses.dataclass(frozen=True, order=True)
class Candidate:
    block_q: int
    block_kv: int
    compute_q: int
    compute_kv: int
    align: str = "exact"

    @property
    def compute_shape(self) -> tuple[int, int]:
        return self.compute_q, self.compute_kv

    @property
    def blocks(self) -> int:
        return (self.block_q // self.compute_q) * (self.block_kv // self.compute_kv)

    @property
    def tiling_key(self) -> tuple[int, int, int, int]:
        return self.block_q, self.block_kv, self.compute_q, self.compute_kv

    @property
    def aligned(self) -> bool:
        """Every aligned mode generates the same mask-free code; exact keeps the mask."""
        return self.align != "exact"

    @property
    def code_key(self) -> tuple[int, int, int, int, bool]:
        """What the kernel's code depends on: the tiling and whether the mask is aligned."""
        return self.tiling_key + (self.aligned,)

    def label(self) -> str:
        tile = f"{self.block_q}x{self.block_kv}"
        if self.blocks == 1:
            return tile
        return f"{tile} / {self.compute_q}x{self.compute_kv}"

    def tiling(self) -> dict:
        """The spec's `tiling` mapping (compute blocks and align only when they matter)."""
        out = {"block_q": self.block_q, "block_kv": self.block_kv}
        if self.blocks > 1:
            out.update(compute_q=self.compute_q, compute_kv=self.compute_kv)
        if self.align != "exact":
            out["align"] = self.align
        return out


@dataclasses.dataclass
class Row:
    """One costed candidate."""

    candidate: Candidate
    plan: Plan
    cycles: int
    dense_cycles: int
    steps: int  # grid steps of one call, all heads
    exact: bool  # compiled (True) or estimated from its probe
    estimated_cycles: int | None = None  # the estimate, when it was also compiled
    current: bool = False  # the spec's own tiling

    @property
    def ms(self) -> float:
        return self.cycles / (self.plan.target.clock_ghz * 1e6)

    def to_json(self, dense_reference: int) -> dict:
        p = self.plan
        out = {
            "tiling": self.candidate.tiling(),
            "label": self.candidate.label(),
            "align": self.candidate.align,
            "steps": self.steps,
            "visited_fraction": _visited(p),
            "smem_bytes": p.table_bytes,
            "vmem_bytes": p.kernel.vmem.limit(),
            "cycles": self.cycles,
            "ms": self.ms,
            "speedup_vs_dense": dense_reference / self.cycles,
            "dense_cycles": self.dense_cycles,
            "cost": "compiled" if self.exact else "estimated",
            "current": self.current,
        }
        if self.estimated_cycles is not None:
            out["estimated_cycles"] = self.estimated_cycles
        if len(p.patterns) == 1:
            out.update(_pattern_pairs(p.only))
        else:
            out["patterns"] = {x.name: _pattern_pairs(x) for x in p.patterns}
        return out


@dataclasses.dataclass
class TuneResult:
    spec: Spec
    target: str
    rows: list[Row]  # ranked, fastest first
    dropped: list[tuple[Candidate, str]]  # over a budget: (candidate, why)
    compiles: int
    seconds: float

    @property
    def choice(self) -> Row:
        return self.rows[0]

    @property
    def dense_reference(self) -> int:
        """The fastest dense (keep-everything) kernel among the compiled candidates: one
        denominator for every row's speedup."""
        compiled = [r.dense_cycles for r in self.rows if r.exact] or [
            r.dense_cycles for r in self.rows
        ]
        return min(compiled)

    def to_json(self) -> dict:
        from svgen.estimate.cost import MODEL_CAVEAT

        ref = self.dense_reference
        return {
            "estimate": MODEL_CAVEAT,
            "spec": self.spec.name,
            "target": self.target,
            "seconds": self.seconds,
            "compiles": self.compiles,
            "candidates": len(self.rows) + len(self.dropped),
            "dense_reference_cycles": ref,
            "choice": self.choice.to_json(ref),
            "rows": [r.to_json(ref) for r in self.rows],
            "dropped": [
                {"tiling": c.tiling(), "label": c.label(), "align": c.align, "reason": why}
                for c, why in self.dropped
            ],
        }


def _visited(plan: Plan) -> float:
    return sum(p.visited_fraction for p in plan.patterns) / len(plan.patterns)


def _pattern_pairs(pattern) -> dict:
    """Density (of the mask the kernel runs) and, aligned, what aligning changed."""
    b = pattern.budget
    if b is None:
        return {"density": pattern.density}
    return {
        "density": b.density,
        "exact_density": b.exact_density,
        "recall": b.recall,
        "precision": b.precision,
        "rows_emptied": b.rows_emptied,
    }
