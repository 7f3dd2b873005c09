"""svgen's run-time features on the attached TPU, each against what a user would run instead,
in one process.

    python -m svgen.chip.runtime_features [--chunks SPEC] [--packed SPEC --videos N]
        [--select SPEC] [--selected SPEC] [--orders SPEC [--backward]] [--positions P,...]
        [--blocks BQ,BKV,BKVC] [--iters N] [--json FILE]
        [--target CHIP] [--interpret]

--chunks SPEC (a spec with `runtime.kv_cache` on a contiguous cache): one chunk step of
Self-Forcing-style generation per chunk position, the chunk's queries against the keys of
the whole video: svgen's chunked call (`attention(q_chunk, k, v, q_frame_offset=...)`)
against Splash given the same rectangular mask (the chunk's rows against every key, the
module's own mask function, block-causal rule included) and dense Splash on the same
rectangle.

--packed SPEC (a spec with `runtime.segments`): a batch of N videos packed into one sequence
(contiguous segments of equal length): svgen's call with `segment_ids` against Splash given
the spec's mask with Splash's own segment ids, and dense Splash with segment ids.

--select SPEC (a spec with `select`): svgen's call, which chooses blocks from q and k and runs
them, against what a user can give Splash ahead of time: the superset of every choice (the
mask and every block the candidate region lets a call choose), and dense Splash. Outputs
differ by design (Splash runs more pairs): not compared.

--selected SPEC (a spec with `select` whose patterns share one layout; `heads:` taken, and
`runtime.segments` for frame-major specs, then --videos N packed videos of equal length;
another layout runs both kernels in its order, `token_order="kernel"`): svgen's call,
forward and forward + backward, against Splash given, per head, the mask that very call
selected (built after the call from `return_selection=True`: what Splash would need ahead of
time to run the same pairs; with the same segment ids). Outputs compared.

--orders SPEC (a spec whose heads are not all frame-major: a one-pattern spec with an axis
order such as `{order: [w, h, f]}`, or heads of several layouts): its call in the user's token
order (the permutation into the kernel's order and back included), in the kernel's order
(`token_order="kernel"`: none), and, for a one-pattern spec, the same mask compiled
frame-major. The share of the call the permutation takes is what issue 45's <= 5 % target is
about. Where the kernels read their tiles from the user's order (box DMA, or one call per run
of heads of one layout; svgen.runtime.cube), the same call is timed once more with the tokens
moved around the kernel instead (the wrapper's permutation), its output compared too. With
--backward every call is timed forward + backward too (the gradient of sum(o) in q, k, v),
and where the kernel reads place boxes, once more with only the forward reading them (the
backward moving its operands into kernel order, svgen.runtime.kernel.BOX_BACKWARD = False).
Outputs of the user-order call and the frame-major one are compared (equal unless the mask
counts positions in its order: band, prefix, i_q / i_k).

Each row: the median of --iters calls after two warm-ups (first calls timed alone); svgen's
output and Splash's (given the same mask) compared on every row. A table goes to stdout;
--json keeps every figure with the chip, versions, commit and source digest. Without a TPU
it stops with one line (exit 2), unless --interpret (Pallas's interpreter on the CPU: checks
the script, times nothing that means anything).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

import numpy as np

from svgen.chip import chip_bench, splash_peer
from svgen.chip.splash_mask import PackedKeep, make_splash, packed_keep, pattern_keep
from svgen.spec import load_spec


# ----------------------------------------------------------------------------- masks
def superset_keep_bits(module, padded: int) -> np.ndarray:
    """uint8 [padded, padded / 8]: a selection module's mask or any block its candidate region
    lets a call choose (kernel order, bit-packed along keys; padding keeps nothing)."""
    import jax.numpy as jnp
    from jax import lax

    attention, seq = module.attention, int(module.SEQ_LEN)
    shape, mask = attention.shape, pattern_keep(attention.patterns[0])
    selectable = jnp.asarray(attention.select.selectable)

    def keep(q_pos, k_pos):
        chosen = selectable[lax.div(q_pos, shape.cq), lax.div(k_pos, shape.ckv)]
        return mask(q_pos, k_pos) | chosen

    return packed_keep(keep, 0, seq, seq, (padded, padded))


def _multiple(n: int, step: int) -> int:
    return -(-n // step) * step


# ----------------------------------------------------------------------------- timing
def _splash_fn(mask_lib, masks, blocks, interpret, rows, keys, scale, segments=None):
    """A jitted Splash call on [heads, rows, d] queries against [heads, keys, d] keys: pads
    both to the mask's shape, scales q, drops the padding rows."""
    import jax
    import jax.numpy as jnp

    kernel = make_splash(mask_lib.MultiHeadMask(masks), blocks, False, interpret)
    padded_rows, padded_keys = masks[0].shape

    def call(q, k, v):
        q = splash_peer.pad_tokens(q * jnp.asarray(scale, q.dtype), padded_rows)
        k, v = (splash_peer.pad_tokens(x, padded_keys) for x in (k, v))
        out = kernel(q, k, v) if segments is None else kernel(q, k, v, segment_ids=segments)
        return out[:, :rows]

    return jax.jit(call)


def _time(fn, args, options, progress, label) -> tuple[dict, object]:
    progress(label)
    try:
        timing, out = chip_bench.time_calls(
            fn, args, warmup=options.warmup, iters=options.iters, clock=time.perf_counter
        )
    except Exception as exc:  # a kernel that does not compile or run: recorded, not fatal
        return {"error": chip_bench._short(exc)}, None
    return timing.to_json(), out


def _difference(a, b) -> float | None:
    if a is None or b is None:
        return None
    a, b = (np.asarray(x, np.float32) for x in (a, b))
    return float(np.max(np.abs(a - b)))


# ----------------------------------------------------------------------------- chunks
def bench_chunks(spec, chip, options, positions, blocks, progress) -> dict:
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    with tempfile.TemporaryDirectory(prefix="runtime-on-chip-") as folder:
        plan, module = chip_bench.compile_module(spec, chip, pathlib.Path(folder))
        attention = module.attention
        kv_cache = attention.kv_cache
        if kv_cache is None or kv_cache.ring_sink is not None:
            raise SystemExit(f"{spec.name}: --chunks takes a spec with a contiguous KV cache")
        if not plan.layout.is_identity:
            raise SystemExit(f"{spec.name}: --chunks takes a frame-major spec (token order)")
        q, k, v = chip_bench.draw_inputs(module, options.seed)
        rows, seq = kv_cache.rows, int(module.SEQ_LEN)
        frames = plan.spec.runtime.chunk_frames
        scale = 1.0 / float(np.sqrt(int(module.HEAD_DIM)))
        shape = (_multiple(rows, blocks[0]), _multiple(seq, int(np.lcm(blocks[1], blocks[2]))))
        pattern = attention.patterns[0]
        chunks = []
        for position in positions:
            first = position * rows
            q_chunk = q[:, first : first + rows]
            entry = {"position": position, "rows": rows, "keys": seq}
            svgen_fn = jax.jit(
                lambda q, k, v, f=position * frames: attention(
                    q, k, v, q_frame_offset=f, interpret=options.interpret
                )
            )
            entry["svgen"], mine = _time(
                svgen_fn, (q_chunk, k, v), options, progress, f"chunk {position}: svgen"
            )
            bits = packed_keep(pattern_keep(pattern), first, rows, seq, shape)
            keep = PackedKeep(f"chunk {position}", bits, shape[1])
            masks = [keep] * int(module.HEADS)
            splash = _splash_fn(mask_lib, masks, blocks, options.interpret, rows, seq, scale)
            entry["splash_mask"], theirs = _time(
                splash, (q_chunk, k, v), options, progress, f"chunk {position}: Splash, mask"
            )
            entry["max_difference"] = _difference(mine, theirs)
            full = [mask_lib.FullMask(shape)] * int(module.HEADS)
            dense = _splash_fn(mask_lib, full, blocks, options.interpret, rows, seq, scale)
            entry["splash_dense"], _ = _time(
                dense, (q_chunk, k, v), options, progress, f"chunk {position}: Splash, dense"
            )
            entry["kept_fraction"] = float(np.unpackbits(bits).mean() * np.prod(shape))
            entry["kept_fraction"] /= rows * seq
            chunks.append(entry)
            del q_chunk, mine, theirs
        return {"spec": spec.name, "kind": "chunks", "blocks": list(blocks), "chunks": chunks}


# ----------------------------------------------------------------------------- packed
def bench_packed(spec, chip, options, videos: int, blocks, progress) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    from svgen.chip import splash_mask

    with tempfile.TemporaryDirectory(prefix="runtime-on-chip-") as folder:
        plan, module = chip_bench.compile_module(spec, chip, pathlib.Path(folder))
        if "segment_ids" not in module.attention.runtime.arguments():
            raise SystemExit(f"{spec.name}: --packed takes a spec with runtime.segments")
        if len(plan.patterns) != 1 or not plan.layout.is_identity:
            raise SystemExit(f"{spec.name}: --packed takes one frame-major pattern")
        q, k, v = chip_bench.draw_inputs(module, options.seed)
        seq, heads = int(module.SEQ_LEN), int(module.HEADS)
        ids = np.minimum(np.arange(seq) * videos // seq, videos - 1).astype(np.int32)
        scale = 1.0 / float(np.sqrt(int(module.HEAD_DIM)))
        padded = splash_mask.padded_length(seq, *blocks)
        # Padding tokens: a segment of their own, whose keys no real query sees.
        padded_ids = jnp.asarray(np.concatenate([ids, np.full(padded - seq, videos, np.int32)]))
        segments = sk.SegmentIds(q=padded_ids, kv=padded_ids)
        result = {"spec": spec.name, "kind": "packed", "videos": videos, "tokens": seq}
        result["blocks"] = list(blocks)
        svgen_fn = jax.jit(
            lambda q, k, v: module.attention(q, k, v, segment_ids=ids, interpret=options.interpret)
        )
        result["svgen"], mine = _time(svgen_fn, (q, k, v), options, progress, "packed: svgen")
        masks = list(splash_mask.splash_mask(module, padded, (0,) * heads).masks)
        splash = _splash_fn(mask_lib, masks, blocks, options.interpret, seq, seq, scale, segments)
        result["splash_mask"], theirs = _time(
            splash, (q, k, v), options, progress, "packed: Splash, mask + segment ids"
        )
        result["max_difference"] = _difference(mine, theirs)
        full = [mask_lib.FullMask((padded, padded))] * heads
        dense = _splash_fn(mask_lib, full, blocks, options.interpret, seq, seq, scale, segments)
        result["splash_dense"], _ = _time(
            dense, (q, k, v), options, progress, "packed: Splash, dense + segment ids"
        )
        return result


# ----------------------------------------------------------------------------- select
def bench_select(spec, chip, options, blocks, progress) -> dict:
    import jax
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    from svgen.chip import splash_mask

    with tempfile.TemporaryDirectory(prefix="runtime-on-chip-") as folder:
        plan, module = chip_bench.compile_module(spec, chip, pathlib.Path(folder))
        if module.attention.select is None or not plan.layout.is_identity:
            raise SystemExit(f"{spec.name}: --select takes a frame-major spec with `select`")
        q, k, v = chip_bench.draw_inputs(module, options.seed)
        seq, heads = int(module.SEQ_LEN), int(module.HEADS)
        scale = 1.0 / float(np.sqrt(int(module.HEAD_DIM)))
        padded = splash_mask.padded_length(seq, *blocks)
        result = {"spec": spec.name, "kind": "select", "blocks": list(blocks)}
        svgen_fn = jax.jit(lambda q, k, v: module.attention(q, k, v, interpret=options.interpret))
        result["svgen"], _ = _time(svgen_fn, (q, k, v), options, progress, "select: svgen")
        bits = superset_keep_bits(module, padded)
        result["superset_kept_fraction"] = float(np.unpackbits(bits).mean()) * padded**2 / seq**2
        masks = [PackedKeep("select superset", bits)] * heads
        splash = _splash_fn(mask_lib, masks, blocks, options.interpret, seq, seq, scale)
        result["splash_mask"], _ = _time(
            splash, (q, k, v), options, progress, "select: Splash, the superset of choices"
        )
        full = [mask_lib.FullMask((padded, padded))] * heads
        dense = _splash_fn(mask_lib, full, blocks, options.interpret, seq, seq, scale)
        result["splash_dense"], _ = _time(
            dense, (q, k, v), options, progress, "select: Splash, dense"
        )
        result["max_difference"] = None  # different pairs by design
        return result


# ----------------------------------------------------------------------------- selected
def selected_keep_bits(module, pattern: int, chosen, padded: int) -> np.ndarray:
    """uint8 [padded, padded / 8]: one head's mask (pattern `pattern`) or the blocks its
    call chose (bool [row blocks, column blocks]), kernel order, bit-packed along keys."""
    import jax.numpy as jnp
    from jax import lax

    attention, seq = module.attention, int(module.SEQ_LEN)
    shape, mask = attention.shape, pattern_keep(attention.patterns[pattern])
    chosen = jnp.asarray(chosen)

    def keep(q_pos, k_pos):
        return mask(q_pos, k_pos) | chosen[lax.div(q_pos, shape.cq), lax.div(k_pos, shape.ckv)]

    return packed_keep(keep, 0, seq, seq, (padded, padded))


def bench_selected(spec, chip, options, videos: int, blocks, progress) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    from svgen.chip import splash_mask

    with tempfile.TemporaryDirectory(prefix="runtime-on-chip-") as folder:
        plan, module = chip_bench.compile_module(spec, chip, pathlib.Path(folder))
        attention = module.attention
        if attention.select is None or len(attention.layouts) != 1:
            raise SystemExit(f"{spec.name}: --selected takes a spec with `select`, one layout")
        q, k, v = chip_bench.draw_inputs(module, options.seed)
        seq, heads = int(module.SEQ_LEN), int(module.HEADS)
        scale = 1.0 / float(np.sqrt(int(module.HEAD_DIM)))
        padded = splash_mask.padded_length(seq, *blocks)
        kwargs, segments = {}, None
        result = {"spec": spec.name, "kind": "selected", "blocks": list(blocks), "videos": 1}
        packed = "segment_ids" in attention.runtime.arguments()
        if not attention.layouts[0].is_identity:
            if packed:
                raise SystemExit(f"{spec.name}: --selected packs frame-major specs only")
            # Both kernels in the layout's order: q, k, v moved once, before any timing.
            q, k, v = (attention.to_kernel_order(x) for x in (q, k, v))
            kwargs["token_order"] = "kernel"
        if packed:
            ids = np.minimum(np.arange(seq) * videos // seq, videos - 1).astype(np.int32)
            kwargs["segment_ids"] = jnp.asarray(ids)
            padded_ids = np.concatenate([ids, np.full(padded - seq, videos, np.int32)])
            segments = sk.SegmentIds(q=jnp.asarray(padded_ids), kv=jnp.asarray(padded_ids))
            result["videos"] = videos
        interpret = options.interpret

        def call(q, k, v):
            return attention(q, k, v, interpret=interpret, **kwargs)

        result["svgen"], mine = _time(jax.jit(call), (q, k, v), options, progress, "svgen")
        loss = jax.jit(
            jax.grad(lambda q, k, v: jnp.sum(call(q, k, v).astype(jnp.float32)), (0, 1, 2))
        )
        result["svgen_backward"], _ = _time(
            loss, (q, k, v), options, progress, "svgen, forward + backward"
        )
        _, selected = jax.jit(
            lambda q, k, v: attention(q, k, v, interpret=interpret, return_selection=True, **kwargs)
        )(q, k, v)
        selected = np.asarray(selected.blocks if hasattr(selected, "blocks") else selected)
        patterns = getattr(module, "HEAD_PATTERN", (0,) * heads)
        result["head_patterns"] = [int(p) for p in patterns]
        result["chosen_blocks"] = [int(x) for x in selected.reshape(heads, -1).sum(axis=1)]
        progress("Splash's masks: the blocks each head chose")
        start = time.perf_counter()
        masks = [
            PackedKeep(
                f"head {h}", selected_keep_bits(module, int(patterns[h]), selected[h], padded)
            )
            for h in range(heads)
        ]
        kept = [float(np.unpackbits(m.bits).mean()) * padded**2 / seq**2 for m in masks]
        result["kept_fraction"] = kept
        result["mask_build_s"] = time.perf_counter() - start
        splash = _splash_fn(mask_lib, masks, blocks, interpret, seq, seq, scale, segments)
        result["splash_mask"], theirs = _time(
            splash, (q, k, v), options, progress, "Splash, the mask each head chose"
        )
        result["max_difference"] = _difference(mine, theirs)
        full = [mask_lib.FullMask((padded, padded))] * heads
        dense = _splash_fn(mask_lib, full, blocks, interpret, seq, seq, scale, segments)
        result["splash_dense"], _ = _time(dense, (q, k, v), options, progress, "Splash, dense")
        return result


# ----------------------------------------------------------------------------- orders
def bench_orders(spec, chip, options, progress, backward: bool = False) -> dict:
    import dataclasses

    import jax
    import jax.numpy as jnp

    from svgen.core.layout import FRAME_MAJOR
    from svgen.runtime import kernel as tpu_kernel

    if spec.mask is not None and spec.layout == FRAME_MAJOR:
        raise SystemExit(f"{spec.name}: --orders takes a spec with heads in another order")
    with tempfile.TemporaryDirectory(prefix="runtime-on-chip-") as folder:
        plan, module = chip_bench.compile_module(spec, chip, pathlib.Path(folder) / "order")
        plain = None  # the same mask frame-major: one-pattern specs only
        if spec.mask is not None:
            plain_spec = dataclasses.replace(spec, layout=FRAME_MAJOR)
            _, plain = chip_bench.compile_module(plain_spec, chip, pathlib.Path(folder) / "plain")
        if len(module.attention.layouts) < 2 and module.attention.layouts[0].is_identity:
            raise SystemExit(f"{spec.name}: --orders takes a spec with heads in another order")
        q, k, v = chip_bench.draw_inputs(module, options.seed)
        interpret = options.interpret

        def call(attention, **kw):
            return jax.jit(lambda q, k, v: attention(q, k, v, interpret=interpret, **kw))

        def step(attention, **kw):  # forward + backward: the gradient of sum(o)
            def loss(q, k, v):
                o = attention(q, k, v, interpret=interpret, **kw)
                return jnp.sum(o.astype(jnp.float32))

            return jax.jit(jax.grad(loss, (0, 1, 2)))

        def both(name, attention, label, **kw):
            result[name], out = _time(call(attention, **kw), (q, k, v), options, progress, label)
            if backward:
                result[name + "_backward"], _ = _time(
                    step(attention, **kw), (q, k, v), options, progress, label + ", fwd + bwd"
                )
            return out

        attention = module.attention
        layouts = " / ".join(dict.fromkeys(_layout_words(lay) for lay in attention.layouts))
        result = {"spec": spec.name, "kind": "orders", "layout": layouts}
        mine = both("user_order", attention, "orders: user order")
        boxes = attention.cube_dma
        runs = attention._head_runs(np.asarray(getattr(module, "HEAD_PATTERN", ())))
        if boxes is not None or runs is not None:  # the tokens moved around the kernel instead
            result["box_dma"] = type(boxes).__name__ if runs is None else f"{len(runs)} head runs"
            if backward:  # the forward reading boxes, the backward moving its operands
                tpu_kernel.BOX_BACKWARD = False
                try:
                    result["user_order_backward_moved"], _ = _time(
                        step(module.attention),
                        (q, k, v),
                        options,
                        progress,
                        "orders: backward moved, fwd + bwd",
                    )
                finally:
                    tpu_kernel.BOX_BACKWARD = True
            layout_boxes = attention.layout_boxes
            attention.cube_dma, attention.layout_boxes = None, (None,) * len(layout_boxes)
            try:
                moved = both("user_order_moved", attention, "orders: moved")
            finally:
                attention.cube_dma, attention.layout_boxes = boxes, layout_boxes
            result["moved_difference"] = _difference(mine, moved)
        both("kernel_order", attention, "orders: kernel order", token_order="kernel")
        result["max_difference"] = None
        if plain is not None:
            theirs = both("frame_major", plain.attention, "orders: frame-major")
            result["max_difference"] = _difference(mine, theirs)
        return result


def _layout_words(layout) -> str:
    words = layout.order + (" of the transposed frame" if layout.transposed else "")
    if layout.is_tiled:
        words += " {}x{}x{}".format(*layout.cube)
    if layout.curve:
        words += f", {layout.curve} curve in each frame"
    return words


def orders_table(results: list[dict]) -> list[str]:
    lines = [
        "| spec | layout | user order ms | kernel order ms | permutation share | "
        "tokens moved instead ms | frame-major ms | user order / frame-major | max diff |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        user, plain = (r.get(k, {}).get("median_ms") for k in ("user_order", "frame_major"))
        versus = f"{user / plain:.2f}x" if user and plain else "-"
        diff = "-" if r["max_difference"] is None else f"{r['max_difference']:.1e}"
        cells = [_cell(r, k) for k in ("user_order", "kernel_order")]
        cells += [_share(r, ""), _cell(r, "user_order_moved"), _cell(r, "frame_major")]
        lines.append(f"| {r['spec']} | {r['layout']} | {' | '.join(cells)} | {versus} | {diff} |")
    return lines


def _cell(result: dict, key: str) -> str:
    return _ms(result[key]) if key in result else "-"


def _share(result: dict, suffix: str) -> str:
    """The permutation's share of the user-order call (suffix "_backward": of the step)."""
    user, kernel = (result[k + suffix].get("median_ms") for k in ("user_order", "kernel_order"))
    return f"{(user - kernel) / user:.1%}" if user and kernel else "-"


def orders_backward_table(results: list[dict]) -> list[str]:
    """Forward + backward of the --orders calls, where --backward timed them."""
    lines = [
        "| spec | user order ms | kernel order ms | permutation share | backward moved ms | "
        "all moved ms | frame-major ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "user_order_backward" not in r:
            continue
        keys = ("user_order_backward_moved", "user_order_moved_backward", "frame_major_backward")
        cells = [_cell(r, "user_order_backward"), _cell(r, "kernel_order_backward")]
        cells += [_share(r, "_backward"), *(_cell(r, k) for k in keys)]
        lines.append(f"| {r['spec']} | {' | '.join(cells)} |")
    return lines


# ----------------------------------------------------------------------------- the table
def _ms(entry: dict) -> str:
    return f"{entry['median_ms']:.2f}" if "median_ms" in entry else "failed"


def _ratio(theirs: dict, mine: dict) -> str:
    if "median_ms" not in theirs or "median_ms" not in mine:
        return "-"
    return f"{theirs['median_ms'] / mine['median_ms']:.2f}x"


def table(results: list[dict]) -> list[str]:
    lines = [
        "| spec | call | svgen ms | Splash, same mask ms | Splash, dense ms | vs same mask | vs dense | max diff |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r["kind"] == "orders":  # a table of its own (orders_table)
            continue
        if r["kind"] == "chunks":
            calls = [(f"chunk {c['position']}", c) for c in r["chunks"]]
        elif r["kind"] == "packed":
            calls = [(f"{r['videos']} videos packed", r)]
        elif r["kind"] == "selected":  # Splash's column: the mask the call chose
            calls = [(f"selected ({r['videos']} video(s))", r)]
        else:  # Splash's column: the superset of every choice
            calls = [("select (Splash: superset)", r)]
        for name, c in calls:
            diff = "-" if c["max_difference"] is None else f"{c['max_difference']:.1e}"
            lines.append(
                f"| {r['spec']} | {name} | {_ms(c['svgen'])} | {_ms(c['splash_mask'])} | "
                f"{_ms(c['splash_dense'])} | {_ratio(c['splash_mask'], c['svgen'])} | "
                f"{_ratio(c['splash_dense'], c['svgen'])} | {diff} |"
            )
    return lines


def _blocks(text: str) -> tuple[int, int, int]:
    try:
        blocks = tuple(int(x) for x in text.split(","))
    except ValueError:
        blocks = ()
    if len(blocks) != 3 or any(b < 128 or b % 128 for b in blocks):
        raise argparse.ArgumentTypeError(f"expected BQ,BKV,BKVC, multiples of 128, got {text!r}")
    return blocks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=pathlib.Path)
    parser.add_argument("--packed", type=pathlib.Path)
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--select", type=pathlib.Path)
    parser.add_argument("--selected", type=pathlib.Path)
    parser.add_argument("--orders", type=pathlib.Path)
    parser.add_argument(
        "--backward", action="store_true", help="--orders: time forward + backward too"
    )
    parser.add_argument("--positions", help="chunk positions, comma-separated (default: all)")
    parser.add_argument(
        "--blocks",
        type=_blocks,
        default=(1024, 1024, 512),
        help="Splash's block_q,block_kv,block_kv_compute (default: svgen bench's for a mask)",
    )
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--target", default=None, help="the chip to compile for (--interpret only)")
    parser.add_argument("--interpret", action="store_true")
    args = parser.parse_args(argv)
    given = (args.chunks, args.packed, args.select, args.selected, args.orders)
    if all(x is None for x in given):
        parser.error(
            "nothing to time: give --chunks, --packed, --select, --selected or --orders SPEC"
        )
    if args.videos < 1:
        parser.error("--videos must be at least 1")
    chip = chip_bench.script_chip("runtime_features", args.interpret, args.target)
    if chip is None:
        return 2
    options = chip_bench.Options(iters=args.iters, interpret=args.interpret)
    progress = chip_bench.script_progress("runtime_features")
    report = chip_bench.script_report(chip, args.interpret)
    report["results"] = []

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")

    if args.chunks is not None:
        spec = load_spec(args.chunks, chip=chip)
        count = spec.geometry.frames // spec.runtime.chunk_frames
        positions = (
            range(count) if args.positions is None else [int(p) for p in args.positions.split(",")]
        )
        if any(not 0 <= p < count for p in positions):
            parser.error(f"--positions: {spec.name} has chunk positions 0 .. {count - 1}")
        chunks = bench_chunks(spec, chip, options, list(positions), args.blocks, progress)
        report["results"].append(chunks)
        save()
    if args.packed is not None:
        spec = load_spec(args.packed, chip=chip)
        packed = bench_packed(spec, chip, options, args.videos, args.blocks, progress)
        report["results"].append(packed)
        save()
    if args.select is not None:
        spec = load_spec(args.select, chip=chip)
        report["results"].append(bench_select(spec, chip, options, args.blocks, progress))
        save()
    if args.selected is not None:
        spec = load_spec(args.selected, chip=chip)
        selected = bench_selected(spec, chip, options, args.videos, args.blocks, progress)
        report["results"].append(selected)
        save()
    if args.orders is not None:
        spec = load_spec(args.orders, chip=chip)
        report["results"].append(bench_orders(spec, chip, options, progress, args.backward))
        save()
    others = [r for r in report["results"] if r["kind"] != "orders"]
    if others:
        print("\n".join(table(others)))
    orders = [r for r in report["results"] if r["kind"] == "orders"]
    if orders:
        print("\n".join(orders_table(orders)))
        if args.backward:
            print("\n".join(orders_backward_table(orders)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
