"""A digest of every kernel a spec's module traces: what a refactor of the kernels must leave
unchanged, checked on this host (no TPU, no libtpu compile).

    python -m svgen.chip.kernel_fingerprint SPEC... [--target v5e] [--json FILE] [--compare FILE]

For each spec the module is compiled into a temporary folder and its calls are traced with
jax.make_jaxpr: the forward call (with the spec's run-time inputs, traced, where it has
them), jax.grad through it (with dq fused into the dk/dv walk, and in its own kernel), a
KV-cache chunk's call and its gradient (specs with a KV cache) and `softmax_modes` (`softmax:
bounded`). Each Pallas kernel of a trace (svgen's
kernels, the permute kernel, a selection's programs) is one line: its name and the sha256 of
its kernel jaxpr with its parameters (grid, block specs, compiler parameters), source
locations removed. Two trees whose digests agree lower the same kernels to Mosaic, so their
chip times are the same: a pure restructuring of svgen.runtime proves itself this way
(record the digests before, compare after), and a kernel change shows which kernels it
touched.

What `svgen bench` times (its fixed head assignment, kernel order, the tables' contents and
the XLA ops around the kernels) is fingerprinted by svgen.chip.fingerprint, which this module
shares its kernel digests with: `svgen fingerprint --check`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

from svgen.chip.fingerprint import pallas_kernels


def _calls(module):
    """(call name, function, argument shapes) of every call the module supports."""
    import jax
    import jax.numpy as jnp

    attention = module.attention
    heads, seq, d = int(module.HEADS), int(module.SEQ_LEN), int(module.HEAD_DIM)
    dtype = jnp.dtype(module.DTYPE)
    qkv = jax.ShapeDtypeStruct((heads, seq, d), dtype)
    hp = jax.ShapeDtypeStruct((heads,), jnp.int32)
    names = attention.runtime.arguments()
    runtime_shapes = {"segment_ids": (seq,), "text_lengths": ()}
    runtime = tuple(jax.ShapeDtypeStruct(runtime_shapes[n], jnp.int32) for n in names)

    def forward(q, k, v, hp, *ids):
        return attention(q, k, v, head_pattern=hp, **dict(zip(names, ids)))

    def loss(q, k, v, hp, *ids):
        return jnp.sum(forward(q, k, v, hp, *ids).astype(jnp.float32))

    yield "forward", forward, (qkv, qkv, qkv, hp, *runtime)
    grad = jax.grad(loss, argnums=(0, 1, 2))
    yield "grad", grad, (qkv, qkv, qkv, hp, *runtime)

    def grad_unfused(*args):  # the dq kernel of its own (backward.FUSED_DQ, read when traced)
        from svgen.runtime import backward

        fused, backward.FUSED_DQ = backward.FUSED_DQ, False
        try:
            return grad(*args)
        finally:
            backward.FUSED_DQ = fused

    yield "grad, dq unfused", grad_unfused, (qkv, qkv, qkv, hp, *runtime)
    if attention.kv_cache is not None:
        chunk = attention.chunk_shape
        rows = attention.kv_cache.rows
        q_chunk = jax.ShapeDtypeStruct((heads, rows, d), dtype)
        kv = jax.ShapeDtypeStruct((heads, chunk.seq_len, d), dtype)
        offset = jax.ShapeDtypeStruct((), jnp.int32)

        def chunk_call(q, k, v, f):
            return attention(q, k, v, q_frame_offset=f)

        def chunk_loss(q, k, v, f):
            return jnp.sum(chunk_call(q, k, v, f).astype(jnp.float32))

        yield "chunk", chunk_call, (q_chunk, kv, kv, offset)
        yield "chunk grad", jax.grad(chunk_loss, argnums=(0, 1, 2)), (q_chunk, kv, kv, offset)
    if module.SHAPE.bounded_softmax:

        def modes(q, k, v, hp):
            return attention.softmax_modes(q, k, v, head_pattern=hp)

        yield "softmax_modes", modes, (qkv, qkv, qkv, hp)


def fingerprint(spec, target: str) -> dict[str, list[tuple[str, str]]]:
    """Per call of the spec's module, its kernels' (name, digest)."""
    import jax

    from svgen.chip import chip_bench

    with tempfile.TemporaryDirectory(prefix="svgen-fingerprint-") as folder:
        _, module = chip_bench.compile_module(spec, target, pathlib.Path(folder))
        return {
            call: pallas_kernels(jax.make_jaxpr(function)(*args))
            for call, function, args in _calls(module)
        }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="+", type=pathlib.Path, metavar="SPEC")
    parser.add_argument("--target", default="v5e", choices=("v5e", "v6e", "v7x"))
    parser.add_argument("--json", type=pathlib.Path, help="also write the digests here")
    parser.add_argument(
        "--compare",
        type=pathlib.Path,
        help="a --json file of an earlier tree: list every kernel whose digest differs, exit 1",
    )
    args = parser.parse_args(argv)

    from svgen.spec import load_spec

    report = {}
    print("| spec | call | kernel | digest |")
    print("|---|---|---|---|")
    for path in args.specs:
        spec = load_spec(path, chip=args.target)
        calls = fingerprint(spec, args.target)
        report[str(path)] = calls
        for call, kernels in calls.items():
            for name, digest in kernels:
                print(f"| {spec.name} | {call} | {name} | {digest} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    if args.compare:
        changed = differences(json.loads(args.compare.read_text()), report)
        for line in changed:
            print(f"kernel_fingerprint: {line}", file=sys.stderr)
        print(
            f"kernel_fingerprint: {len(changed)} difference(s) from {args.compare}",
            file=sys.stderr,
        )
        return 1 if changed else 0
    return 0


def differences(before: dict, after: dict) -> list[str]:
    """Each spec of `after` and call whose kernels (names and digests, in order) differ from
    `before`'s, or that only one of the two has (JSON turns the (name, digest) pairs into
    lists: compared as such). Specs `after` did not trace are not compared."""
    lines = []
    for spec in sorted(after):
        old, new = before.get(spec, {}), after.get(spec, {})
        for call in sorted(set(old) | set(new)):
            a = [list(k) for k in old.get(call, [])]
            b = [list(k) for k in new.get(call, [])]
            if a != b:
                lines.append(f"{spec} {call}: {a} -> {b}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
