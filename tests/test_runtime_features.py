"""svgen.chip.runtime_features on a CPU, in Pallas's interpreter: a chunk step, a packed batch and
a selection call of small specs, svgen's output against Splash's given the same mask (and
segment ids), and the masks it hands Splash (a chunk's rectangle, a selection's superset)
against brute force."""

from __future__ import annotations

import json

import numpy as np

from helpers import dense_keep
from spec_corpus import ANCHOR, SPATIAL, any_of, spec_text
from svgen.chip import runtime_features
from svgen.chip.splash_mask import PackedKeep, packed_keep, pattern_keep

CHUNKS = spec_text(
    "tiny_chunks",
    (6, 8, 16),
    2,
    layout="frame_major",
    mask=SPATIAL,
    runtime="{kv_cache: {chunk_frames: 2}}",
)

PACKED = spec_text(
    "tiny_packed",
    (4, 8, 16),
    2,
    layout="frame_major",
    mask=any_of("{band: {width: 160}}", "{prefix: {tokens: 64}}"),
    runtime="{segments: true}",
)


SELECT = spec_text(
    "tiny_select",
    (4, 8, 16),
    2,
    layout="frame_major",
    mask=any_of(ANCHOR, "{spatial_window: {frames: 0}}"),
    select="{candidate: {spatial_window: {frames: 2}}, top_k: {k: 1}}",
)


def test_the_select_superset_is_the_mask_and_every_selectable_block(compile_text):
    plan, module = compile_text(SELECT)
    bits = runtime_features.superset_keep_bits(module, 512)
    keep = PackedKeep("superset", bits)[0:512, 0:512]
    selectable = np.kron(module.attention.select.selectable, np.ones((128, 128), bool))
    np.testing.assert_array_equal(keep, dense_keep(plan.mask, plan.layout) | selectable)


def test_the_chunk_mask_is_the_modules_mask_on_the_chunks_rows(compile_text):
    plan, module = compile_text(CHUNKS)
    pattern = module.attention.patterns[0]
    rows, seq = 256, plan.layout.seq_len
    bits = packed_keep(pattern_keep(pattern), 256, rows, seq, (384, 896))
    keep = PackedKeep("chunk 1", bits, 896)[0:384, 0:896]
    want = dense_keep(plan.mask, plan.layout)[256:512]
    assert keep.shape == (384, 896)
    np.testing.assert_array_equal(keep[:rows, :seq], want)
    assert not keep[rows:].any() and not keep[:, seq:].any()  # padding keeps nothing
    assert keep[:, 512:seq].sum() == 0  # block-causal: no key of a later chunk


def test_chunk_steps_and_a_packed_batch_in_the_interpreter(tmp_path, capsys):
    (tmp_path / "chunks.yaml").write_text(CHUNKS)
    (tmp_path / "packed.yaml").write_text(PACKED)
    out = tmp_path / "runtime.json"
    argv = ["--chunks", str(tmp_path / "chunks.yaml"), "--positions", "0,2"]
    argv += ["--packed", str(tmp_path / "packed.yaml"), "--videos", "2"]
    (tmp_path / "select.yaml").write_text(SELECT)
    argv += ["--select", str(tmp_path / "select.yaml")]
    argv += ["--blocks", "128,128,128", "--iters", "1", "--interpret", "--target", "v5e"]
    assert runtime_features.main(argv + ["--json", str(out)]) == 0
    chunks, packed, select = json.loads(out.read_text())["results"]
    for kernel in ("svgen", "splash_mask", "splash_dense"):
        assert "median_ms" in select[kernel], (kernel, select[kernel])
    assert 0 < select["superset_kept_fraction"] < 1
    assert [c["position"] for c in chunks["chunks"]] == [0, 2]
    for entry in chunks["chunks"] + [packed]:
        for kernel in ("svgen", "splash_mask", "splash_dense"):
            assert "median_ms" in entry[kernel], (kernel, entry[kernel])
        assert entry["max_difference"] < 1e-4  # svgen and Splash agree on every row
    table = capsys.readouterr().out
    assert "| tiny_chunks | chunk 2 |" in table and "| tiny_packed | 2 videos packed |" in table
    assert "| tiny_select | select (Splash: superset) |" in table


ORDERS = spec_text(
    "tiny_columns",
    (4, 8, 16),
    2,
    layout="{order: [w, h, f]}",
    mask=any_of(ANCHOR, "{spatial_window: {frames: 1, rows: 1, cols: 3}}"),
)


def test_an_axis_order_against_the_same_mask_frame_major_in_the_interpreter(tmp_path, capsys):
    (tmp_path / "orders.yaml").write_text(ORDERS)
    out = tmp_path / "orders.json"
    argv = ["--orders", str(tmp_path / "orders.yaml"), "--iters", "1", "--interpret"]
    assert runtime_features.main(argv + ["--target", "v5e", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    for call in ("user_order", "kernel_order", "frame_major"):
        assert "median_ms" in result[call], (call, result[call])
    assert result["layout"] == "temporal_major of the transposed frame"
    assert result["max_difference"] < 1e-4  # the same mask: the same outputs, user order
    table = capsys.readouterr().out
    assert "| tiny_columns | temporal_major of the transposed frame |" in table
    assert "| spec | call |" not in table  # no empty table of the other features


BOXES = spec_text(
    "tiny_boxes",
    (4, 8, 16),
    2,
    layout="{order: [h, w, f]}",
    mask="{temporal_stride: {rows: 0, cols: 1}}",
)


def test_place_boxes_against_moving_the_tokens_with_backward_in_the_interpreter(tmp_path, capsys):
    """--orders --backward on a spec whose tiles are place boxes: the call reading boxes, the
    same call with the tokens moved around the kernel, and with only the backward moving
    them, each forward and forward + backward, outputs compared."""
    (tmp_path / "boxes.yaml").write_text(BOXES)
    out = tmp_path / "boxes.json"
    argv = ["--orders", str(tmp_path / "boxes.yaml"), "--backward", "--iters", "1"]
    argv += ["--interpret", "--target", "v5e", "--json", str(out)]
    assert runtime_features.main(argv) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["box_dma"] == "PlaceBoxes"
    for call in ("user_order", "user_order_moved", "kernel_order", "frame_major"):
        for timed in (call, call + "_backward"):
            assert "median_ms" in result[timed], (timed, result[timed])
    assert "median_ms" in result["user_order_backward_moved"]
    assert result["moved_difference"] < 1e-5 and result["max_difference"] < 1e-4
    table = capsys.readouterr().out
    assert table.count("| tiny_boxes |") == 2  # the forward table and the fwd + bwd one


MIXED_BOXES = spec_text(
    "tiny_mixed_boxes",
    (4, 8, 16),
    2,
    patterns={
        "spatial": "{spatial_window: {frames: 0, rows: 1, cols: 2}}",
        "temporal": "{temporal_stride: {rows: 0, cols: 1}}",
    },
    layouts={"temporal": "{order: [h, w, f]}"},
    assign="[temporal, spatial]",
)


def test_head_runs_against_moving_the_tokens_in_the_interpreter(tmp_path, capsys):
    """--orders on heads of two layouts: a kernel call per run reading the user's order,
    against one call with the tokens moved around it (no frame-major twin of two patterns)."""
    (tmp_path / "mixed.yaml").write_text(MIXED_BOXES)
    out = tmp_path / "mixed.json"
    argv = ["--orders", str(tmp_path / "mixed.yaml"), "--iters", "1", "--interpret"]
    assert runtime_features.main(argv + ["--target", "v5e", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["box_dma"] == "2 head runs"
    for call in ("user_order", "user_order_moved", "kernel_order"):
        assert "median_ms" in result[call], (call, result[call])
    assert "frame_major" not in result and result["moved_difference"] < 1e-5
    assert "| tiny_mixed_boxes | frame_major / temporal_major |" in capsys.readouterr().out


SELECTED = spec_text(
    "tiny_selected",
    (8, 8, 16),
    2,
    layout="frame_major",
    patterns={"local": any_of(ANCHOR, "{spatial_window: {frames: 0}}"), "wide": SPATIAL},
    assign="[local, wide]",
    runtime="{segments: true}",
    select="{candidate: {causal_frames: {}}, top_k: {k: 1}, "
    "patterns: {wide: {candidate: {spatial_window: {frames: 3}}, top_k: {k: 2}}}}",
)


def test_splash_given_the_mask_a_call_selected_agrees_in_the_interpreter(tmp_path, capsys):
    """--selected: heads of two patterns, two packed videos; Splash runs, per head, the
    mask the call chose (its bits checked against the rule) and gives svgen's output."""
    (tmp_path / "selected.yaml").write_text(SELECTED)
    out = tmp_path / "selected.json"
    argv = ["--selected", str(tmp_path / "selected.yaml"), "--videos", "2", "--iters", "1"]
    argv += ["--blocks", "128,128,128", "--interpret", "--target", "v5e"]
    assert runtime_features.main(argv + ["--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    for kernel in ("svgen", "svgen_backward", "splash_mask", "splash_dense"):
        assert "median_ms" in result[kernel], (kernel, result[kernel])
    assert result["head_patterns"] == [0, 1] and min(result["chosen_blocks"]) > 0
    assert result["max_difference"] < 1e-4  # the same pairs: the same outputs
    assert "| tiny_selected | selected (2 video(s)) |" in capsys.readouterr().out


def test_a_selected_mask_is_the_pattern_and_the_chosen_blocks(compile_text):
    plan, module = compile_text(SELECTED.replace("runtime: {segments: true}\n", ""))
    chosen = np.zeros(module.attention.select.selectable.shape[1:], bool)
    chosen[2, 0] = chosen[3, 1] = True
    bits = runtime_features.selected_keep_bits(module, 1, chosen, 1024)
    keep = PackedKeep("head", bits)[0:1024, 0:1024]
    blocks = np.kron(chosen, np.ones((128, 128), bool))
    np.testing.assert_array_equal(keep, dense_keep(plan.patterns[1].mask, plan.layout) | blocks)


def test_splash_given_the_chosen_mask_in_a_curve_order_agrees_in_the_interpreter(tmp_path):
    """--selected on a Hilbert-ordered spec: both kernels in the curve's order (q, k, v
    moved once), Splash given each head's chosen mask there, the same outputs."""
    text = SELECTED.replace("runtime: {segments: true}\n", "").replace(
        "layout: frame_major", "layout: {curve: hilbert}"
    )
    (tmp_path / "curve.yaml").write_text(text.replace("tiny_selected", "tiny_curve"))
    out = tmp_path / "curve.json"
    argv = ["--selected", str(tmp_path / "curve.yaml"), "--iters", "1", "--blocks", "128,128,128"]
    assert runtime_features.main(argv + ["--interpret", "--target", "v5e", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert min(result["chosen_blocks"]) > 0 and result["max_difference"] < 1e-4
