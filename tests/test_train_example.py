"""examples/train_sparse_dit.py: training a tiny DiT block through the sparse kernel lowers
the loss and follows the dense masked-attention run step for step.

The example runs in a subprocess (as a user runs it: its own JAX start, libtpu prepared by the
script) and prints a `RESULT {json}` line; the checks here are made on those numbers, with
their own thresholds, not on the script's exit status alone. About a minute on two cores.
"""

import json
import subprocess
import sys

import numpy as np

from helpers import REPO

STEPS = 250  # the script's default: the loss's second fall (the heads learning) is at 150-250


def run_example(*args):
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_sparse_dit.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0][len("RESULT ") :])


def test_sparse_training_falls_and_matches_dense():
    result = run_example("--steps", str(STEPS), "--seed", "0")
    sparse, dense = np.array(result["sparse"]), np.array(result["dense"])
    assert sparse.shape == dense.shape == (STEPS,)
    assert np.all(np.isfinite(sparse)) and np.all(np.isfinite(dense))
    # The same weights and batch at step 0: the same loss up to float32 rounding.
    assert abs(sparse[0] - dense[0]) <= 1e-6 * dense[0]
    # The loss falls, to well under a third of where it started, in both runs.
    for losses in (sparse, dense):
        assert losses[-1] < 0.3 * losses[0], (losses[0], losses[-1])
        assert np.mean(losses[-10:]) < 0.3 * np.mean(losses[:10])
    # The two curves agree at every step (float32; the sums run in a different order).
    rel = np.abs(sparse - dense) / np.abs(dense)
    assert rel.max() <= 1e-4, (int(rel.argmax()), rel.max())
    assert result["max_rel_diff"] == rel.max()
    # The kernel's gradients are dense attention's, and the sparse run's weights stay with
    # the dense run's; not bit-identical (the sparse run really went through the kernel).
    assert result["grad_rel_diff"] <= 1e-5, result["grad_rel_diff"]
    assert 0.0 < result["weight_rel_diff"] <= 1e-3, result["weight_rel_diff"]
