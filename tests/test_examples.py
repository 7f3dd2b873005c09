"""The README's first kernel runs exactly as printed; examples/video_dit_layer.py runs, picks the planted head kinds and stays close to dense;
examples/packed_batch.py matches each packed video run alone; examples/autoregressive_video.py
generates chunk by chunk with a KV cache what the full sequence computes at once;
examples/selected_denoising.py follows its selection through a denoising schedule;
examples/paro_calibrated.py writes PAROAttention's per-head orders and calibrated blocks as a spec;
examples/moc_routing.py and examples/vmoba_partitions.py write Mixture of Contexts' and VMoBA's rules."""

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

from helpers import REPO, readme_blocks, readme_first_kernel_output


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def test_video_dit_layer_example():
    rows = load_example("video_dit_layer").run(seed=1, verbose=False)
    assert len(rows) == 8
    for head, planted, chosen, error in rows:
        assert chosen == planted, (head, planted, chosen)
        assert error < 0.05, (head, error)


def test_packed_batch_example():
    result = load_example("packed_batch").run(seed=3, verbose=False)
    assert result["worst_output_error"] <= 1e-5 and result["worst_gradient_error"] <= 1e-5
    for row in result["rows"]:  # steps: exactly the union of the per-video visited tiles
        assert row["steps"] == row["union"] <= row["static_steps"], row
    assert any(row["steps"] < row["static_steps"] for row in result["rows"])


def test_autoregressive_video_example():
    example = load_example("autoregressive_video")
    result = example.run(seed=2, verbose=False)
    assert result["worst_attention_error"] <= example.TOLERANCE
    assert result["recompute_difference"] <= 1e-4
    # Each chunk walks only its own tiles: fewer steps than the full sequence, a quarter of
    # its q bytes; later chunks (more cache in the window) more than the first.
    steps = result["chunk_steps"]
    assert max(steps) < result["full_steps"] and steps[0] < steps[-1]
    assert result["chunk_q_bytes"] * 4 == result["full_q_bytes"]
    # The rolling cache: 2 sink frames and a ring of 4, of the video's 8.
    assert result["cache_keys"] * 8 == result["video_keys"] * 6


def test_selected_denoising_example():
    """One compiled select module through a denoising schedule: each step matches float64
    under its own selection, p going down keeps fewer pairs, and p never recompiles."""
    example = load_example("selected_denoising")
    result = example.run(seed=4, verbose=False)
    assert result["worst_error"] <= example.TOLERANCE
    assert result["compiles"] == 1
    densities = [row["density"] for row in result["rows"]]
    assert densities == sorted(densities, reverse=True) and densities[-1] < densities[0]
    assert all(min(row["steps_per_head"]) > 0 for row in result["rows"])


def test_paro_calibrated_example():
    """PAROAttention's rule (an order per head, calibrated blocks) as a spec with `blocks`:
    each planted head's order puts its axis first, its kept blocks hold more of its attention
    than their share, and the kernel matches attention under the mask the example builds from
    its own permutation and blocks (not svgen's layouts), in float64."""
    result = load_example("paro_calibrated").run(seed=4, verbose=False)
    for row in result["rows"]:
        assert row["order"][0] == row["planted"], row
        assert row["attention_kept"] > 1.5 * row["kept_blocks"], row
        assert row["error"] <= 1e-5, row
    assert (
        "layout: {order: [" in result["spec"] and "blocks: {file: paro_masks.npz" in result["spec"]
    )


def test_moc_routing_example():
    """Mixture of Contexts' rule (anchors, causal top-k frame routing, packed videos, k per
    head) as a spec: svgen chooses the frames the example's own routing does, and the kernel
    matches float64 attention under the mask built from the rule alone."""
    result = load_example("moc_routing").run(seed=5, top_k=(1, 2), verbose=False)
    for row in result["rows"]:
        assert row["same_choice"] and row["error"] <= 1e-5, row
    assert result["rows"][0]["routed"] < result["rows"][1]["routed"]  # k = 1 against k = 2
    assert "causal_frames" in result["spec"] and "segments: true" in result["spec"]


def test_vmoba_partitions_example():
    """VMoBA's 1-D, 2-D and 3-D key partitions (one layer kind each) with a threshold on the
    block scores: the kernel matches float64 attention under the mask built from each
    partition's definition alone, and the threshold leaves blocks out."""
    result = load_example("vmoba_partitions").run(seed=6, p=0.5, verbose=False)
    assert {row["partition"] for row in result["rows"]} == {"1d", "2d", "3d"}
    for row in result["rows"]:
        assert row["error"] <= 1e-5 and 0.25 < row["kept_blocks"] < 1.0, row


def test_readme_first_kernel_runs_as_printed(tmp_path):
    """The README's compile line and first Python snippet, exactly as printed, in a folder laid
    out like the repository (its `.venv`, `examples/first_kernel.yaml`), print what the README
    says they print."""
    (compile_line,) = [c for c in readme_blocks("sh") if "examples/first_kernel.yaml" in c]
    snippet = readme_blocks("python")[0]
    (tmp_path / ".venv").symlink_to(pathlib.Path(sys.prefix))  # the environment running us
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "first_kernel.yaml", tmp_path / "examples")
    env = {**os.environ, "SVGEN_CACHE_DIR": str(tmp_path / "cache")}
    compiled = subprocess.run(
        ["bash", "-c", compile_line], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert compiled.returncode == 0, compiled.stderr
    (tmp_path / "snippet.py").write_text(snippet + "\n")
    ran = subprocess.run(
        [".venv/bin/python", "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == readme_first_kernel_output() + "\n"
