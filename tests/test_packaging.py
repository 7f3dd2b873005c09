"""A plain (non-editable) install carries the templates under the distribution's own name, and
CI runs the README's commands."""

import re
import subprocess
import sys
import zipfile

from helpers import REPO, readme_blocks, readme_first_kernel_output

#: The distribution's name: the public index's `svgen` is an unrelated SVG tool.
DISTRIBUTION = "svgen-attention"


def test_wheel_contains_the_templates(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob(f"{DISTRIBUTION.replace('-', '_')}-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    templates = {
        f"svgen/templates/{name}"
        for name in (
            "common/module.py.j2",
            "common/mask_function.py.j2",
            "common/arguments.py.j2",
            "pallas_tpu/module.py.j2",
            "pallas_triton/module.py.j2",
        )
    }
    assert templates <= set(names), templates - set(names)  # every backend's, and the shared
    assert "svgen/runtime/kernel.py" in names
    assert {
        "svgen/analysis/gpu_specs/h100_sxm.txtpb",
        "svgen/analysis/gpu_specs/h200_sxm.txtpb",
    } <= set(names)


def test_ci_runs_exactly_the_readme_commands():
    """The README's first command installs what a user needs (no test tools, no GPU toolchain);
    its developer install and test command are named apart; CI runs all three, in order."""
    commands = readme_blocks("sh")
    user_install = commands[0]
    (developer_install,) = [c for c in commands if "'.[dev]'" in c]
    (test,) = [c for c in commands if "pytest" in c]
    assert user_install.startswith("python3 -m venv .venv && ")
    assert "[dev]" not in user_install and "gpu-aot" not in user_install
    assert "gpu-aot.txt" in developer_install
    ci = (REPO / ".ci" / "run").read_text()
    places = [ci.find(command) for command in (user_install, developer_install, test)]
    assert -1 not in places and places == sorted(places), places
    assert "### Developer and CI set-up" in (REPO / "README.md").read_text()
    # ... and, right after the first install, the first kernel (the README's compile line and
    # first Python snippet) with nothing more installed, checking what the README says it prints.
    (first_compile,) = [c for c in commands if "examples/first_kernel.yaml" in c]
    assert places[0] < ci.find(first_compile) < places[1]
    assert f"test \"$printed\" = '{readme_first_kernel_output()}'" in ci


def _requirements(names):
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {name: [Requirement(r) for r in groups[name]] for name in names}


def test_jax_is_a_range_and_libtpu_is_optional():
    """`pip install svgen-attention` takes a range of jax without libtpu (CPU-only environments,
    model environments with their own jax); `svgen-attention[tpu]` adds libtpu; the README's
    developer install (`.[dev]`) pins the exact jax[tpu] the tests and the cost model are
    checked with."""
    import jax

    groups = _requirements(["", "tpu", "dev"])
    (base,) = [r for r in groups[""] if r.name == "jax"]
    assert not base.extras and all(v in base.specifier for v in ("0.10.0", "0.10.2"))
    assert "0.11.0" not in base.specifier and "0.9.2" not in base.specifier
    (tpu,) = groups["tpu"]
    assert tpu.name == "jax" and tpu.extras == {"tpu"} and tpu.specifier == base.specifier
    (dev,) = [r for r in groups["dev"] if r.name == "jax"]
    assert dev.extras == {"tpu"} and str(dev.specifier) == "==0.10.2"
    assert jax.__version__ in dev.specifier and jax.__version__ in base.specifier


def test_gpu_toolchain_matches_the_tested_jax():
    """gpu-aot.txt (the README's developer install) and the install hint of svgen.chip.gpu_aot
    name the same packages, the CUDA plugin at exactly the jax version the tests run."""
    import jax

    from svgen.chip import gpu_aot

    lines = (REPO / "gpu-aot.txt").read_text().splitlines()
    pinned = [line for line in lines if line and not line.startswith("#")]
    assert pinned == gpu_aot.toolchain_packages()
    assert f"jax-cuda12-plugin=={jax.__version__}" in pinned


def test_the_distribution_is_not_the_public_svgen():
    """The project installs as `svgen-attention` (a name `pip install svgen` would not find:
    that is an unrelated SVG tool) and is still imported and run as `svgen`."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION
    assert project["scripts"] == {"svgen": "svgen.cli:main"}


#: An install line naming the public index's `svgen`: `pip install svgen` or `'svgen[tpu]'`.
_OLD_NAME = re.compile(r"pip install +['\"]?svgen(?![\w-])|['\"]svgen\[")


def test_no_install_line_names_the_public_svgen():
    """Every install line in the docs and in svgen's messages names `svgen-attention`."""
    texts = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "pyproject.toml"]
    texts += sorted((REPO / "docs").rglob("*.md")) + sorted((REPO / "svgen").rglob("*.py"))
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in texts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _OLD_NAME.search(line)
    ]
    assert found == []
    install = (REPO / "docs" / "install.md").read_text()
    assert f"pip install {DISTRIBUTION}" in install and f"'{DISTRIBUTION}[tpu]'" in install
