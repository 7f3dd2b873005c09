"""Lint: ruff's pyflakes and syntax rules over the code, the benches and the generated
modules (configured in pyproject.toml; ruff comes with the dev install)."""

import subprocess
import sys

from conftest import REPO


def test_ruff_finds_nothing():
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "svgen", "tests", "bench", "examples",
         "generated"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
