"""Timing generated kernels on an attached TPU, beside Splash Attention in the same process:
the engine of `svgen bench` and `svgen tune --measure`.

For one spec and one tiling, `bench_spec`:

1. compiles the spec for the chip (svgen.analysis + svgen.codegen, into a temporary folder)
   and imports the module;
2. draws q, k, v (normal, the spec's dtype, [heads, seq, head_dim], each head already in its
   pattern's kernel order, so no permutation is timed on either side);
3. times the module's forward call (and with `backward`, jax.grad of the outputs' sum
   through q, k, v): the first call (compile included) alone, then `warmup` calls, then the
   median of `iters` calls;
4. times Splash given the same mask at its best (svgen.chip.splash_peer: one call per
   pattern, inputs prepared outside the timed call, the faster of the mask as data and as
   computed, a small search of forward and backward blocks, the winner cached per chip), and
   dense Splash at the best of `DENSE_BLOCKS` (searched once per shape and process, and cached
   on disk per chip, jax and libtpu version), its inputs prepared alike;
5. checks svgen's and the masked Splash's outputs on `check_rows` sampled query rows of every
   head against a float32 reference on the same device, whose mask comes from the IR oracle
   (svgen.ir), not from the printed code both kernels' masks come from; for a spec with
   `attention.qk: int8`, also the cosine similarity and relative L1 of svgen's output on
   those rows, on normal inputs and on keys with channel outliers (svgen.chip.int8_error).

Everything a measurement depends on is injected: `clock` (a function returning seconds) and
`interpret` (Pallas's interpreter, for CPU tests), so the logic is tested without a chip;
speed is only ever measured on one (`attached_chip`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from svgen.core import safe_io
from svgen.core.program import ProgramLimits

# The float32 reference and what an output may differ from it (callers and tests reach them
# through this module).
from svgen.chip.output_check import (  # noqa: F401
    INT8_TOLERANCE,
    TOLERANCE,
    _reference_keep,
    int8_errors,
    max_error,
    reference_rows,
    sampled_rows,
    tolerance,
)

# Where a measurement ran (callers and tests reach them through this module).
from svgen.chip.provenance import commit, source_digest, versions  # noqa: F401

#: Splash's dense blocks searched (block_q, block_kv, block_kv_compute): its defaults and the
#: best measured on a v5e (docs/measured.md); 2048 x 2048 needs more than v5e's default
#: scoped VMEM and is recorded as infeasible there.
DENSE_BLOCKS = ((2048, 1024, 1024), (1024, 1024, 512), (1024, 1024, 1024), (512, 512, 512))
CHECK_ROWS = 256
#: device_kind prefixes -> svgen's target names.
CHIP_KINDS = (("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v6", "v6e"), ("TPU7x", "v7x"))


class NoChip(RuntimeError):
    """No TPU is attached (the message says what JAX sees instead)."""


def attached_chip() -> str:
    """svgen's name of the attached TPU (v5e, v6e, v7x); NoChip when there is none."""
    import jax

    # Where JAX_PLATFORMS names a platform this machine lacks (`tpu` without a TPU), JAX
    # starts no backend at all and says so with a RuntimeError, or with an AssertionError
    # where the platform's plugin is not even installed (`cuda` here): no TPU, either way.
    no_backend = (RuntimeError, AssertionError)
    try:
        devices = jax.devices("tpu")
    except no_backend:
        try:
            seen = ", ".join(sorted({d.platform for d in jax.devices()}))
        except no_backend:
            platforms = os.environ.get("JAX_PLATFORMS", "")
            seen = f"none: JAX_PLATFORMS={platforms!r} names a platform JAX could not start"
        raise NoChip(f"JAX sees no TPU here (its devices: {seen})") from None
    kind = devices[0].device_kind
    for prefix, name in CHIP_KINDS:
        if kind.startswith(prefix):
            return name
    raise NoChip(f"the attached TPU ({kind!r}) is not one svgen has a target for")


def script_chip(script: str, interpret: bool, target: str | None) -> str | None:
    """The chip a bench script times on: the attached TPU's, or with `interpret` (Pallas's
    interpreter on the CPU) `target` or v5e; None, after one line on stderr, without a TPU."""
    if interpret:
        return target or "v5e"
    try:
        return attached_chip()
    except NoChip as exc:
        print(f"{script}: no TPU attached ({exc})", file=sys.stderr)
        return None


def script_progress(script: str) -> Callable[[str], None]:
    """A bench script's progress printer: `script [  12.3 s] line` on stderr, seconds since
    this call."""
    start = time.monotonic()

    def progress(line: str) -> None:
        print(f"{script} [{time.monotonic() - start:6.1f} s] {line}", file=sys.stderr, flush=True)

    return progress


def script_report(chip: str, interpret: bool) -> dict:
    """What a bench script's JSON starts with: the chip, the commit, a digest of svgen's
    source and, on a chip, the versions (`versions`)."""
    report = {"chip": chip, "commit": commit(), "source_digest": source_digest()}
    report.update({} if interpret else versions())
    return report


# ----------------------------------------------------------------------------- timing
@dataclasses.dataclass(frozen=True)
class Timing:
    first_s: float  # the first call, tracing and compiling included
    median_s: float
    min_s: float
    runs: int

    def to_json(self) -> dict:
        return {
            "first_call_s": round(self.first_s, 3),
            "median_ms": round(self.median_s * 1e3, 3),
            "min_ms": round(self.min_s * 1e3, 3),
            "runs": self.runs,
        }


def time_calls(fn, args, *, warmup: int, iters: int, clock: Callable[[], float]):
    """(Timing, the first call's output): each call waited for with block_until_ready."""
    import jax

    start = clock()
    out = jax.block_until_ready(fn(*args))
    first = clock() - start
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = clock()
        jax.block_until_ready(fn(*args))
        times.append(clock() - start)
    return Timing(first, statistics.median(times), min(times), iters), out


@dataclasses.dataclass(frozen=True)
class Options:
    warmup: int = 2
    iters: int = 10
    backward: bool = False
    check_rows: int = CHECK_ROWS
    splash: bool = True  # time Splash beside svgen (tune --measure leaves it out)
    # Splash given the mask at these blocks alone; None: at its best (svgen.chip.splash_peer)
    splash_blocks: tuple[int, int, int] | None = None
    dense_blocks: tuple[tuple[int, int, int], ...] = DENSE_BLOCKS
    interpret: bool = False  # Pallas's interpreter: CPU tests only
    seed: int = 0
    fingerprint: bool = True  # record what was timed (svgen.chip.fingerprint)
    # What the module leaves out of its kernels (svgen.core.program): `svgen compile`
    # decides it by counting programs on the host; a chip host times what it is given.
    program: ProgramLimits = ProgramLimits()


# ----------------------------------------------------------------------------- the module
def compile_module(
    spec, target: str, folder: pathlib.Path, program: ProgramLimits = ProgramLimits()
):
    """(plan, imported module) of `spec` compiled for `target` into `folder`, with `program`'s
    code left out."""
    from svgen import codegen
    from svgen.analysis import analyze

    plan = dataclasses.replace(analyze(spec, target_name=target), program=program)
    folder.mkdir(parents=True, exist_ok=True)
    for filename, data in codegen.render(plan, spec.source).items():
        (folder / filename).write_bytes(data)
    path = folder / codegen.module_filename(spec.name, plan.backend)
    name = f"_svgen_bench_{spec.name}_{hashlib.sha256(str(folder).encode()).hexdigest()[:8]}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    loader_spec.loader.exec_module(module)
    return plan, module


def draw_inputs(module, seed: int):
    """q, k, v: normal [heads, seq, head_dim] in the module's dtype."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(seed), 3)
    shape = (int(module.HEADS), int(module.SEQ_LEN), int(module.HEAD_DIM))
    dtype = jnp.dtype(module.DTYPE)
    return tuple(jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys)


def svgen_forward(module, assignment, interpret: bool):
    import jax
    import numpy as np

    heads = np.asarray(assignment, np.int32)

    def forward(q, k, v):
        return module.attention(
            q, k, v, head_pattern=heads, token_order="kernel", interpret=interpret
        )

    return jax.jit(forward)


def timed_calls(module, assignment, interpret: bool) -> dict:
    """{direction: jitted function of q, k, v}: what `svgen bench` times, the forward and
    jax.grad through it (svgen.chip.fingerprint traces these same functions)."""
    forward = svgen_forward(module, assignment, interpret)
    return {"forward": forward, "backward": gradient_of(forward)}


def gradient_of(forward):
    """jax.grad of the f32 sum of `forward`'s output through q, k and v, jitted."""
    import jax
    import jax.numpy as jnp

    def loss(q, k, v):
        return jnp.sum(forward(q, k, v).astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


# ----------------------------------------------------------------------------- Splash
@dataclasses.dataclass
class SplashDense:
    """Dense Splash's best blocks per (chip, versions, shape, direction): searched in this
    process once, remembered on disk (a later process reuses the blocks, and re-times them)."""

    cache_dir: pathlib.Path | None
    found: dict = dataclasses.field(default_factory=dict)

    def _file(self) -> pathlib.Path | None:
        return None if self.cache_dir is None else self.cache_dir / "splash_dense.json"

    def _load(self) -> dict:
        path = self._file()
        found = None if path is None else safe_io.read_json_cache(path, _a_dict)
        return found or {}

    def _store(self, key: str, blocks) -> None:
        if self._file() is not None:
            safe_io.write_json_cache(self._file(), {**self._load(), key: list(blocks)}, indent=1)

    def best(
        self, key: str, candidates, time_blocks, progress, first_that_runs: bool = False
    ) -> dict:
        """{'blocks', 'timing', 'tried'}: the fastest of `candidates` (or the cached best,
        re-timed), time_blocks(blocks) -> Timing raising on a compile failure. One candidate
        (`svgen bench --dense-blocks`) is timed as given: no cache read, none written.
        first_that_runs: stop at the first candidate that runs (the backward: each of
        Splash's backward compiles costs tens of seconds of chip time)."""
        if key in self.found:
            return self.found[key]
        searching = len(candidates) > 1
        cached = self._load().get(key) if searching else None
        tried = []

        def run(order):
            for blocks in order:
                if first_that_runs and any("error" not in t for t in tried):
                    return
                progress(f"dense Splash {blocks[0]}/{blocks[1]}/{blocks[2]}")
                try:
                    timing = time_blocks(blocks)
                except Exception as exc:  # a candidate that does not compile is infeasible
                    tried.append({"blocks": list(blocks), "error": _short(exc)})
                    continue
                tried.append({"blocks": list(blocks), **timing.to_json(), "_t": timing})

        run([tuple(cached)] if cached else list(candidates))
        if cached and "error" in tried[0]:
            # Remembered blocks that fail now (another libtpu, another backward kernel):
            # search again rather than report dense Splash as unable to run.
            cached = None
            run([tuple(b) for b in candidates if list(b) != tried[0]["blocks"]])
        ok = [t for t in tried if "error" not in t]
        if not ok:
            result = {"blocks": None, "timing": None, "tried": _public(tried)}
        else:
            winner = min(ok, key=lambda t: t["_t"].median_s)
            result = {
                "blocks": tuple(winner["blocks"]),
                "timing": winner["_t"],
                "tried": _public(tried),
            }
            if not cached and searching:
                self._store(key, result["blocks"])
        self.found[key] = result
        return result


def _a_dict(value) -> dict:
    if not isinstance(value, dict):
        raise TypeError("not a JSON object")
    return value


def _public(tried):
    return [{k: v for k, v in t.items() if k != "_t"} for t in tried]


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    lines = [line for line in text if line.strip()]
    vmem = [line for line in lines if "vmem" in line.lower()]
    return (vmem or lines or ["(no message)"])[0][:300]


def cache_dir() -> pathlib.Path:
    base = os.environ.get("SVGEN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "svgen"
    )
    return pathlib.Path(base) / "bench"


# ----------------------------------------------------------------------------- one spec
def bench_spec(
    spec,
    target: str,
    options: Options,
    *,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[str], None] = lambda line: None,
    dense: SplashDense | None = None,
    env: dict | None = None,
    on_entry: Callable[[dict], None] = lambda result: None,
) -> dict:
    """Time `spec` (a loaded Spec, its tiling the one to time) on the default device; a JSON
    object of what was measured (see the module docstring). `env`: versions(), read here when
    not given (it keys the remembered dense Splash blocks: every caller must key them alike,
    or each process searches them again). on_entry(result): called with the result so far
    after each figure is recorded, so that a caller can save what a run stopped part way (a
    time limit, a chip that fails) had measured."""
    from svgen.chip.splash_mask import head_patterns

    env = versions() if env is None else env

    result: dict = {
        "spec": spec.name,
        "source": spec.source,
        "spec_digest": spec.digest,
        "target": target,
        "tiling": tiling_json(spec.tiling),
        "program": options.program.source(),
    }
    with tempfile.TemporaryDirectory(prefix="svgen-bench-") as folder:
        progress(f"{spec.name}: compile for {target}")
        plan, module = compile_module(spec, target, pathlib.Path(folder), options.program)
        assignment = head_patterns(module)
        result["head_patterns"] = [plan.patterns[p].name for p in assignment]
        q, k, v = draw_inputs(module, options.seed)
        rows = sampled_rows(int(module.SEQ_LEN), options.check_rows, options.seed)
        reference = None
        # A select spec chooses blocks per call: its output is not the mask's alone.
        checked = options.check_rows > 0 and spec.select is None
        if checked:
            reference = reference_rows(plan, assignment, q, k, v, rows)
        calls = timed_calls(module, assignment, options.interpret)
        directions = ["forward"] + (["backward"] if options.backward else [])
        if options.fingerprint:
            result["fingerprint"] = _fingerprint(module, assignment, directions)
        for direction in directions:
            fn = calls[direction]
            progress(f"{spec.name}: svgen {direction}")
            try:
                timing, out = time_calls(
                    fn, (q, k, v), warmup=options.warmup, iters=options.iters, clock=clock
                )
            except Exception as exc:
                result[f"svgen_{direction}"] = {"error": _short(exc)}
                on_entry(result)
                continue
            entry = timing.to_json()
            if direction == "backward":
                del out  # three sequence-long gradients: not kept while Splash runs
            if direction == "forward" and reference is not None:
                entry["max_error"] = max_error(out, reference, rows)
                entry["ok"] = entry["max_error"] <= tolerance(module)
                if module.SHAPE.qk_int8:  # cosine and relative L1 on both input kinds
                    out = None  # not kept beside the error inputs
                    entry["int8_error"] = int8_errors(module, plan, assignment, fn, rows, options)
                    entry["ok"] = entry["ok"] and all(e["ok"] for e in entry["int8_error"].values())
            result[f"svgen_{direction}"] = entry
            on_entry(result)
        out = None
        if options.splash:
            # On the host from here: Splash's peers put on the device only what they time
            # (its fused backward needs nearly all of a v5e's HBM at 75K tokens).
            qkv_host = tuple(np.asarray(x) for x in (q, k, v))
            del q, k, v
            _bench_splash(
                result,
                module,
                plan,
                assignment,
                qkv_host,
                rows,
                reference,
                options,
                clock,
                progress,
                dense or SplashDense(None),
                env or {},
                target,
                on_entry,
            )
    return result


def fingerprint_module(module, assignment, directions=("forward", "backward")) -> dict:
    """The fingerprint (svgen.chip.fingerprint) of what bench times for an imported module at
    `assignment`, per direction: the calls of a chip (not interpreted), on q, k, v's shapes."""
    import jax
    import jax.numpy as jnp

    from svgen.chip import fingerprint

    shape = (int(module.HEADS), int(module.SEQ_LEN), int(module.HEAD_DIM))
    qkv = jax.ShapeDtypeStruct(shape, jnp.dtype(module.DTYPE))
    calls = timed_calls(module, assignment, interpret=False)
    return fingerprint.of_calls({d: calls[d] for d in directions}, (qkv, qkv, qkv))


def fingerprint_spec(spec, target: str, directions=("forward", "backward")) -> dict:
    """fingerprint_module of the spec compiled as bench compiles it, with its tiling and
    head assignment (the form of bench/results/fingerprints.json)."""
    from svgen.chip.splash_mask import head_patterns

    with tempfile.TemporaryDirectory(prefix="svgen-fingerprint-") as folder:
        plan, module = compile_module(spec, target, pathlib.Path(folder))
        assignment = head_patterns(module)
        calls = fingerprint_module(module, assignment, directions)
    names = [plan.patterns[p].name for p in assignment]
    return {
        "spec": spec.name,
        "target": target,
        "tiling": tiling_json(spec.tiling),
        "head_patterns": names,
        **calls,
    }


def _fingerprint(module, assignment, directions) -> dict:
    try:  # a result is worth its figures without it: say why it could not be taken
        return fingerprint_module(module, assignment, directions)
    except Exception as exc:  # noqa: BLE001 - the timing goes on
        return {"error": _short(exc)}


def _bench_splash(
    result,
    module,
    plan,
    assignment,
    qkv,
    rows,
    reference,
    options,
    clock,
    progress,
    dense,
    env,
    target,
    on_entry,
):
    """Dense Splash at its best blocks, then Splash given the same mask at its best
    (svgen.chip.splash_peer), each direction; figures recorded as they come."""
    from svgen.chip import splash_peer

    seq, heads, d = int(module.SEQ_LEN), int(module.HEADS), int(module.HEAD_DIM)
    directions = ["forward"] + (["backward"] if options.backward else [])
    peer = splash_peer.Peer(module, plan, assignment, qkv, options.interpret)
    dense_peer = splash_peer.Peer(module, None, (0,) * heads, qkv, options.interpret, full=True)
    peer_cache = splash_peer.PeerCache(None if options.interpret else cache_dir())
    if options.splash_blocks is not None:  # `--splash-blocks`: those blocks, no search
        peer_cache = splash_peer.PeerCache(None)
    forward_winner = None
    for direction in directions:
        backward = direction == "backward"

        def time_dense(blocks, backward=backward):
            # Fused where it fits, else Splash's two backward kernels (the fused one keeps a
            # dq per kv block: 28.9 GB at 75,600 tokens and 1024-key blocks on a v5e).
            timing, _, _ = _time_dense_splash(dense_peer, blocks, backward, options, clock)
            return timing

        peer.release()  # one set of prepared inputs on the device at a time

        # The backward is timed at the forward's best blocks (a search there costs minutes
        # of chip time: Splash's backward compiles are its slowest).
        candidates = options.dense_blocks
        if backward and result["splash_dense_forward"].get("blocks"):
            first = tuple(result["splash_dense_forward"]["blocks"])
            candidates = (first,) + tuple(b for b in options.dense_blocks if b != first)
        key = json.dumps([target, env, heads, seq, d, str(module.DTYPE), direction])
        best = dense.best(key, candidates, time_dense, progress, first_that_runs=backward)
        dense_peer.release()
        result[f"splash_dense_{direction}"] = {
            "blocks": list(best["blocks"]) if best["blocks"] else None,
            **(best["timing"].to_json() if best["timing"] else {"error": "no block size compiled"}),
            "tried": best["tried"],
        }
        on_entry(result)
        if plan.spec.select is not None:
            result[f"splash_mask_{direction}"] = {
                "error": "not timed: this spec chooses blocks per call (select), a mask Splash "
                "cannot be given ahead of time"
            }
            on_entry(result)
            continue
        if backward and forward_winner is None:
            # The backward builds the same mask tables and more: on the chip, a mask whose
            # forward ran out of SMEM held the compiler for minutes before it was killed.
            why = "not timed: Splash's forward given this mask failed in every configuration"
            result["splash_mask_backward"] = {"error": why}
            on_entry(result)
            continue
        progress(f"{result['spec']}: Splash given the mask ({direction})")
        entry, forward_winner = _best_masked_splash(
            peer,
            peer_cache,
            direction,
            forward_winner,
            options,
            clock,
            progress,
            splash_peer.cache_key(target, env, plan.spec, assignment, direction),
        )
        if not backward and "error" not in entry and reference is not None:
            out = entry.pop("_output")
            entry["max_error"] = max_error(peer.assemble(out), reference, rows)
            entry["ok"] = entry["max_error"] <= TOLERANCE[str(module.DTYPE)]  # Splash: bf16
        entry.pop("_output", None)
        result[f"splash_mask_{direction}"] = entry
        on_entry(result)
    _speedups(result, directions)


def _best_masked_splash(peer, cache, direction, forward_winner, options, clock, progress, key):
    """(the result entry, the forward's winning config): Splash given the mask at its best
    configuration, or at `--splash-blocks` alone when those are not the default."""
    from svgen.chip import splash_peer

    backward = direction == "backward"

    def time_config(config):
        fn, args = peer.call(config, backward)
        timing, out = time_calls(fn, args, warmup=options.warmup, iters=options.iters, clock=clock)
        return timing, (None if backward else out)

    if options.splash_blocks is not None:
        fixed = splash_peer.Config("data", tuple(options.splash_blocks))
        if backward:
            fixed = dataclasses.replace(forward_winner, backward_blocks=fixed.blocks, fused=True)
        found = splash_peer.best(
            time_config, direction, key, cache, forward_winner, progress, only=fixed
        )
    else:
        found = splash_peer.best(time_config, direction, key, cache, forward_winner, progress)
    groups = peer.describe()
    if found["config"] is None:
        last = found["tried"][-1]["error"] if found["tried"] else "nothing tried"
        return {"error": last, "tried": found["tried"], "calls": groups}, None
    config = found["config"]
    entry = {
        "config": config.to_json(),
        "label": config.label(),
        "blocks": list(config.blocks),
        "calls": groups,
        "cached": found["cached"],
        "mask_build_s": round(peer.mask_build_s, 2),
        **found["timing"].to_json(),
        "tried": found["tried"],
        "_output": found["output"],
    }
    if backward:
        entry["fused_backward"] = bool(config.fused)
    return entry, (config if not backward else forward_winner)


def _time_dense_splash(dense_peer, blocks, backward, options, clock):
    """(Timing, output, fused): dense Splash over every head at `blocks`, inputs prepared
    outside the timed call as for the masked peer; its backward fused where it fits the
    chip, else its two kernels."""
    from svgen.chip import splash_mask, splash_peer

    splash_mask.padded_length(dense_peer.seq, *blocks)  # refuses absurd padding first
    error = None
    for fused in (True, False) if backward else (False,):
        config = splash_peer.Config(
            "data", tuple(blocks), tuple(blocks) if backward else None, fused if backward else None
        )
        fn, args = dense_peer.call(config, backward)
        try:
            timing, out = time_calls(
                fn, args, warmup=options.warmup, iters=options.iters, clock=clock
            )
        except Exception as exc:
            error = exc
            continue
        return timing, out, fused
    raise error


def with_peer_figures(result: dict, peer: dict) -> dict:
    """`result` (svgen timed alone) with the Splash figures of `peer`, a result of the same
    spec whose Splash was timed (another tiling of an exact spec: Splash gets the same mask
    whatever svgen's tiling), and the speedups against them."""
    out = dict(result)
    out.update({k: v for k, v in peer.items() if k.startswith("splash_")})
    out["splash_from_tiling"] = peer["tiling"]
    _speedups(out, [d for d in ("forward", "backward") if f"svgen_{d}" in out])
    return out


def _speedups(result: dict, directions) -> None:
    for direction in directions:
        mine = result.get(f"svgen_{direction}", {}).get("median_ms")
        for peer in ("splash_dense", "splash_mask"):
            theirs = result.get(f"{peer}_{direction}", {}).get("median_ms")
            if mine and theirs:
                result[f"speedup_vs_{peer}_{direction}"] = round(theirs / mine, 3)


def tiling_json(t) -> dict:
    return {
        "block_q": t.block_q,
        "block_kv": t.block_kv,
        "compute_q": t.cq,
        "compute_kv": t.ckv,
        "align": t.align,
    }
