"""examples/video_dit_layer.py runs, picks the planted head kinds and stays close to dense."""

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
