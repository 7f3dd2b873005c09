"""examples/video_dit_layer.py runs, picks the planted head kinds and stays close to dense;
examples/packed_batch.py matches each packed video run alone."""

import importlib.util

from conftest import REPO


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
