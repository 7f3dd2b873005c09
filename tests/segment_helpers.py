"""Segment ids the run-time segment tests share (no test module imports another): random
layouts that cut tiles anywhere, and packings of whole-frame videos with their prompts for
per-video frame numbering; the two-pattern spec with a `runtime:` section that
test_runtime_segments.py's shard_map subprocess compiles too."""

from __future__ import annotations

import numpy as np

from spec_corpus import ANCHOR, any_of
from spec_corpus import spec_text as build_spec


def random_segment_ids(rng, seq: int) -> np.ndarray:
    """Contiguous segments cut anywhere (tiles and compute blocks cut too), one-token ones
    included, some marked padding (negative), with ids in order, with gaps or shuffled."""
    mode = rng.choice(["order", "gaps", "shuffled", "one", "each"])
    if mode == "one":
        return np.full(seq, int(rng.integers(0, 5)), np.int32)
    if mode == "each":
        return np.arange(seq, dtype=np.int32)
    starts = np.zeros(seq, np.int64)
    starts[np.flatnonzero(rng.random(seq - 1) < rng.choice([0.005, 0.02, 0.2])) + 1] = 1
    starts[int(rng.integers(1, seq))] = 1  # at least two segments
    ids = np.cumsum(starts)
    if mode == "gaps":
        ids = np.cumsum(rng.integers(1, 4, size=ids.max() + 1))[ids]
    elif mode == "shuffled":
        ids = rng.permutation(ids.max() + 1)[ids]
    ids = ids.astype(np.int32)
    if rng.random() < 0.5:  # a run of padding tokens
        start = int(rng.integers(0, seq))
        ids[start : start + int(rng.integers(1, 40))] = -1
    return ids


def packed_ids(rng, layout) -> np.ndarray:
    """Whole-frame videos of random lengths in random frames (some frames padding), each with
    its own text slots of which a random number are real; ids with gaps, in any order."""
    ids = np.full(layout.seq_len, -1, np.int32)
    per_frame = layout.tokens_per_frame
    cuts = np.sort(rng.choice(np.arange(1, layout.frames), rng.integers(1, 4), replace=False))
    pieces = np.split(np.arange(layout.frames), cuts)
    labels = rng.permutation(len(pieces)) * int(rng.integers(1, 4)) + int(rng.integers(0, 3))
    slot_cuts = np.sort(rng.choice(np.arange(1, layout.text_tokens), len(pieces) - 1, False))
    slots = np.split(np.arange(layout.text_tokens), slot_cuts)
    for frames, label, text in zip(pieces, labels, slots):
        if rng.random() < 0.15:
            continue  # unused frames and slots: padding
        start = layout.video_start + frames[0] * per_frame
        ids[start : start + len(frames) * per_frame] = label
        real = text[: int(rng.integers(0, len(text) + 1))]
        ids[layout.text_start + real] = label
    return ids


def late_video_ids(layout) -> np.ndarray:
    """Two videos, the second starting at frame 2 and four frames long (so that its frames
    move under per-video numbering for every mask here), each with half the text slots."""
    ids = np.full(layout.seq_len, -1, np.int32)
    split = layout.video_start + 2 * layout.tokens_per_frame
    ids[layout.video_start : split] = 4
    ids[split : layout.video_start + layout.video_tokens] = 1
    half = layout.text_tokens // 2
    ids[layout.text_start : layout.text_start + half] = 4
    ids[layout.text_start + half : layout.text_start + layout.text_tokens] = 1
    return ids


def check_element_grads(got, want, element: int, tolerance: float = 1e-4) -> None:
    """Batched gradients (dq, dk, dv) of one batch element against float64 ones: finite, and
    relative L2 error within `tolerance`, on a scale floored at 1 (with one token per
    segment ds is 0 in exact arithmetic: one key gets all the probability, and dq, dk are
    rounding noise)."""
    for name, a, w in zip(("dq", "dk", "dv"), got, want):
        a = np.asarray(a[element], np.float64)
        assert np.all(np.isfinite(a)), f"{name}: non-finite values"
        error = np.linalg.norm(a - w) / max(np.linalg.norm(w), 1.0)
        assert error <= tolerance, f"{name} of element {element}: relative error {error:.2e}"


# -- the run-time segment tests' specs (test_runtime_segments.py) ---------------------------

GEOMETRY = "{frames: 5, height: 4, width: 26, text_tokens: 40, text_position: %s}"

#: The small specs' spatial pattern with text attending and attended globally.
SPATIAL_AND_TEXT = any_of(ANCHOR, "{spatial_window: {frames: 1}}", "{text: {}}")
#: Text queries and keys, as an expr.
TEXT_EXPR = '{expr: "is_text_q or is_text_k"}'

TWO_PATTERNS = build_spec(
    "runtime_two",
    "%(geometry)s",
    3,
    head_dim=64,
    dtype="%(dtype)s",
    patterns={
        "spatial": SPATIAL_AND_TEXT,
        "temporal": any_of(ANCHOR, "{temporal_stride: {rows: 0, cols: 0}}", TEXT_EXPR),
    },
    layouts={"temporal": "temporal_major"},
    tiling="{block_q: 128, block_kv: 256}",
    runtime="{segments: true, text_lengths: true}",
)


def spec_text(template: str, *, layout="frame_major", dtype="float32", text_position="last"):
    geometry = GEOMETRY % text_position
    return template % dict(geometry=geometry, layout=layout, dtype=dtype)
