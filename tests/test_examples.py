"""examples/video_dit_layer.py runs, picks the planted head kinds and stays close to dense;
examples/packed_batch.py matches each packed video run alone."""

import importlib.util

from conftest import REPO


def test_video_dit_layer_example():
    spec = importlib.util.spec_from_file_location(
        "video_dit_layer", REPO / "examples" / "video_dit_layer.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = example.run(seed=1, verbose=False)
    assert len(rows) == 8
    for head, planted, chosen, error in rows:
        assert chosen == planted, (head, planted, chosen)
        assert error < 0.05, (head, error)


def test_packed_batch_example():
    spec = importlib.util.spec_from_file_location(
        "packed_batch", REPO / "examples" / "packed_batch.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.run(seed=3, verbose=False)
    assert result["worst_output_error"] <= 1e-5 and result["worst_gradient_error"] <= 1e-5
    for row in result["rows"]:  # steps: exactly the union of the per-video visited tiles
        assert row["steps"] == row["union"] <= row["static_steps"], row
    assert any(row["steps"] < row["static_steps"] for row in result["rows"])
