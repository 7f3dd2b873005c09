"""A plain (non-editable) install carries the templates, and CI runs the README's commands."""

import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_contains_the_templates(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("svgen-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "svgen/templates/pallas_tpu/module.py.j2" in names
    assert "svgen/runtime/kernel.py" in names


def test_ci_runs_exactly_the_readme_commands():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    blocks = readme.split("```sh\n")[1:3]
    install, test = (b.split("```")[0].strip() for b in blocks)
    assert install in ci and test in ci
