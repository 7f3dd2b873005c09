"""Deviceless compile of a generated GPU module: proof, without a GPU, that XLA, Triton and
ptxas accept its kernel for a Hopper target (sm_90a), and what the kernel launches.

`svgen compile --target h100|h200` runs it on every GPU module before writing anything; the
tests run it on every shipped spec for both targets; svgen.chip.gpu_bench reads its facts.

The toolchain
-------------
JAX's CUDA plugin and ptxas, at JAX's version: `jax-cuda12-plugin`, `jax-cuda12-pjrt` and
`nvidia-cuda-nvcc-cu12` (about 223 MB to download, 570 MB on disk). A GPU machine with
`jax[cuda12]` has them already. On a CPU-only machine they go into a directory of their own
(`pip install --no-deps --target .gpu-aot ...`, the README's developer install), never into
the environment that runs svgen and its tests: there, every JAX process would find the plugin
and log CUDA-driver messages on stderr. Where svgen looks (`toolchain_dir`), in order:
$SVGEN_GPU_TOOLCHAIN when set (then nowhere else), `.gpu-aot` beside the svgen package (the
repository root, for an editable install: found from any working directory), `.gpu-aot` in
the working directory, the running environment. The error of a missing toolchain lists them.

The compile runs in a child process (`python -m svgen.chip.gpu_aot MODULE --target NAME`) with the
toolchain first on PYTHONPATH and JAX_PLATFORMS=cpu: without a driver the plugin would fail
its CUDA check and not register, and the topology call would say "not implemented for cuda".
The child compiles `module.attention` on q, k, v of the spec's shape and dtype (a traced
head_pattern when heads choose at run time) against the target description of
svgen/analysis/gpu_specs/, with XLA's dump on, and reads from the dump:

  grid, threads, shared_memory   the kernel's launch (XLA's thunk sequence)
  wgmma                          Hopper warpgroup MMA instructions in its PTX
  registers, spill bytes         `ptxas -v` on its PTX (the compile itself passes spills)

A kernel over the GPU's shared memory fails the compile ("Shared memory size limit
exceeded"); the child then compiles smaller configurations (fewer stages, then smaller kv
and q tiles) and reports the first that fits, for the error message.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

TOOLCHAIN_ENV = "SVGEN_GPU_TOOLCHAIN"
DEFAULT_TOOLCHAIN_DIR = ".gpu-aot"
KERNEL_NAME = "svgen_gpu_attention"  # the pallas_call's name (svgen.runtime.gpu)
CHILD_TIMEOUT_S = 900
_SHARED_RE = re.compile(r"Shared memory size limit exceeded: requested (\d+), available: (\d+)")


class GpuCompileError(Exception):
    """The deviceless compile failed or could not run; `facts` holds what the child said."""

    def __init__(self, message: str, facts: dict | None = None):
        super().__init__(message)
        self.facts = facts or {}


def toolchain_packages() -> list[str]:
    """The pip requirements of the toolchain, at the running JAX's version."""
    from importlib.metadata import version

    jax_version = version("jax")
    return [
        f"jax-cuda12-plugin=={jax_version}",
        f"jax-cuda12-pjrt=={jax_version}",
        "nvidia-cuda-nvcc-cu12==12.9.86",
    ]


def install_hint() -> str:
    packages = " ".join(toolchain_packages())
    return (
        f"install it beside svgen with `pip install --no-deps --target "
        f"{project_toolchain_dir()} {packages}` (or point ${TOOLCHAIN_ENV} at such a directory)"
    )


def project_toolchain_dir() -> pathlib.Path:
    """`.gpu-aot` beside the svgen package: in the repository root for an editable install
    (where the README's developer install puts it), whatever the working directory."""
    package = pathlib.Path(__file__).resolve().parents[1]  # svgen/ (this is svgen/chip/)
    return package.parent / DEFAULT_TOOLCHAIN_DIR


def _holds_plugin(path: pathlib.Path) -> bool:
    return (path / "jax_cuda12_plugin").is_dir()


def _environment_has_plugin() -> bool:
    """Whether the running environment has the plugin itself (a GPU machine's jax[cuda12])."""
    return importlib.util.find_spec("jax_cuda12_plugin") is not None


def toolchain_dir() -> pathlib.Path | None:
    """The toolchain directory to put on the child's PYTHONPATH; None when the running
    environment has the plugin itself (a GPU machine's jax[cuda12]). Raises GpuCompileError,
    saying where it looked, when none has it.

    Where: $SVGEN_GPU_TOOLCHAIN when set (then only there: a wrong setting is an error, not
    a fallback), else `.gpu-aot` beside the package (`project_toolchain_dir`), else `.gpu-aot`
    in the working directory, else the running environment."""
    given = os.environ.get(TOOLCHAIN_ENV)
    if given:
        if _holds_plugin(pathlib.Path(given)):
            return pathlib.Path(given).resolve()
        raise GpuCompileError(
            f"${TOOLCHAIN_ENV}={given} holds no jax_cuda12_plugin; {install_hint()}"
        )
    looked = []
    for path in (project_toolchain_dir(), pathlib.Path(DEFAULT_TOOLCHAIN_DIR).resolve()):
        if _holds_plugin(path):
            return path
        if str(path) not in looked:
            looked.append(str(path))
    if _environment_has_plugin():
        return None
    looked.append(f"the running environment ({sys.executable})")
    raise GpuCompileError(
        f"compiling for a GPU without one needs JAX's CUDA plugin and ptxas, found in none "
        f"of: {', '.join(looked)} (${TOOLCHAIN_ENV} is not set); {install_hint()}"
    )


def child_env(toolchain: pathlib.Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if toolchain is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(toolchain)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
    env["JAX_PLATFORMS"] = "cpu"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"  # the plugin's "no CUDA driver" notes are expected here
    return env


def compile_module(module_path: pathlib.Path, target: str, hint: bool = True) -> dict:
    """The launch facts of a generated GPU module compiled for `target`, from a child
    process; GpuCompileError with the child's facts when the compile fails."""
    command = [sys.executable, "-m", "svgen.chip.gpu_aot", str(module_path), "--target", target]
    if not hint:
        command.append("--no-hint")
    try:
        done = subprocess.run(
            command,
            env=child_env(toolchain_dir()),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise GpuCompileError(
            f"the deviceless compile of {module_path.name} ran past {CHILD_TIMEOUT_S} s"
        ) from None
    try:
        facts = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = "\n".join(done.stderr.strip().splitlines()[-20:])
        raise GpuCompileError(
            f"the deviceless compile of {module_path.name} ended with status "
            f"{done.returncode} and no result:\n{tail}"
        ) from None
    if "error" in facts:
        raise GpuCompileError(facts["message"], facts)
    return facts


def launch_warnings(facts: dict) -> list[str]:
    """What a compile that passed still says is slow: registers spilled to local memory
    (ptxas does not fail on spills)."""
    spilled = facts.get("spill_store_bytes", 0) + facts.get("spill_load_bytes", 0)
    if not spilled:
        return []
    c = facts["config"]
    return [
        f"the GPU kernel spills registers on {facts['target']} ({facts['registers']} per "
        f"thread, {facts['spill_store_bytes']:,} bytes stored and {facts['spill_load_bytes']:,} "
        f"loaded per thread) with gpu {{block_q: {c['block_q']}, block_kv: {c['block_kv']}, "
        f"num_warps: {c['num_warps']}}}: more warps or smaller tiles keep it in registers"
    ]


# -- in the child process ------------------------------------------------------------------


def _import_module(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(f"_svgen_gpu_aot_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass(frozen=True)
class _Config:
    block_q: int
    block_kv: int
    num_warps: int
    num_stages: int

    def words(self) -> str:
        return (
            f"{{block_q: {self.block_q}, block_kv: {self.block_kv}, "
            f"num_warps: {self.num_warps}, num_stages: {self.num_stages}}}"
        )


def _module_config(module) -> _Config:
    return _Config(module.GPU_BLOCK_Q, module.GPU_BLOCK_KV, module.NUM_WARPS, module.NUM_STAGES)


def _smaller_configs(c: _Config):
    """What to try when `c` is over the shared memory: fewer stages first (the cheapest
    loss), then smaller kv tiles, then smaller q tiles; never below 16."""
    stages, bkv, bq = c.num_stages, c.block_kv, c.block_q
    while stages > 2:
        stages -= 1
        yield _Config(bq, bkv, c.num_warps, stages)
    stages = min(stages, 2)
    while bkv > 16 or bq > 16:
        if bkv >= bq and bkv > 16:
            bkv //= 2
        else:
            bq //= 2
        yield _Config(bq, bkv, c.num_warps, stages)


def target_sharding(chip):
    """A sharding on one device of `chip` (a svgen.analysis.targets.GpuTarget) built from its target
    description: what arguments of a deviceless compile carry (in the child process)."""
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    topology = topologies.get_topology_desc(
        platform="cuda", target_config=chip.config_text(), topology="1x1x1"
    )
    return NamedSharding(topologies.make_mesh(topology, (1,), ("x",)), PartitionSpec())


class _Compiler:
    """Compiles a module's kernel at some configuration for one target (in the child)."""

    def __init__(self, module, target: str):
        import jax
        import jax.numpy as jnp

        from svgen.analysis.targets import gpu_target

        self.module, self.jax, self.jnp = module, jax, jnp
        self.target = gpu_target(target)
        self.sharding = target_sharding(self.target)

    def attention(self, config: _Config):
        from svgen.runtime import gpu

        m = self.module
        return gpu.make_gpu_attention(
            m._PATTERNS,
            m.SHAPE,
            block_q=config.block_q,
            block_kv=config.block_kv,
            default_head_pattern=m.HEAD_PATTERN,
            dtype=m.DTYPE,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
            runtime=getattr(m.attention, "runtime", gpu.segments.RuntimeInputs()),
        )

    def compile(self, config: _Config, dump: pathlib.Path):
        """Compiles; returns None, or the compile error's text."""
        jax, jnp, m = self.jax, self.jnp, self.module
        shape = (m.HEADS, m.SEQ_LEN, m.HEAD_DIM)
        qkv = jax.ShapeDtypeStruct(shape, jnp.dtype(m.DTYPE), sharding=self.sharding)
        attention = self.attention(config)
        # A module with run-time inputs is compiled with them (the kernel that reads ids).
        names = attention.runtime.arguments()
        shapes = {"segment_ids": (m.SEQ_LEN,), "text_lengths": ()}
        extra = tuple(
            jax.ShapeDtypeStruct(shapes[n], jnp.int32, sharding=self.sharding) for n in names
        )
        if m.HEAD_PATTERN is None and len(m.PATTERNS) > 1:  # heads choose at run time
            hp = jax.ShapeDtypeStruct((m.HEADS,), jnp.int32, sharding=self.sharding)
            args = (qkv, qkv, qkv, hp) + extra

            def fn(q, k, v, hp, *inputs):
                return attention(q, k, v, head_pattern=hp, **dict(zip(names, inputs)))
        else:
            args = (qkv, qkv, qkv) + extra

            def fn(q, k, v, *inputs):
                return attention(q, k, v, **dict(zip(names, inputs)))

        try:
            jax.jit(fn).lower(*args).compile(compiler_options={"xla_dump_to": str(dump)})
        except Exception as err:  # XLA raises its own error types; the text says what failed
            return str(err)
        return None


_LAUNCH_RE = re.compile(
    r"kCustomKernel\b[^\n]*?\s(\S+) grid: \[([\d, ]+)\] threads: \[([\d, ]+)\]\s+"
    r"shared_memory: (\d+)"
)


def kernel_launch(dump: pathlib.Path, prefix: str) -> dict:
    """The launch of the custom kernel whose name starts with `prefix`, from XLA's thunk
    sequence in `dump`: name, grid (x, y, z), threads per block, shared memory bytes."""
    found = []
    for path in sorted(dump.glob("*thunk_sequence.txt")):
        found += _LAUNCH_RE.findall(path.read_text())
    named = [f for f in found if f[0].startswith(prefix)]
    if not named:
        kernels = ", ".join(f[0] for f in found) or "none"
        raise GpuCompileError(
            f"no {prefix}* kernel in XLA's thunk sequence (custom kernels: {kernels})"
        )
    name, grid, threads, shared = named[0]
    return {
        "kernel": name,
        "grid": [int(x) for x in grid.split(",")],
        "threads": int(threads.split(",")[0]),
        "shared_memory": int(shared),
    }


def kernel_ptx(dump: pathlib.Path, name: str) -> pathlib.Path:
    """The PTX file in `dump` that defines the entry `name`."""
    for path in sorted(dump.glob("*.ptx")):
        if re.search(rf"\.entry {re.escape(name)}\(", path.read_text()):
            return path
    raise GpuCompileError(f"no PTX entry {name} in XLA's dump")


def ptxas_path() -> str | None:
    try:
        import nvidia.cuda_nvcc  # the pip ptxas XLA used, when installed

        for root in nvidia.cuda_nvcc.__path__:
            candidate = pathlib.Path(root) / "bin" / "ptxas"
            if candidate.is_file():
                return str(candidate)
    except ImportError:
        pass
    return shutil.which("ptxas")


def kernel_registers(ptx: pathlib.Path, name: str, dump: pathlib.Path) -> dict:
    """Registers per thread and spill bytes of entry `name`, from `ptxas -v` ({} without
    ptxas)."""
    ptxas = ptxas_path()
    if ptxas is None:
        return {}
    done = subprocess.run(
        [ptxas, "-arch=sm_90a", "-v", str(ptx), "-o", str(dump / "kernel.cubin")],
        capture_output=True,
        text=True,
    )
    text, out, n = done.stdout + done.stderr, {}, re.escape(name)
    m = re.search(rf"Function properties for {n}\s*\n\s*(\d+) bytes stack frame, "
                  r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)  # fmt: skip
    if m:
        out["spill_store_bytes"], out["spill_load_bytes"] = int(m[2]), int(m[3])
    m = re.search(rf"Compiling entry function '{n}'[\s\S]*?Used (\d+) registers", text)
    if m:
        out["registers"] = int(m[1])
    return out


def _facts(compiler: _Compiler, config: _Config, dump: pathlib.Path, seconds: float) -> dict:
    ptx = kernel_ptx(dump, KERNEL_NAME)
    launch = kernel_launch(dump, KERNEL_NAME)
    return {
        "target": compiler.target.name,
        "config": dataclasses.asdict(config),
        "grid": launch["grid"][:2],
        "threads": launch["threads"],
        "shared_memory": launch["shared_memory"],
        "shared_memory_limit": compiler.target.shared_memory_per_block,
        "wgmma": ptx.read_text().count("wgmma.mma_async"),
        **kernel_registers(ptx, KERNEL_NAME, dump),
        "compile_s": round(seconds, 2),
    }


def _over_shared_memory(compiler: _Compiler, config: _Config, message: str, hint: bool) -> dict:
    m = _SHARED_RE.search(message)
    requested, available = int(m[1]), int(m[2])
    out = {
        "error": "shared_memory",
        "requested": requested,
        "available": available,
        "config": dataclasses.asdict(config),
    }
    fits = None
    if hint:
        for smaller in _smaller_configs(config):
            with tempfile.TemporaryDirectory() as tmp:
                if compiler.compile(smaller, pathlib.Path(tmp)) is None:
                    launch = kernel_launch(pathlib.Path(tmp), KERNEL_NAME)
                    fits = {
                        "shared_memory": launch["shared_memory"],
                        "config": dataclasses.asdict(smaller),
                    }
                    break
    out["fits"] = fits
    suggestion = (
        f"; gpu {_Config(**fits['config']).words()} would fit ({fits['shared_memory']:,} bytes)"
        if fits
        else ""
    )
    out["message"] = (
        f"the GPU kernel needs {requested:,} bytes of shared memory with gpu "
        f"{config.words()}, over the {available:,} a block may use on "
        f"{compiler.target.description}{suggestion}"
    )
    return out


def _child(module_path: pathlib.Path, target: str, hint: bool) -> dict:
    module = _import_module(module_path)
    compiler = _Compiler(module, target)
    config = _module_config(module)
    with tempfile.TemporaryDirectory() as tmp:
        dump = pathlib.Path(tmp)
        start = time.perf_counter()
        error = compiler.compile(config, dump)
        if error is None:
            return _facts(compiler, config, dump, time.perf_counter() - start)
    if _SHARED_RE.search(error):
        return _over_shared_memory(compiler, config, error, hint)
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return {"error": "compile", "message": "the GPU compile failed: " + " | ".join(lines[-6:])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m svgen.chip.gpu_aot",
        description="Compile a generated GPU module for a GPU target without a GPU "
        "(run with the toolchain on PYTHONPATH and JAX_PLATFORMS=cpu; svgen.chip.gpu_aot "
        "compile_module does); prints one JSON object.",
    )
    parser.add_argument("module", type=pathlib.Path)
    parser.add_argument("--target", required=True)
    parser.add_argument("--no-hint", action="store_true", help="do not search a tiling that fits")
    args = parser.parse_args(argv)
    try:
        facts = _child(args.module, args.target, not args.no_hint)
    except GpuCompileError as err:
        facts = {"error": "compile", "message": str(err)}
    print(json.dumps(facts, sort_keys=True))
    return 0 if "error" not in facts else 1


if __name__ == "__main__":
    sys.exit(main())
