"""What moving q, k, v and o between the user's token order and a head's kernel order costs on
the attached TPU, for each way svgen could move them, in one process.

    python bench/permute_on_chip.py SPEC... [--order A,B,C]... [--cube F,H,W]... [--iters N]
        [--json FILE] [--interpret]

For each spec (one pattern, a layout that is not frame-major) and its [heads, seq, d] inputs,
and for each --order (one of the six axis orders, such as f,w,h) and --cube (the tiled order
of F x H x W cubes) on the first spec's geometry, without its text or anchor frames:
  copy     x + 1: one read and one write of the tensor, the floor any permutation has
  xla      the layout's own reshapes and transposes (TokenLayout.to_kernel / from_kernel), what
           the wrapper runs for tiled orders whose cubes divide the video, and ran for every
           other order before the gather
  gather   one gather of whole tokens (svgen.runtime.calls.token_gather), what the generated
           wrapper runs where the permute kernel does not apply
  one_transpose  (temporal-major layouts) the main frames moved by one 5-D transpose, the
           anchor frames by another where the frame is transposed, then joined
  pallas   svgen.runtime.permute's kernel, where it applies (temporal-major, not transposed)
each to kernel order and back, timed as the median of --iters calls after two warm-ups.
Prints a table; --json keeps the figures with the chip, versions, commit and source digest.
Without a TPU it stops with one line (exit 2), unless --interpret.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

from svgen.chip import chip_bench
from svgen.spec import load_spec


def candidates(lay, interpret: bool) -> dict:
    """name -> (to kernel order, from kernel order), each x [rows, seq, d] -> same shape."""
    import jax.numpy as jnp

    from svgen.runtime import permute
    from svgen.runtime.calls import token_gather

    ways = {
        "copy": (lambda x: x + 1, lambda x: x + 1),
        "xla": (lambda x: lay.to_kernel(x, jnp), lambda x: lay.from_kernel(x, jnp)),
        "gather": (token_gather(lay, True), token_gather(lay, False)),
    }
    if lay.is_temporal_major and not lay.is_tiled:
        ways["one_transpose"] = (
            lambda x: _one_transpose(lay, x, True),
            lambda x: _one_transpose(lay, x, False),
        )
    if permute.applies([lay]):
        heads = jnp.zeros((1,), jnp.int32)

        def pallas(to_kernel):
            return lambda x: permute.permute(
                x, [lay], heads, to_kernel=to_kernel, interpret=interpret
            )

        ways["pallas"] = (pallas(True), pallas(False))
    return ways


def _one_transpose(lay, x, to_kernel: bool):
    """A temporal-major layout's permutation as one transpose of the main frames (and one of
    the anchor frames when the frame is transposed); the text stays where it is."""
    import jax.numpy as jnp

    rows, d = x.shape[0], x.shape[-1]
    v0, n, a, t = lay.video_start, lay.video_tokens, lay.anchor_frames, lay.main_frames
    split = a * lay.tokens_per_frame
    r, c = (lay.width, lay.height) if lay.transposed else (lay.height, lay.width)  # the video's
    # [rows, frames, r, c, d] -> the kernel's order, for the main frames and the anchors
    main_axes = (0, 3, 2, 1, 4) if lay.transposed else (0, 2, 3, 1, 4)
    anchor_axes = (0, 1, 3, 2, 4) if lay.transposed else (0, 1, 2, 3, 4)

    def move(part, frames, axes):
        user_shape = (rows, frames, r, c, d)
        if to_kernel:
            return part.reshape(user_shape).transpose(axes).reshape(rows, -1, d)
        kernel_shape = tuple(user_shape[i] for i in axes)
        return part.reshape(kernel_shape).transpose(np.argsort(axes)).reshape(rows, -1, d)

    video = x[:, v0 : v0 + n]
    moved = [move(video[:, :split], a, anchor_axes), move(video[:, split:], t, main_axes)]
    return jnp.concatenate([x[:, :v0], *moved, x[:, v0 + n :]], axis=1)


def spec_layout(spec, chip):
    from svgen.analysis import analyze

    return analyze(spec, target_name=chip).layout


def other_layouts(spec, orders, cubes) -> list:
    """(name, layout) of each --order and --cube on the spec's geometry, video only."""
    from svgen.core.layout import TokenLayout, Tiled

    g = spec.geometry
    video = TokenLayout(frames=g.frames, height=g.height, width=g.width)
    named = [(f"{spec.name} {o.words().replace(' ', '')}", video.with_order(o)) for o in orders]
    named += [
        (f"{spec.name} cubes {'x'.join(map(str, c))}", video.with_order(Tiled(*c))) for c in cubes
    ]
    return named


def bench_layout(name, lay, spec, options, progress) -> dict:
    import jax

    rows, seq, d = spec.attention.heads, lay.seq_len, spec.attention.head_dim
    x = jax.random.normal(jax.random.key(options.seed), (rows, seq, d)).astype(spec.attention.dtype)
    user = np.asarray(x, np.float32)
    expected = lay.to_kernel(user)
    result = {"spec": name, "tensor_mb": round(x.nbytes / 2**20, 2), "ways": {}}
    for way, (to_kernel, from_kernel) in candidates(lay, options.interpret).items():
        entry = {}
        for direction, fn in (("to_kernel", to_kernel), ("from_kernel", from_kernel)):
            timing, out = chip_bench.time_calls(
                jax.jit(fn),
                (x,),
                warmup=options.warmup,
                iters=options.iters,
                clock=time.perf_counter,
            )
            progress(f"{result['spec']}: {way} {direction} {timing.median_s * 1e3:.3f} ms")
            entry[direction] = timing.to_json()
            if way != "copy" and direction == "to_kernel":
                entry["matches"] = bool(np.array_equal(np.asarray(out, np.float32), expected))
            if way != "copy" and direction == "from_kernel":  # from_kernel(x) is x's preimage
                back = np.asarray(lay.to_kernel(np.asarray(out, np.float32)))
                entry["inverse_matches"] = bool(np.array_equal(back, user))
        result["ways"][way] = entry
    return result


def table(results: list[dict]) -> list[str]:
    lines = [
        "| spec | tensor MiB | way | to kernel ms | from kernel ms | GB/s (read + write) | matches |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    # matches: to kernel order equal to TokenLayout.to_kernel's, and back equal to its inverse
    for r in results:
        for name, e in r["ways"].items():
            to_ms, from_ms = e["to_kernel"]["median_ms"], e["from_kernel"]["median_ms"]
            rate = 2 * r["tensor_mb"] * 2**20 / (to_ms * 1e-3) / 1e9
            lines.append(
                f"| {r['spec']} | {r['tensor_mb']} | {name} | {to_ms:.3f} | {from_ms:.3f} | "
                f"{rate:.0f} | {e.get('matches', '-')} / {e.get('inverse_matches', '-')} |"
            )
    return lines


def _axes(text: str):
    from svgen.core.layout import AxisOrder

    try:
        return AxisOrder(tuple(text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: an order of f, h and w, such as f,w,h"
        ) from None


def _cube(text: str) -> tuple[int, int, int]:
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 3 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: three positive sizes F,H,W, such as 3,5,8")
    return sizes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="+", type=pathlib.Path, metavar="SPEC")
    parser.add_argument("--order", action="append", default=[], type=_axes, help="such as f,w,h")
    parser.add_argument("--cube", action="append", default=[], type=_cube, help="such as 3,5,8")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--target", default=None, help="the chip to compile for (--interpret only)")
    parser.add_argument("--interpret", action="store_true")
    args = parser.parse_args(argv)
    chip = chip_bench.script_chip("permute_on_chip", args.interpret, args.target)
    if chip is None:
        return 2
    options = chip_bench.Options(iters=args.iters, interpret=args.interpret)
    progress = chip_bench.script_progress("permute_on_chip")
    report = chip_bench.script_report(chip, args.interpret)
    specs = [load_spec(p, chip=chip) for p in args.specs]
    layouts = [(s.name, spec_layout(s, chip), s) for s in specs]
    layouts += [
        (name, lay, specs[0]) for name, lay in other_layouts(specs[0], args.order, args.cube)
    ]
    report["results"] = [bench_layout(name, lay, s, options, progress) for name, lay, s in layouts]
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print("\n".join(table(report["results"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
