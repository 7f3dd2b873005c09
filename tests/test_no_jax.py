"""Commands that need no JAX never import it: `svgen inspect` and `svgen compile` (TPU
target) run where jax and jaxlib cannot be imported at all, and the check for attached TPU
chips (svgen.runtime.libtpu_env) reads sysfs itself. The suite's own conftest.py and its
NumPy-only helpers load no JAX either, so a spec-only test run never does."""

from __future__ import annotations

import os
import subprocess

import pytest

from svgen.runtime import libtpu_env

from helpers import run_python

# A meta-path finder ahead of every other that refuses jax and jaxlib, then the command line.
_WITHOUT_JAX = """
import sys

class NoJax:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "jaxlib"):
            raise ImportError(f"{name} is unimportable in this test")
        return None

sys.meta_path.insert(0, NoJax())
from svgen.cli import main
status = main(sys.argv[1:])
assert not [m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib")]
sys.exit(status)
"""


def _run_without_jax(*args: str) -> subprocess.CompletedProcess:
    return run_python("-c", _WITHOUT_JAX, *args)


def test_inspect_runs_without_jax():
    done = _run_without_jax("inspect", "specs/wan21_720p_band.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wan21_720p_band (specs/wan21_720p_band.yaml)")


def test_compile_runs_without_jax(tmp_path):
    out = str(tmp_path / "generated")
    done = _run_without_jax("compile", "specs/wan21_720p_band.yaml", "--out", out)
    assert done.returncode == 0, done.stderr
    assert "svgen: 1 file(s) written" in done.stderr
    check = _run_without_jax("compile", "--check", "specs/wan21_720p_band.yaml", "--out", out)
    assert check.returncode == 0, check.stderr


# Imports the named modules of tests/ as pytest does (tests/ first on the path), then prints
# the JAX packages loaded.
_JAX_LOADED_BY = """
import importlib
import sys

sys.path.insert(0, "tests")
for name in sys.argv[1:]:
    importlib.import_module(name)
print(" ".join(sorted({m.split(".")[0] for m in sys.modules} & {"jax", "jaxlib"})))
"""
_JAX_FREE_HELPERS = (
    "conftest",
    "helpers",
    "kv_cache_helpers",
    "segment_helpers",
    "spec_corpus",
    "tune_helpers",
)


@pytest.mark.parametrize(
    "modules, loads_jax",
    [
        (_JAX_FREE_HELPERS, False),
        (("svgen.runtime.variant", "svgen.runtime.gpu_variant"), False),
        (("kernel_helpers",), True),
    ],
    ids=["conftest_and_numpy_helpers", "kernel_variants", "kernel_helpers_control"],
)
def test_conftest_and_the_numpy_helpers_load_no_jax(modules, loads_jax):
    """pytest imports conftest.py before every test, and the spec, IR, analysis and codegen
    tests import helpers.py: neither loads JAX, so `pytest tests/test_spec.py` never does.
    Nor do the kernels' declared variants, which the cost model reads. kernel_helpers.py (Pallas's interpreter) does: the control that shows the check sees it."""
    done = run_python("-c", _JAX_LOADED_BY, *modules)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == (["jax", "jaxlib"] if loads_jax else []), done.stdout


def _device(root, name: str, vendor: str, device: str) -> None:
    path = root / name
    path.mkdir(parents=True)
    (path / "vendor").write_text(vendor + "\n")
    (path / "device").write_text(device + "\n")


@pytest.mark.parametrize(
    "devices,attached",
    [
        ([], False),
        ([("0x8086", "0x1237"), ("0x1af4", "0x1000")], False),  # a host bridge, virtio
        ([("0x1ae0", "0x0042")], False),  # gVNIC, the network card of a Google Cloud VM
        ([("0x1ae0", "0x006f")], True),  # a TPU v6e chip
        ([("0x1ae0", "0x0042"), ("0x1ae0", "0x0063")], True),  # v5e beside gVNIC
        ([("0x1ae0", "0x9999")], True),  # an unknown Google device: maybe a newer TPU
    ],
)
def test_tpu_probe_reads_the_pci_devices(tmp_path, devices, attached):
    for i, (vendor, device) in enumerate(devices):
        _device(tmp_path, f"0000:00:{i:02x}.0", vendor, device)
    assert libtpu_env._tpu_chips_attached(str(tmp_path)) is attached


def test_tpu_probe_without_a_pci_bus_finds_no_chip(tmp_path):
    assert libtpu_env._tpu_chips_attached(str(tmp_path / "missing")) is False


@pytest.mark.parametrize("attached", [False, True])
def test_quiet_sets_only_the_no_chip_variables_and_only_without_chips(monkeypatch, attached):
    """What a generated module sets on import: never the sharing variable (on a TPU VM,
    libtpu's lock must keep two processes off the same chips), the no-chip ones only where
    no chip is attached; values already set win."""
    for name in (*libtpu_env.SHARING, *libtpu_env.NO_CHIP):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_HOST_BOUNDS", "2,2,1")
    monkeypatch.setattr(libtpu_env, "_tpu_chips_attached", lambda: attached)
    libtpu_env.quiet()
    assert "ALLOW_MULTIPLE_LIBTPU_LOAD" not in os.environ
    assert os.environ["TPU_HOST_BOUNDS"] == "2,2,1"
    assert ("TPU_WORKER_HOSTNAMES" in os.environ) == (not attached)
