"""Does every shipped spec's kernel compile for a TPU, forward and backward, at the tiling
`svgen compile --target CHIP` takes for it? Ahead of time on this host, by libtpu (no chip).

    ALLOW_MULTIPLE_LIBTPU_LOAD=1 PYTHONPATH=. python bench/aot_compile.py [--target v5e]
        [--forward-only] [--json FILE] [SPEC...]          (default: specs/*.yaml)

For each spec: the module compiled for the target (its `tiling.<target>` where it has one),
its forward call, and `jax.grad` of the outputs' sum through q, k and v (the training step's
kernels: the forward with its residuals, dq, dk/dv), each lowered and compiled by libtpu for
the target's topology. A table goes to stdout: compile seconds, or the error's first line
(CompileTimeScopedVmemOom and friends). Exit 1 when anything failed.

What this proves is that Mosaic and libtpu accept the kernels within the scoped VMEM limit
each asks for. It does not time them, and it is no substitute for the chip: issue 42 asks for
the same on a v5e (`svgen bench --backward`).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

from svgen.chip import chip_bench
from svgen.estimate import measure
from svgen.spec import load_spec

REPO = pathlib.Path(__file__).resolve().parent.parent


def compile_seconds(fn, args) -> dict:
    import jax

    start = time.perf_counter()
    try:
        jax.jit(fn).lower(*args).compile()
    except Exception as exc:  # a refusal by Mosaic or libtpu is the finding, not a crash
        return {"ok": False, "error": str(exc).strip().splitlines()[0][:300]}
    return {"ok": True, "seconds": round(time.perf_counter() - start, 1)}


def check_spec(path: pathlib.Path, target: str, backward: bool) -> dict:
    import jax
    import jax.numpy as jnp

    spec = load_spec(path, chip=target)
    t = spec.tiling
    result = {"spec": spec.name, "tiling": f"{t.block_q}x{t.block_kv}/{t.cq}x{t.ckv}"}
    with tempfile.TemporaryDirectory(prefix="svgen-aot-") as folder:
        _, module = chip_bench.compile_module(spec, target, pathlib.Path(folder))
        q, k, v, head_pattern = measure.aot_args(module, target)

        def forward(q, k, v, hp):
            return module.attention(q, k, v, head_pattern=hp)

        def loss(q, k, v, hp):
            return jnp.sum(forward(q, k, v, hp).astype(jnp.float32))

        result["forward"] = compile_seconds(forward, (q, k, v, head_pattern))
        if backward:
            grad = jax.grad(loss, argnums=(0, 1, 2))
            result["backward"] = compile_seconds(grad, (q, k, v, head_pattern))
    return result


def cell(entry: dict | None) -> str:
    if entry is None:
        return "-"
    return f"{entry['seconds']} s" if entry["ok"] else f"FAILS: {entry['error']}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="*", type=pathlib.Path)
    parser.add_argument("--target", default="v5e", choices=["v5e", "v6e", "v7x"])
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    specs = args.specs or sorted((REPO / "specs").glob("*.yaml"))
    results = []
    for path in specs:
        print(f"aot_compile: {path.name} for {args.target}", file=sys.stderr, flush=True)
        results.append(check_spec(path, args.target, not args.forward_only))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"| spec ({args.target} tiling) | tiling | forward | forward + jax.grad |")
    print("|---|---|---|---|")
    for r in results:
        print(f"| {r['spec']} | {r['tiling']} | {cell(r['forward'])} | {cell(r.get('backward'))} |")
    failed = any(not r[d]["ok"] for r in results for d in ("forward", "backward") if d in r)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
