"""Where a selection call's time goes on the attached TPU: the whole call, the selection
(scores and top-k), the per-call tables, and the forward kernel alone on those tables, with
and without run-time segment ids (packed videos), in one process.

    python bench/select_parts.py SPEC [--videos N] [--iters N] [--json FILE]
        [--target CHIP] [--interpret]

SPEC: a spec with `select` (and `runtime.segments` for the packed rows). Each row is the
median of --iters calls after a warm-up; the kernel rows reuse tables built once, so the
kernel is timed without the work that builds them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

import numpy as np

from svgen.chip import chip_bench
from svgen.spec import load_spec


def parts(spec, chip, options, videos: int, progress) -> dict:
    import jax
    import jax.numpy as jnp

    from svgen.runtime.forward import flat_attention
    from svgen.runtime.softmax import LOG2_E
    from svgen.runtime.tpu_call import TableSource

    with tempfile.TemporaryDirectory(prefix="select-parts-") as folder:
        plan, module = chip_bench.compile_module(spec, chip, pathlib.Path(folder))
        att = module.attention
        q, k, v = chip_bench.draw_inputs(module, options.seed)
        seq, heads = int(module.SEQ_LEN), int(module.HEADS)
        scale = 1.0 / float(np.sqrt(int(module.HEAD_DIM)))
        static = np.asarray(getattr(module, "HEAD_PATTERN", (0,) * heads), np.int32)
        hp = jnp.asarray(static)
        result = {"spec": spec.name, "videos": videos}
        packed = "segment_ids" in att.runtime.arguments()
        ids = None
        if packed:
            segs = np.minimum(np.arange(seq) * videos // seq, videos - 1).astype(np.int32)
            ids = att._call_ids(jnp.asarray(segs), None, None)

        def timed(label, fn, *args):
            progress(label)
            try:
                timing, out = chip_bench.time_calls(
                    jax.jit(fn), args, warmup=1, iters=options.iters, clock=time.perf_counter
                )
            except Exception as exc:  # recorded, not fatal
                result[label] = {"error": chip_bench._short(exc)}
                return None
            result[label] = timing.to_json()
            return out

        interpret = options.interpret
        kwargs = {"segment_ids": jnp.asarray(segs)} if packed else {}
        timed("call", lambda q, k, v: att(q, k, v, interpret=interpret, **kwargs), q, k, v)
        for name, call_ids in (("plain", None), ("packed", ids)):
            if name == "packed" and ids is None:
                continue
            rows = None if call_ids is None else att._selection_ids(hp, call_ids)

            def choose(q, k, rows=rows):
                return att.select.choose(q, k, scale, None, hp, rows).blocks

            chosen = timed(f"{name}: selection", choose, q, k)

            def tables(chosen, rows=rows):
                return att.select.forward_tables(chosen, hp, rows)

            built = timed(f"{name}: tables", tables, chosen)
            id_rows = () if call_ids is None else tuple(att._id_rows(hp, call_ids))

            def kernel(q, k, v, built, id_rows=id_rows):
                source = TableSource("selection", built)
                call = att._forward_call(interpret, scale * LOG2_E, source=source, ids=id_rows)
                return flat_attention(q, k, v, hp, static, call)

            timed(f"{name}: kernel", kernel, q, k, v, built)
            result[f"{name}: steps"] = int(built.steps)
            result[f"{name}: pieces per row"] = [int(x) for x in np.asarray(built.row_num_pieces)]
        return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", type=pathlib.Path)
    parser.add_argument("--videos", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--target", default=None)
    parser.add_argument("--interpret", action="store_true")
    args = parser.parse_args(argv)
    chip = chip_bench.script_chip("select_parts", args.interpret, args.target)
    if chip is None:
        return 2
    options = chip_bench.Options(iters=args.iters, interpret=args.interpret)
    progress = chip_bench.script_progress("select_parts")
    report = chip_bench.script_report(chip, args.interpret)
    result = parts(load_spec(args.spec, chip=chip), chip, options, args.videos, progress)
    report["results"] = [result]
    for key, value in result.items():
        ms = value.get("median_ms", value.get("error")) if isinstance(value, dict) else value
        print(f"{key}: {ms}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
