"""Compiling a generated module's kernels ahead of time for a TPU target, and the on-disk
cache of what their schedules cost.

`measure_paths` (the forward call), `measure_chunk_paths` (a KV-cache module's chunked call),
`measure_training_paths` (a jax.grad call's kernels) and `measure_select_policy` (a select
module's per-call selection program) each compile with libtpu on this host
(`svgen.estimate.tpu_schedule`), read the costs from the schedule (`svgen.estimate.paths`) and cache
them under a key of everything the schedule depends on (`_cache_key`). Apart from the model
(`svgen.estimate.cost`) because this is the part that runs libtpu and touches the disk; the model
walks tables with NumPy and is tested on hand-made `PathCosts` without compiling anything.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib

import numpy as np

from svgen.core.safe_io import read_json_cache, write_json_cache
from svgen.estimate.paths import PathCosts, read_paths
from svgen.runtime.variant import backward_branches

KERNEL_NAME = "svgen_attention"
# The format of the cached costs (PathCosts and its kin); what the kernels trace is in the key by
# its source (kernel_sources), so an edit to a kernel needs no bump here.
CACHE_VERSION = 8  # 5: residual_block (kernels with residual masks); 6: straight; 7: program;
# 8: a one-block selection's bookkeeping read with its padded phase skipped (paths._read_set)


# ----------------------------------------------------------------------------- the cache
def _cache_dir() -> pathlib.Path:
    base = os.environ.get("SVGEN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "svgen"
    )
    return pathlib.Path(base) / "cost"


def _cache_key(
    target: str,
    shape,
    patterns_key: str,
    slots: int,
    tables_shape: tuple,
    dtype: str,
    kind: str = "forward",
    runtime: tuple[str, ...] = (),
) -> str:
    import jax
    import jaxlib

    # Everything the kernels trace: every svgen module the TPU attention imports,
    # transitively (its kernel bodies, the step reader, the coordinate decoding, the
    # run-time maps, the selection programs measure_select_policy counts).
    kernel_source = kernel_source_digest()
    text = json.dumps(
        [
            CACHE_VERSION,
            kind,
            target,
            dataclasses.asdict(shape),
            patterns_key,
            slots,
            list(tables_shape),
            dtype,
            jax.__version__,
            jaxlib.__version__,
            kernel_source,
        ]
        + ([list(runtime)] if runtime else []),
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# The module a generated TPU module's attention comes from: the root of what its kernels trace.
KERNEL_ROOT = "svgen.runtime.kernel"


@functools.cache
def kernel_sources(root: str = KERNEL_ROOT) -> tuple[pathlib.Path, ...]:
    """The files of `root` and of every svgen module it imports, transitively, in name order:
    read from their import statements (those inside functions too), so that no edit to what
    a kernel traces keeps a cached cost."""
    package = pathlib.Path(__file__).resolve().parents[1]  # svgen/
    seen: dict[str, pathlib.Path] = {}
    todo = [root]
    while todo:
        name = todo.pop()
        path = _module_file(package, name)
        if path is None or name in seen:
            continue
        seen[name] = path
        todo.extend(_svgen_imports(path, package))
        # Importing svgen.a.b runs svgen's and svgen.a's __init__ first.
        todo.extend(name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1))
    return tuple(seen[name] for name in sorted(seen))


@functools.cache
def kernel_source_digest() -> str:
    """sha256 of kernel_sources()' contents: read once a process (a tuning run asks the cache
    for many candidates)."""
    return hashlib.sha256(b"".join(path.read_bytes() for path in kernel_sources())).hexdigest()


def _module_file(package: pathlib.Path, name: str) -> pathlib.Path | None:
    """svgen.a.b's file (a module or a package's __init__), None where there is none."""
    parts = name.split(".")[1:]
    base = package.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _svgen_imports(path: pathlib.Path, package: pathlib.Path) -> list[str]:
    """The svgen modules `path` imports: `import svgen.x`, `from svgen.x import y` (y a
    module or a name of svgen.x)."""
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.split(".")[0] == "svgen"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "svgen":
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return [n for n in names if _module_file(package, n) is not None]


def _cached(key: str, use_cache: bool, measure, from_json):
    """The costs cached under `key`, else `measure()`'s, stored for next time (whole or not
    at all; where the cache cannot be written, svgen runs on without it). A cache file that
    is not what this function wrote (truncated, empty, of another shape, a folder, a FIFO, a
    link to a device) is a miss, said in one line, and rewritten (svgen.core.safe_io)."""
    path = _cache_dir() / f"{key}.json"
    if use_cache:
        costs = read_json_cache(path, functools.partial(_checked_costs, from_json))
        if costs is not None:
            return costs
    costs = measure()
    write_json_cache(path, costs.to_json())
    return costs


def counts_key(kind: str, target: str, digest: str) -> str:
    """A cache key for counts taken of one compile (kind: what is counted; digest: what was
    compiled), with JAX's versions and svgen's kernel sources, as every key here has."""
    import jax
    import jaxlib

    text = json.dumps(
        [CACHE_VERSION, kind, target, digest, jax.__version__, jaxlib.__version__]
        + [kernel_source_digest()]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_counts(key: str, count, from_json):
    """count()'s value cached under `key` as `_cached` keeps costs (counts only, whole or
    not at all)."""
    return _cached(key, True, count, from_json)


def _checked_costs(from_json, obj):
    """`from_json(obj)` when `obj` is what its `to_json` writes, counts only (integers, and
    None where a kernel is absent); ValueError (or the KeyError, TypeError... of reading a
    wrong shape) otherwise."""
    costs = from_json(obj)
    if not _counts_only(obj) or json.loads(json.dumps(costs.to_json())) != obj:
        raise ValueError("not the costs svgen caches")
    return costs


def _counts_only(obj) -> bool:
    """Every leaf of the JSON value `obj` is an integer (or a flag) or None."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None and not isinstance(item, int):
            return False
    return True


# ----------------------------------------------------------------------------- a call
def _forward_masks(module) -> tuple[str, tuple[str, ...]]:
    """What the forward kernel's schedule depends on of its masks: the source of every
    pattern's mask and residual masks, and the variants table's dtype (the cache key)."""
    import inspect

    tables = module.attention.tables
    masks = "\n".join(
        inspect.getsource(mask)
        for p in module._PATTERNS
        for mask in (p.boundary_mask, *p.residual_masks)
    )
    if tables.variants is None:
        return masks, ()
    return masks, (f"variants {tables.variants.dtype}",)


def _branches_key(branches) -> tuple[str, ...]:
    """The cache key's part for the kernel's branch structure (svgen.runtime.variant)."""
    words = tuple(
        f"straight {w.word} {w.avoid_padding_tile}" for ws in branches.straight for w in ws
    )
    return words + (f"residuals {list(branches.residuals)}",) * any(branches.residuals)


def measure_paths(module, target: str, *, use_cache: bool = True, progress=None) -> PathCosts:
    """Compile the generated module's kernel for `target` and read its per-path costs.

    Cached on disk by everything the schedule depends on (kernel source, shapes, the masks'
    code, table dtypes, jax version): a spec costs one compile the first time, none after.
    """

    tables = module.attention.tables
    masks, variants = _forward_masks(module)
    branches = module.attention.forward_branches(module.attention.call_tables_source())
    key = _cache_key(
        target,
        module.SHAPE,
        masks,
        tables.slots,
        tuple(str(t.dtype) for t in tables.piece_operands()) + variants + _branches_key(branches),
        module.DTYPE,
        runtime=module.attention.runtime.arguments()
        + (() if module.attention.select is None else ("select",))
        # per-video frames: [2, tile] id blocks and shifted masks, another kernel
        + (("per_video_frames",) if module.attention.runtime.per_video_frames else ()),
    )

    def measure() -> PathCosts:
        if progress:
            progress(f"compiling {module.__name__} for {target} (libtpu)")
        return read_paths(_compile(module, target), branches)

    return _cached(key, use_cache, measure, PathCosts.from_json)


def _compile(module, target: str):
    """The kernel's schedule; a module with run-time inputs is compiled with them (traced),
    so what is measured is the kernel that reads run-time segments."""
    from svgen.estimate import tpu_schedule

    names = module.attention.runtime.arguments()

    def run(q, k, v, hp, *runtime_inputs):
        return module.attention(q, k, v, head_pattern=hp, **dict(zip(names, runtime_inputs)))

    return tpu_schedule.compile_and_dump(
        run,
        *aot_args(module, target),
        *runtime_args(module, target),
        kernel_name=KERNEL_NAME,
        target=target,
    )


def runtime_args(module, target: str) -> tuple:
    """Traced run-time inputs of the module's full size (one batch element), in the order
    of `attention.runtime.arguments()`."""
    import jax
    import jax.numpy as jnp

    from svgen.estimate import tpu_schedule

    sharding = tpu_schedule.tpu_sharding(target)
    shapes = {"segment_ids": (module.SEQ_LEN,), "text_lengths": ()}
    return tuple(
        jax.ShapeDtypeStruct(shapes[name], jnp.int32, sharding=sharding)
        for name in module.attention.runtime.arguments()
    )


def aot_args(module, target: str) -> tuple:
    """q, k, v and a traced head_pattern of the module's full size, placed on the target."""
    import jax
    import jax.numpy as jnp

    from svgen.estimate import tpu_schedule

    sharding = tpu_schedule.tpu_sharding(target)
    arg = jax.ShapeDtypeStruct(
        (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.dtype(module.DTYPE), sharding=sharding
    )
    head_pattern = jax.ShapeDtypeStruct((module.HEADS,), jnp.int32, sharding=sharding)
    return arg, arg, arg, head_pattern


# ----------------------------------------------------------------------------- chunks
def measure_chunk_paths(module, target: str, *, use_cache: bool = True, progress=None) -> PathCosts:
    """The per-path costs of the module's chunked call (svgen.runtime.chunks): the same
    kernel body walking per-row tables, with the chunk's first token added to the query
    positions; compiled once with a traced q_frame_offset, cached like `measure_paths`."""
    import inspect

    tables = module.attention.tables
    masks = "\n".join(inspect.getsource(p.boundary_mask) for p in module._PATTERNS)
    key = _cache_key(
        target,
        module.SHAPE,
        masks,
        tables.slots,
        tuple(str(t.dtype) for t in tables.piece_operands()),
        module.DTYPE,
        kind="chunk",
        runtime=_chunk_call_key(module.attention.kv_cache),
    )

    def measure() -> PathCosts:
        if progress:
            progress(f"compiling {module.__name__}'s chunked call for {target} (libtpu)")
        return read_paths(
            _compile_chunk(module, target), module.attention.forward_branches("chunk")
        )

    return _cached(key, use_cache, measure, PathCosts.from_json)


def _chunk_call_key(kv_cache) -> tuple[str, ...]:
    """What of the chunked call the compiled kernel depends on besides the shape: the
    chunk's rows, and a rolling cache's ring (its key mapping and cache length)."""
    key = ("q_frame_offset", str(kv_cache.rows))
    if kv_cache.rolling:
        key += (f"ring {kv_cache.sink_frames}+{kv_cache.window_frames}",)
    return key


def _compile_chunk(module, target: str):
    import jax
    import jax.numpy as jnp

    from svgen.estimate import tpu_schedule

    q, k, v, head_pattern = aot_args(module, target)
    kv_cache = module.attention.kv_cache
    chunk = jax.ShapeDtypeStruct(
        (module.HEADS, kv_cache.rows, module.HEAD_DIM), q.dtype, sharding=q.sharding
    )
    if kv_cache.rolling:  # k and v are the rolling cache
        k = v = jax.ShapeDtypeStruct(
            (module.HEADS, kv_cache.cache_tokens, module.HEAD_DIM), q.dtype, sharding=q.sharding
        )
    offset = jax.ShapeDtypeStruct((), jnp.int32, sharding=q.sharding)

    def run(q, k, v, hp, offset):
        return module.attention(q, k, v, head_pattern=hp, q_frame_offset=offset)

    return tpu_schedule.compile_and_dump(
        run, chunk, k, v, head_pattern, offset, kernel_name=KERNEL_NAME, target=target
    )


# ----------------------------------------------------------------------------- select
@dataclasses.dataclass(frozen=True)
class PolicyCost:
    """What a select call runs before its kernel (svgen.runtime.select): mean pooling, block
    scores, top-k / top-p and the tables' compaction, as XLA programs; libtpu's bundles of
    each, rough (a loop's trip count times one pass with every forward branch falling
    through; a run-time trip count counted once: a floor). Bundles see no HBM traffic, so
    pooling, which reads q and k once, counts at least their bytes at HBM bandwidth."""

    bundles: int  # all programs' rough cycles, as counted
    pooling: int  # of which the pooling's (svgen.runtime.select.pooled_blocks)
    programs: int
    uncounted: int  # programs whose listing could not be counted (left out)
    floors: int  # programs with a run-time trip count (counted once)

    def cycles(self, pooling_floor: int) -> int:
        return self.bundles - self.pooling + max(self.pooling, pooling_floor)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "PolicyCost":
        return cls(**obj)


def measure_select_policy(
    module, target: str, *, use_cache: bool = True, progress=None
) -> PolicyCost:
    """The per-call selection program of a select module (q, k -> the kernel's tables),
    AOT-compiled once with its amount traced; cached like `measure_paths`."""
    select = module.attention.select
    runs = np.concatenate([np.ravel(select.always_runs), np.ravel(select.candidate_runs)])
    key = _cache_key(
        target,
        module.SHAPE,
        hashlib.sha256(np.ascontiguousarray(runs, np.int64).tobytes()).hexdigest(),
        select.slots,
        (),
        module.DTYPE,
        kind="select-policy",
        runtime=tuple(map(str, dataclasses.astuple(select.policy))),
    )

    def measure() -> PolicyCost:
        if progress:
            progress(f"compiling {module.__name__}'s selection program for {target} (libtpu)")
        return _count_policy(module, target)

    return _cached(key, use_cache, measure, PolicyCost.from_json)


def _count_policy(module, target: str) -> PolicyCost:
    import jax
    import jax.numpy as jnp

    from svgen.estimate import tpu_schedule

    select = module.attention.select
    sharding = tpu_schedule.tpu_sharding(target)
    qk = jax.ShapeDtypeStruct(
        (module.HEADS, module.SEQ_LEN, module.HEAD_DIM), jnp.dtype(module.DTYPE), sharding=sharding
    )
    amount = jax.ShapeDtypeStruct(
        (), jnp.int32 if select.policy.rule == "top_k" else jnp.float32, sharding=sharding
    )
    scale = 1.0 / module.HEAD_DIM**0.5

    def program(q, k, amount):
        return select.forward_walk.tables(select.select(q, k, scale, amount).blocks)

    dumps, compiled = tpu_schedule.compile_programs(program, qk, qk, amount, target=target)
    emitted_by = tpu_schedule.emitting_functions(compiled.as_text(), "runtime/select.py")
    bundles = pooling = uncounted = floors = 0
    for name, text in dumps.items():
        cycles, floor = tpu_schedule.program_cycles(text)
        uncounted += cycles is None
        floors += floor
        bundles += cycles or 0
        if emitted_by.get(name.split("#")[0]) == "pooled_blocks":
            pooling += cycles or 0
    return PolicyCost(bundles, pooling, len(dumps), uncounted, floors)


# ----------------------------------------------------------------------------- training
@dataclasses.dataclass(frozen=True)
class TrainingPaths:
    """Per-path bundles of the kernels one training step runs: the forward that also saves
    each row's log-sum-exp, dq (over the forward tables) and dk/dv (over the transposed
    tables). Each kernel is a `pallas_call` of the same phase structure as the forward
    (init, FULL, BOUNDARY per pattern with its compute blocks, finalize); the backward
    operands are zero-padded, so their masked blocks have no padding variant."""

    forward: PathCosts
    dq: PathCosts | None  # None: dq is computed inside the dk/dv walk (fused)
    dkv: PathCosts

    @property
    def fused(self) -> bool:
        return self.dq is None

    def to_json(self) -> dict:
        return {
            "forward": self.forward.to_json(),
            "dq": None if self.dq is None else self.dq.to_json(),
            "dkv": self.dkv.to_json(),
        }

    @classmethod
    def from_json(cls, obj: dict) -> "TrainingPaths":
        read = {k: None if obj[k] is None else PathCosts.from_json(obj[k]) for k in obj}
        return cls(read["forward"], read["dq"], read["dkv"])


def dkv_tables(module):
    """The dk/dv kernel's tables, as the generated module builds them on its first
    differentiated call."""
    from svgen.core.tables import transposed_tables

    return transposed_tables([p.runs for p in module._PATTERNS], module.SHAPE, module.HEADS)


def measure_training_paths(
    module, target: str, *, use_cache: bool = True, progress=None, fused: bool | None = None
) -> TrainingPaths:
    """Compile jax.grad through the module's attention once for `target` and read the
    per-path costs of its kernels (cached on disk like `measure_paths`); `fused`: dq inside
    the dk/dv walk or in its own kernel (None: the runtime's default, backward.FUSED_DQ)."""

    from svgen.runtime import backward

    fused = backward.FUSED_DQ if fused is None else fused
    tables, transposed = module.attention.tables, dkv_tables(module)
    # The forward kernel runs the residual masks; the backward ones run whole masks. The
    # gradient's forward is a call without run-time inputs (_compile_training).
    masks, variants = _forward_masks(module)
    forward = module.attention.forward_branches(
        module.attention.call_tables_source(runtime_inputs=False)
    )
    dkv = backward_branches(module.SHAPE, len(module._PATTERNS))
    operands = tables.piece_operands() + transposed.piece_operands()
    key = _cache_key(
        target,
        module.SHAPE,
        masks,
        tables.slots * 1000 + transposed.slots,
        tuple(str(t.dtype) for t in operands) + variants + _branches_key(forward),
        module.DTYPE,
        kind="training-fused" if fused else "training",
    )

    def measure() -> TrainingPaths:
        if progress:
            progress(
                f"compiling the forward and backward kernels of {module.__name__} for {target}"
            )
        names = [KERNEL_NAME, f"{KERNEL_NAME}_dkv"] + ([] if fused else [f"{KERNEL_NAME}_dq"])
        schedules = _compile_training(module, target, names, fused)
        read = {
            name: read_paths(schedules[name], forward if name == KERNEL_NAME else dkv)
            for name in names
        }
        return TrainingPaths(
            read[KERNEL_NAME], read.get(f"{KERNEL_NAME}_dq"), read[f"{KERNEL_NAME}_dkv"]
        )

    return _cached(key, use_cache, measure, TrainingPaths.from_json)


def _compile_training(module, target: str, names: list[str], fused: bool) -> dict:
    import jax
    import jax.numpy as jnp

    from svgen.estimate import tpu_schedule
    from svgen.runtime import backward

    def loss(q, k, v, hp):
        return jnp.sum(module.attention(q, k, v, head_pattern=hp).astype(jnp.float32))

    grads = jax.grad(loss, argnums=(0, 1, 2))
    default, backward.FUSED_DQ = backward.FUSED_DQ, fused  # read when traced, in this compile
    try:
        return tpu_schedule.compile_and_dump_kernels(
            grads, *aot_args(module, target), kernel_names=names, target=target
        )
    finally:
        backward.FUSED_DQ = default
