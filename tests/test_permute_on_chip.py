"""bench/permute_on_chip.py in Pallas's interpreter on the CPU: every way of moving tokens it
times gives the layout's permutation and its inverse (the timings mean nothing here)."""

from __future__ import annotations

import json
import sys

sys.path.insert(0, "bench")
import permute_on_chip  # noqa: E402

SPEC = """\
svgen: 1
name: small_{name}
geometry: {{frames: 5, height: 8, width: 16}}
attention: {{heads: 2, head_dim: 128, dtype: bfloat16}}
layout: {layout}
mask:
  any_of:
    - first_frame: {{frames: 1}}
    - temporal_stride: {{rows: 0, cols: 0}}
tiling: {{block_q: 128, block_kv: 128}}
"""


def test_every_way_is_the_permutation(tmp_path):
    specs = []
    for name, layout in (("columns", "{order: [w, h, f]}"), ("temporal", "temporal_major")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(SPEC.format(name=name, layout=layout))
        specs.append(str(path))
    out = tmp_path / "permute.json"
    argv = [*specs, "--order", "f,w,h", "--cube", "1,4,8", "--interpret", "--target", "v5e"]
    assert permute_on_chip.main([*argv, "--iters", "1", "--json", str(out)]) == 0
    results = {r["spec"]: r["ways"] for r in json.loads(out.read_text())["results"]}
    assert set(results) == {
        "small_columns",
        "small_temporal",
        "small_columns [f,w,h]",
        "small_columns cubes 1x4x8",
    }
    for ways in results.values():
        for way, entry in ways.items():
            if way != "copy":
                assert entry["matches"] and entry["inverse_matches"], way
    # The permute kernel takes the temporal-major head of the video's own frame only.
    assert "pallas" in results["small_temporal"]
    assert "pallas" not in results["small_columns"]
    assert "one_transpose" not in results["small_columns cubes 1x4x8"]
