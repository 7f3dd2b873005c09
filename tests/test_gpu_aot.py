"""Deviceless GPU compiles (svgen.chip.gpu_aot): every shipped spec's GPU kernel compiles for
the H100 and the H200 on this CPU-only machine, through XLA, Triton and ptxas to sm_90a, and
`svgen compile --target h100|h200` refuses what would not fit a block's shared memory.

They need the toolchain the README's developer install puts in .gpu-aot (JAX's CUDA plugin and
ptxas); CI installs it, so a missing toolchain fails here rather than skipping.
"""

from __future__ import annotations

import math
import os
import pathlib
import re
import sys

import pytest

from svgen import codegen
from svgen.chip import gpu_aot
from svgen.analysis import analyze
from svgen.spec import SpecError, load_spec
from svgen.analysis.targets import GPU_TARGETS

from helpers import REPO, SPECS, run_svgen


def compiled_module(spec_path: pathlib.Path, target: str, out: pathlib.Path) -> pathlib.Path:
    plan = analyze(load_spec(spec_path), target_name=target)
    out.mkdir(parents=True, exist_ok=True)
    for filename, data in codegen.render(plan, f"specs/{spec_path.name}").items():
        (out / filename).write_bytes(data)
    return out / codegen.module_filename(plan.spec.name, "gpu")


def test_the_gpu_targets_share_one_instruction_set():
    """Why every shipped spec is compiled for one GPU target below: the targets are one
    architecture (sm_90a) with one shared-memory limit, so a kernel ptxas takes for one it
    takes for the other (the other target's compile: the module-beside test below)."""
    capabilities = {
        re.search(r"cuda_compute_capability \{[^}]*\}", t.config_text())[0]
        for t in GPU_TARGETS.values()
    }
    assert capabilities == {"cuda_compute_capability { major: 9 }"}
    assert len({t.shared_memory_per_block for t in GPU_TARGETS.values()}) == 1
    assert len({t.registers_per_thread for t in GPU_TARGETS.values()}) == 1


@pytest.mark.parametrize("target", ["h100"])
def test_every_shipped_spec_compiles_for(target, tmp_path):
    """Full size, bf16, the spec's heads: the launch XLA plans (one program per 64-token q
    tile and head), Hopper's warpgroup MMA in the PTX, and what ptxas says of registers."""
    for spec_path in SPECS:
        spec = load_spec(spec_path)
        if spec.attention.qk == "int8":  # a TPU kernel's path, refused at its key
            with pytest.raises(SpecError, match=r"qk: int8 runs in the TPU kernels only"):
                compiled_module(spec_path, target, tmp_path / spec_path.stem)
            continue
        if spec.select is not None and (spec.heads is not None or spec.runtime.any):
            # A selection over heads of several patterns or run-time ids: TPU only, refused
            # with where it runs (docs/limits.md).
            with pytest.raises(SpecError, match=r"\(GPU\) kernel yet; it runs in the TPU"):
                compiled_module(spec_path, target, tmp_path / spec_path.stem)
            continue
        module = compiled_module(spec_path, target, tmp_path / spec_path.stem)
        facts = gpu_aot.compile_module(module, target)
        gpu = spec.gpu_tiling
        assert facts["target"] == target
        assert facts["grid"] == [
            math.ceil(spec.geometry.seq_len / gpu.block_q),
            spec.attention.heads,
        ], spec_path.stem
        assert facts["threads"] == 32 * gpu.num_warps
        assert 0 < facts["shared_memory"] <= facts["shared_memory_limit"] == 232448
        assert facts["wgmma"] > 0, f"{spec_path.stem}: no wgmma in the PTX"
        assert 0 < facts["registers"] <= 255
        assert facts["spill_store_bytes"] == 0, f"{spec_path.stem} spills registers"


def write_spec(
    tmp_path: pathlib.Path, name: str, gpu: str, base: str = "wan21_720p_band"
) -> pathlib.Path:
    text = (REPO / "specs" / f"{base}.yaml").read_text()
    text = text.replace(f"name: {base}", f"name: {name}") + gpu
    path = tmp_path / "specs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_compile_refuses_a_kernel_over_shared_memory(tmp_path):
    """128 x 128 tiles with 7 stages need 294,924 bytes, over the 232,448 a block may opt
    into: exit 2, the bytes, a configuration the compile accepted, nothing written."""
    path = write_spec(
        tmp_path,
        "big_gpu_tiles",
        "gpu:\n  block_q: 128\n  block_kv: 128\n  num_warps: 8\n  num_stages: 7\n",
    )
    done = run_svgen("compile", str(path), "--target", "h100", "--out", str(tmp_path / "gen"))
    assert done.returncode == 2, done.stderr
    assert "gpu: the GPU kernel needs 294,924 bytes of shared memory" in done.stderr
    assert "over the 232,448 a block may use on NVIDIA H100" in done.stderr
    assert "num_stages: 6} would fit (229,384 bytes)" in done.stderr
    assert "nothing written" in done.stderr
    assert not (tmp_path / "gen").exists()


def test_compile_writes_the_gpu_module_beside_the_tpu_one(tmp_path):
    """`--target h200` writes <name>_gpu.py (and its tables) after its compile passed, says
    what launched, and repeats the target in the Regenerate line; a TPU compile of the same
    spec into the same folder writes <name>.py and leaves the GPU files alone."""
    path = write_spec(tmp_path, "small_tiles", "gpu:\n  block_q: 32\n  block_kv: 64\n")
    out = tmp_path / "generated"
    done = run_svgen("compile", str(path), "--target", "h200", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "compiled for h200: grid [2363, 10], 128 threads" in done.stderr
    gpu_files = sorted(p.name for p in out.iterdir())
    assert gpu_files == ["small_tiles_gpu.py", "small_tiles_gpu_tables.npy"]
    text = (out / "small_tiles_gpu.py").read_text()
    assert "# Regenerate: svgen compile specs/small_tiles.yaml --target h200\n" in text
    # (--no-size-check: the TPU module's program count is not what this checks)
    assert run_svgen("compile", str(path), "--out", str(out), "--no-size-check").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_files + ["small_tiles.py"])
    check = run_svgen("compile", str(path), "--target", "h200", "--out", str(out), "--check")
    assert check.returncode == 0, check.stderr


def test_compile_from_another_directory_finds_the_toolchain_beside_svgen(tmp_path):
    """Run from a folder without `.gpu-aot` and without $SVGEN_GPU_TOOLCHAIN, the compile
    finds the repository's toolchain (beside the svgen package), as the README installs it."""
    assert (gpu_aot.project_toolchain_dir() / "jax_cuda12_plugin").is_dir()
    path = write_spec(tmp_path, "elsewhere", "gpu:\n  block_q: 32\n  block_kv: 64\n")
    env = {k: v for k, v in os.environ.items() if k != gpu_aot.TOOLCHAIN_ENV}
    relative = str(path.relative_to(tmp_path))
    done = run_svgen("compile", relative, "--target", "h100", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "compiled for h100" in done.stderr
    assert (tmp_path / "generated" / "elsewhere_gpu.py").exists()


def test_a_missing_toolchain_is_an_error_that_says_where_it_looked(tmp_path, monkeypatch):
    """Without the variable: the folder beside svgen, then the working directory, then the
    running environment; the error names each, and says how to install into the first."""
    monkeypatch.delenv(gpu_aot.TOOLCHAIN_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(gpu_aot, "project_toolchain_dir", lambda: tmp_path / "beside")
    monkeypatch.setattr(gpu_aot, "_environment_has_plugin", lambda: False)
    with pytest.raises(gpu_aot.GpuCompileError) as err:
        gpu_aot.toolchain_dir()
    message = str(err.value)
    assert f"found in none of: {tmp_path / 'beside'}, {tmp_path / '.gpu-aot'}, " in message
    assert f"the running environment ({sys.executable})" in message
    assert f"pip install --no-deps --target {tmp_path / 'beside'} " in message
    (tmp_path / ".gpu-aot" / "jax_cuda12_plugin").mkdir(parents=True)
    assert gpu_aot.toolchain_dir() == tmp_path / ".gpu-aot"  # then the working directory
    (tmp_path / "beside" / "jax_cuda12_plugin").mkdir(parents=True)
    assert gpu_aot.toolchain_dir() == tmp_path / "beside"  # the folder beside svgen first


def test_a_wrong_toolchain_variable_is_an_error_that_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv(gpu_aot.TOOLCHAIN_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(gpu_aot.GpuCompileError, match="pip install --no-deps --target /"):
        gpu_aot.toolchain_dir()
    path = write_spec(tmp_path, "no_toolchain", "")
    done = run_svgen("compile", str(path), "--target", "h100", "--out", str(tmp_path / "gen"))
    assert done.returncode == 2 and "holds no jax_cuda12_plugin" in done.stderr
    assert not (tmp_path / "gen").exists()
    skipped = run_svgen(
        "compile", str(path), "--target", "h100", "--no-gpu-check", "--out", str(tmp_path / "gen")
    )
    assert skipped.returncode == 0 and "not compiled (--no-gpu-check)" in skipped.stderr


def test_cost_and_tune_are_tpu_only():
    for command in ("cost", "tune"):
        done = run_svgen(command, "specs/wan21_720p_band.yaml", "--target", "h100")
        assert done.returncode == 2 and "invalid choice: 'h100'" in done.stderr


def test_register_spills_are_a_warning(tmp_path):
    """ptxas passes a kernel that spills; svgen compile writes it and says so on stderr
    (the temporal spec at 128 x 64 tiles with 4 warps: 255 registers and spills)."""
    path = write_spec(
        tmp_path,
        "spilling",
        "gpu: {block_q: 128, block_kv: 64, num_warps: 4}\n",
        base="wan21_720p_temporal",
    )
    done = run_svgen("compile", str(path), "--target", "h200", "--out", str(tmp_path / "gen"))
    assert done.returncode == 0, done.stderr
    assert "svgen: warning: the GPU kernel spills registers on h200 (255 per thread" in done.stderr
    assert (tmp_path / "gen" / "spilling_gpu.py").exists()
