"""Per-video frame numbering of packed segments (`runtime.per_video_frames`,
svgen.analysis.video_frames, svgen.runtime.video_frames): each video segment counts its frames
from its own first frame. The kernels against a float64 dense reference built by brute force
from the same packing (NaN-poisoned interpret mode, three layouts, f32 and bf16, gradients,
vmap, one compile), the blocks a call refines against brute force, ids that cut frames under
jit, and the masks and specs that are refused."""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import TOLERANCE, compile_spec_text, user_order_keep
from kernel_helpers import POISONED, reference_grads
from segment_helpers import (
    SPATIAL_AND_TEXT,
    TEXT_EXPR,
    check_element_grads,
    late_video_ids,
    packed_ids,
)
from spec_corpus import any_of
from spec_corpus import spec_text as build_spec
from svgen.spec.errors import SpecError
from svgen.runtime import backward, segments
from svgen.core.kinds import TileKind
from svgen.runtime.reference import masked_attention_reference
from svgen.runtime.refine import SEGMENT_BOUNDARY
from svgen.core.tables import BITS_PER_BLOCK, KIND_MASK
from svgen.spec import parse_spec

SPEC = """
svgen: 1
name: per_video
geometry: {frames: 6, height: 4, width: 26, text_tokens: 40, text_position: %(text)s}
attention: {heads: 2, head_dim: 64, dtype: %(dtype)s}
layout: %(layout)s
mask: %(mask)s
tiling: {block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}
runtime: {segments: true, text_lengths: true, per_video_frames: true}
"""

MASKS = {
    # A first-frame anchor per video, with a window and text: the blog spec's shape.
    "anchor": "{any_of: [{spatial_window: {frames: 1}}, {first_frame: {frames: 2}}, {text: {}}]}",
    # Self-Forcing's: block-causal chunks of 2 frames counted from each video's start.
    "causal": "{all_of: [{any_of: [{first_frame: {}}, {spatial_window: {frames: 2}}]}, "
    "{block_causal: {frames: 2}}]}",
    # An anchor or a conjunction of windows and a parity, one coords.fields whose query
    # function reads frames: with per-video frames it is computed on each block from the
    # shifted frames (video_frames.ShiftedFrames), so its coordinates are decoded too.
    "fields": '{any_of: [{first_frame: {}}, {expr: "not is_text_q and not is_text_k and '
    "abs(f_q - f_k) <= 2 and (f_q - f_k) % 2 == 0 and abs(h_q - h_k) <= 1 and "
    'abs(w_q - w_k) <= 3"}]}',
}
LAYOUTS = ["frame_major", "temporal_major", "{tiled: {frames: 2, rows: 2, cols: 13}}"]


def spec_text(mask="anchor", layout="frame_major", dtype="float32", text="last"):
    return SPEC % dict(mask=MASKS.get(mask, mask), layout=layout, dtype=dtype, text=text)


def frame_starts(layout, ids, rule: str = "first") -> np.ndarray:
    """Each token's segment start in the user's order. rule "first": the segment's first
    video frame (the documented meaning); "range": the first frame whose [least, greatest]
    non-negative video id holds the id (what a call computes; the same for whole frames)."""
    ids = np.asarray(ids, np.int64)
    frame = np.full(layout.seq_len, -1)
    video = np.arange(layout.video_start, layout.video_start + layout.video_tokens)
    frame[video] = (video - layout.video_start) // layout.tokens_per_frame
    ranges = []  # per frame: (least, greatest) non-negative id of its video tokens, or None
    for f in range(layout.frames):
        real = ids[(frame == f) & (ids >= 0)]
        ranges.append((real.min(), real.max()) if len(real) else None)
    start = np.zeros(layout.seq_len, np.int64)
    for x in np.unique(ids[ids >= 0]):
        if rule == "first":
            frames = frame[(ids == x) & (frame >= 0)]
        else:
            frames = [f for f, r in enumerate(ranges) if r is not None and r[0] <= x <= r[1]]
        start[ids == x] = min(frames) if len(frames) else 0
    return start


def per_video_keep(pattern, ids, text_length=None, rule="first") -> np.ndarray:
    """Brute force, user order: the mask at each token's per-video frame, one segment, no
    padding on either side."""
    layout, seq = pattern.layout, pattern.layout.seq_len
    position = np.empty(seq, np.int64)
    position[layout.original_index(np.arange(seq))] = np.arange(seq)
    coords = layout.coordinates(position)
    shift = np.where(coords.is_text, 0, frame_starts(layout, ids, rule))
    local = dataclasses.replace(coords, frame=coords.frame - shift)
    keep = pattern.mask.evaluate(local.reshape(seq, 1), local.reshape(1, seq))
    ids = np.asarray(ids, np.int64)
    padding = ids < 0
    if text_length is not None:
        text = np.arange(seq) - layout.text_start
        padding |= (text >= 0) & (text < layout.text_tokens) & (text >= int(text_length))
    return keep & (ids[:, None] == ids[None, :]) & ~padding[:, None] & ~padding[None, :]


def random_inputs(rng, batch, seq, dtype):
    q, k, v = (rng.standard_normal((batch, 2, seq, 64)).astype(np.float32) for _ in range(3))
    if dtype == "bfloat16":
        q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    return q, k, v


def check(plan, out, q, k, v, ids, lengths, dtype, rule="first"):
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite output rows"
    q64, k64, v64 = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (q, k, v))
    for b in range(out.shape[0]):
        keep = per_video_keep(plan.patterns[0], ids[b], lengths[b], rule)
        for h in range(out.shape[1]):
            ref = masked_attention_reference(q64[b, h], k64[b, h], v64[b, h], keep)
            err = np.max(np.abs(out[b, h] - ref)) / max(np.max(np.abs(ref)), 1e-30)
            assert err <= TOLERANCE[dtype], f"element {b}, head {h}: error {err:.2e}"


def renumbered(plan, ids) -> bool:
    """Whether per-video numbering keeps other pairs than the sequence's numbering would
    (so that a kernel ignoring it fails the test)."""
    pattern = plan.patterns[0]
    same = (ids[:, None] == ids[None, :]) & (ids[:, None] >= 0)
    return bool(np.any(per_video_keep(pattern, ids) != (user_order_keep(pattern) & same)))


@pytest.mark.parametrize(
    "mask, layout, dtype",
    [("anchor", lay, dt) for lay in LAYOUTS for dt in ("float32", "bfloat16")]
    + [("causal", "frame_major", "float32"), ("causal", "temporal_major", "bfloat16")]
    + [("fields", "frame_major", "float32"), ("fields", "temporal_major", "bfloat16")],
)
def test_forward_against_float64(mask, layout, dtype, tmp_path):
    plan, module = compile_spec_text(spec_text(mask, layout, dtype), tmp_path)
    if mask == "fields":  # its query function's coordinates are decoded too
        (pattern,) = module._PATTERNS
        assert {"frame", "row", "col", module.boundary_mask_fields} <= set(pattern.query_coords)
    assert plan.video_frames and plan.video_frames[0] is not None
    rng = np.random.default_rng(zlib.crc32(f"{mask} {layout} {dtype}".encode()))
    seq, batch = plan.layout.seq_len, 3
    q, k, v = random_inputs(rng, batch, seq, dtype)
    run = jax.jit(
        lambda q, k, v, s, t: module.attention(
            q, k, v, segment_ids=s, text_lengths=t, interpret=POISONED
        )
    )
    assert renumbered(plan, late_video_ids(plan.layout)), "the test could not fail"
    for first in (late_video_ids(plan.layout), packed_ids(rng, plan.layout)):
        # Other packings, the same compiled function.
        ids = np.stack([first] + [packed_ids(rng, plan.layout) for _ in range(batch - 1)])
        lengths = np.array([40, 17, 0], np.int32)
        check(plan, run(q, k, v, ids, lengths), q, k, v, ids, lengths, dtype)
    assert run._cache_size() == 1


def test_text_lengths_alone_number_frames_from_zero(tmp_path):
    plan, module = compile_spec_text(spec_text("causal"), tmp_path)
    rng = np.random.default_rng(1)
    q, k, v = random_inputs(rng, 2, plan.layout.seq_len, "float32")
    lengths = np.array([5, 40], np.int32)
    out = module.attention(q, k, v, text_lengths=lengths, interpret=POISONED)
    ids = np.zeros((2, plan.layout.seq_len), np.int32)
    check(plan, out, q, k, v, ids, lengths, "float32")


def test_ids_that_cut_frames(tmp_path):
    """Concrete ids that cut a frame are refused; traced ones run with one start per id (the
    first frame whose id range holds it) and never attend across segments."""
    plan, module = compile_spec_text(spec_text("anchor"), tmp_path)
    layout = plan.layout
    rng = np.random.default_rng(2)
    ids = packed_ids(rng, layout)
    cut = layout.video_start + 2 * layout.tokens_per_frame + 30
    ids[cut : cut + 150] = 7  # segment 7 starts inside frame 2 and ends inside frame 3
    q, k, v = random_inputs(rng, 1, layout.seq_len, "float32")
    with pytest.raises(ValueError, match=r"frame 2's video tokens belong to segments"):
        module.attention(q, k, v, segment_ids=ids[None], interpret=True)
    run = jax.jit(lambda s: module.attention(q, k, v, segment_ids=s, interpret=POISONED))
    out = run(jnp.asarray(ids[None]))
    check(plan, out, q, k, v, ids[None], [None], "float32", rule="range")


@pytest.mark.parametrize("fused", [True, False], ids=["fused_dq", "dq_kernel"])
def test_gradients_against_float64(fused, tmp_path, monkeypatch):
    monkeypatch.setattr(backward, "FUSED_DQ", fused)
    plan, module = compile_spec_text(spec_text("causal", "temporal_major"), tmp_path)
    rng = np.random.default_rng(3)
    seq, batch = plan.layout.seq_len, 2
    q, k, v = random_inputs(rng, batch, seq, "float32")
    do = rng.standard_normal(q.shape).astype(np.float32)
    ids = np.stack([late_video_ids(plan.layout), packed_ids(rng, plan.layout)])
    lengths = np.array([23, 40], np.int32)

    def loss(q, k, v, s, t):
        out = module.attention(q, k, v, segment_ids=s, text_lengths=t, interpret=POISONED)
        return jnp.sum(out * do)

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, ids, lengths)
    for b in range(batch):
        keep = per_video_keep(plan.patterns[0], ids[b], lengths[b])
        want = reference_grads(plan, q[b], k[b], v[b], [0, 0], do[b], keeps=[keep])
        check_element_grads(got, want, b)


def test_vmap_equals_the_batched_call(tmp_path):
    plan, module = compile_spec_text(spec_text("anchor"), tmp_path)
    rng = np.random.default_rng(4)
    q, k, v = random_inputs(rng, 3, plan.layout.seq_len, "float32")
    ids = np.stack([late_video_ids(plan.layout)] + [packed_ids(rng, plan.layout) for _ in "ab"])
    lengths = np.array([40, 3, 19], np.int32)

    def one(q, k, v, s, t):
        return module.attention(q, k, v, segment_ids=s, text_lengths=t, interpret=POISONED)

    mapped = jax.jit(jax.vmap(one))(q, k, v, ids, lengths)
    check(plan, mapped, q, k, v, ids, lengths, "float32")
    np.testing.assert_allclose(np.asarray(mapped), np.asarray(jax.jit(one)(q, k, v, ids, lengths)))


def block_kinds_of_words(visits, words) -> dict:
    """{(row block, column block): kind} of the refined words of a walk's visits."""
    rq, rk = visits.q_blocks_per_tile, visits.kv_blocks_per_tile
    out = {}
    for v, word in enumerate(np.asarray(words).view(np.uint32).tolist()):
        for qi in range(rq):
            for ki in range(rk):
                kind = (word >> (BITS_PER_BLOCK * (qi * rk + ki))) & KIND_MASK
                out[int(visits.q_tile[v]) * rq + qi, int(visits.kv_tile[v]) * rk + ki] = kind
    return out


@pytest.mark.parametrize("mask", ["anchor", "causal"])
@pytest.mark.parametrize("transposed", [False, True], ids=["forward", "dkv_walk"])
def test_refined_blocks_against_brute_force(mask, transposed, tmp_path):
    """Every block a call keeps FULL holds only kept pairs, every block it drops holds none,
    and a block inside one segment is run at the shifted frames (SEGMENT_BOUNDARY) unless
    FULL; the per-video kinds find FULL and dropped blocks the superset alone would visit."""
    layout = "temporal_major" if mask == "anchor" else "frame_major"  # FULL blocks exist
    plan, module = compile_spec_text(spec_text(mask, layout), tmp_path)
    pattern, layout = module._PATTERNS[0], plan.layout
    shape = module.SHAPE
    tables = segments.SegmentTables.build(
        [pattern.runs], (0,), shape, 1, transposed, video=(pattern.video_frames,), layouts=(layout,)
    )
    visits, video = tables.visits[0], tables.video[0]
    order = layout.original_index(np.arange(layout.seq_len))
    rng = np.random.default_rng(5 + transposed)
    full = dropped = 0
    for attempt in range(6):
        user_ids = late_video_ids(layout) if attempt == 0 else packed_ids(rng, layout)
        ids = segments.call_ids(
            segments.RuntimeInputs(True, False, True), user_ids, None, None, [layout]
        )
        rows, cols = (ids.key, ids.query) if transposed else (ids.query, ids.key)
        words = tables.pattern_words(visits, video, rows[0, 0], cols[0, 0], ids.start[0, 0])
        keep = per_video_keep(plan.patterns[0], user_ids)[np.ix_(order, order)]
        keep = keep.T if transposed else keep
        cq, ckv = tables.shape.cq, tables.shape.ckv
        static = block_kinds_of_words(visits, visits.word)
        for (r, c), kind in block_kinds_of_words(visits, words).items():
            block = keep[r * cq : (r + 1) * cq, c * ckv : (c + 1) * ckv]
            if block.size == 0:
                continue
            if kind == TileKind.EMPTY:
                assert not block.any(), f"block {r, c} dropped but holds kept pairs"
                dropped += static[r, c] != TileKind.EMPTY
            elif kind == TileKind.FULL:
                assert block.all(), f"block {r, c} FULL but drops pairs"
                full += 1
            assert kind in (TileKind.EMPTY, TileKind.FULL, SEGMENT_BOUNDARY, TileKind.BOUNDARY)
        # Blocks the call does not visit: the static ones it dropped, and the rest hold nothing.
        visited = block_kinds_of_words(visits, words)
        for r in range(keep.shape[0] // cq + 1):
            for c in range(keep.shape[1] // ckv + 1):
                if (r, c) not in visited:
                    block = keep[r * cq : (r + 1) * cq, c * ckv : (c + 1) * ckv]
                    assert not block.any(), f"block {r, c} holds kept pairs, not visited"
    assert full and dropped, "no FULL or dropped block: the refinement was not exercised"


def test_plain_boundary_runs_only_where_frames_did_not_move(tmp_path):
    """Inside a segment starting at frame 0 a BOUNDARY block runs the static code (the
    sequence's frames are the video's); inside one starting later it is SEGMENT_BOUNDARY,
    whose mask reads the shifted frames."""
    plan, module = compile_spec_text(spec_text("anchor"), tmp_path)
    pattern, layout = module._PATTERNS[0], plan.layout
    tables = segments.SegmentTables.build(
        [pattern.runs], (0,), module.SHAPE, 1, False, video=(pattern.video_frames,),
        layouts=(layout,),
    )  # fmt: skip
    visits = tables.visits[0]
    late = np.full(layout.seq_len, -1, np.int32)
    late[
        layout.video_start + 2 * layout.tokens_per_frame : layout.video_start + layout.video_tokens
    ] = 3
    late[layout.text_start : layout.text_start + layout.text_tokens] = 3
    kinds = {}
    for name, user_ids in (("start 0", np.full(layout.seq_len, 3, np.int32)), ("start 2", late)):
        ids = segments.call_ids(
            segments.RuntimeInputs(True, False, True), user_ids, None, None, [layout]
        )
        words = tables.pattern_words(
            visits, tables.video[0], ids.query[0, 0], ids.key[0, 0], ids.start[0, 0]
        )
        kinds[name] = set(block_kinds_of_words(visits, words).values())
    assert TileKind.BOUNDARY in kinds["start 0"] and SEGMENT_BOUNDARY not in kinds["start 0"]
    assert SEGMENT_BOUNDARY in kinds["start 2"]
    # Every block of the late video's is inside it or holds padding: none runs static code.
    assert TileKind.BOUNDARY not in kinds["start 2"]


def test_segment_starts_on_device():
    from svgen.core.layout import TokenLayout
    from svgen.runtime.video_frames import segment_starts

    lay = TokenLayout(frames=4, height=1, width=2, text_tokens=3, text_position="first")
    # text: 9, 5, pad; frames: [pad pad] [5 5] [9 9] [5 5]
    ids = jnp.asarray([[9, 5, -1, -1, -1, 5, 5, 9, 9, 5, 5]], jnp.int32)
    start, shift = segment_starts(ids, lay)
    np.testing.assert_array_equal(start, [[2, 1, 0, 0, 0, 1, 1, 2, 2, 1, 1]])
    np.testing.assert_array_equal(shift, [[0, 0, 0, 0, 0, 1, 1, 2, 2, 1, 1]])


@pytest.mark.parametrize(
    "mask, message",
    [
        ("{any_of: [{expr: 'f_k < 2'}, {spatial_window: {frames: 1}}]}", "absolute frame"),
        ("{expr: 'abs(f_q - f_k) <= 1'}", "absolute frame"),
        (
            "{cube_window: {cube_frames: 2, cube_rows: 2, cube_cols: 2, frames: 1, rows: 1,"
            " cols: 1}}",
            "cube_frames: 1",
        ),
        ("{all_of: [{spatial_window: {frames: 2}}, {not: {first_frame: {}}}]}", "`not` around"),
    ],
)
def test_masks_per_video_frames_cannot_take_are_refused(mask, message):
    text = spec_text(mask)
    spec = parse_spec(text, source="s.yaml")
    from svgen.analysis import analyze

    with pytest.raises(SpecError, match=message) as err:
        analyze(spec)
    assert err.value.key == "runtime.per_video_frames"
    assert (
        err.value.line
        == text.splitlines().index(
            next(line for line in text.splitlines() if "per_video_frames" in line)
        )
        + 1
    )


def test_the_documented_refusal_and_built_in_reading_hold():
    """docs/runtime.md's `expr` examples under per_video_frames say what svgen does (issue
    44: it quoted `f_k < 2` as refused, which compiles on a geometry without text): the
    quoted refusal is refused with and without text tokens, with the reason the page gives,
    and `f_k < 2` without text is read as first_frame: {frames: 2} (per video, as that
    built-in is tested above), with text refused (a text key's frame 0 passes it)."""
    import re

    from helpers import REPO
    from svgen import ir
    from svgen.analysis import analyze

    page = (REPO / "docs" / "runtime.md").read_text()
    quoted = re.search(r"`the mask expr: (.+?): reads absolute frame numbers \.\.\.`", page)
    assert quoted is not None, "docs/runtime.md quotes no per_video_frames refusal"
    no_text = spec_text().replace("text_tokens: 40", "text_tokens: 0")
    no_text = no_text.replace("text_lengths: true, ", "")
    for text in (spec_text, lambda mask: no_text.replace(MASKS["anchor"], mask)):
        with pytest.raises(SpecError, match="reads absolute frame numbers") as err:
            analyze(parse_spec(text(f"{{expr: '{quoted.group(1)}'}}"), source="s.yaml"))
        assert err.value.key == "runtime.per_video_frames"
    assert "`f_k < 2` is `first_frame: {frames: 2}`" in " ".join(page.split())
    spec = parse_spec(no_text.replace(MASKS["anchor"], "{expr: 'f_k < 2'}"), source="s.yaml")
    assert ir.lower(spec) == ir.FirstFrame(2)
    assert analyze(spec).video_frames
    with pytest.raises(SpecError, match="f_k < 2: reads absolute frame numbers"):
        analyze(parse_spec(spec_text("{expr: 'f_k < 2'}"), source="s.yaml"))


def test_masks_that_mean_the_same_at_every_start_need_no_tables(tmp_path):
    guarded = "{expr: 'abs(f_q - f_k) <= 1 and not is_text_q and not is_text_k'}"
    for mask in (guarded, "{any_of: [{spatial_window: {frames: 1}}, {text: {}}]}"):
        plan, module = compile_spec_text(spec_text(mask), tmp_path / str(len(mask)))
        assert plan.video_frames == ()
        assert module._PATTERNS[0].video_frames is None


def test_per_video_frames_needs_segments_and_enters_the_digest():
    base = spec_text("anchor")
    with pytest.raises(SpecError, match="needs `segments: true`"):
        parse_spec(base.replace("segments: true, ", ""), source="s.yaml")
    off = base.replace(", per_video_frames: true", "")
    assert parse_spec(base, source="a").digest != parse_spec(off, source="a").digest
    explicit_off = base.replace("per_video_frames: true", "per_video_frames: false")
    assert parse_spec(explicit_off, source="a").digest == parse_spec(off, source="a").digest


@pytest.mark.parametrize("mask", ["causal", "fields"])
def test_gpu_forward_against_float64(mask, tmp_path):
    plan, module = compile_spec_text(spec_text(mask), tmp_path, target_name="h100")
    rng = np.random.default_rng(7)
    q, k, v = random_inputs(rng, 2, plan.layout.seq_len, "float32")
    ids = np.stack([late_video_ids(plan.layout), packed_ids(rng, plan.layout)])
    lengths = np.array([40, 11], np.int32)
    out = module.attention(q, k, v, segment_ids=ids, text_lengths=lengths, interpret=True)
    check(plan, out, q, k, v, ids, lengths, "float32")


TWO_PATTERNS = build_spec(
    "per_video_two",
    (6, 4, 26, 40, "first"),
    3,
    head_dim=64,
    patterns={
        "spatial": SPATIAL_AND_TEXT,
        "temporal": "{all_of: ["
        + any_of("{first_frame: {frames: 2}}", "{temporal_stride: {rows: 0, cols: 0}}", TEXT_EXPR)
        + ", {block_causal: {frames: 3}}]}",
    },
    layouts={"temporal": "temporal_major"},
    tiling="{block_q: 128, block_kv: 256}",
    runtime="{segments: true, per_video_frames: true}",
)


def test_two_patterns_with_a_traced_head_pattern(tmp_path):
    plan, module = compile_spec_text(TWO_PATTERNS, tmp_path)
    assert all(v is not None for v in plan.video_frames)
    rng = np.random.default_rng(9)
    seq = plan.layout.seq_len
    q, k, v = (rng.standard_normal((2, 3, seq, 64)).astype(np.float32) for _ in range(3))
    head_pattern = jnp.asarray([1, 0, 1], jnp.int32)
    ids = np.stack([late_video_ids(plan.layout), packed_ids(rng, plan.layout)])
    run = jax.jit(
        lambda hp, s: module.attention(q, k, v, head_pattern=hp, segment_ids=s, interpret=POISONED)
    )
    out = np.asarray(run(head_pattern, ids))
    assert np.all(np.isfinite(out))
    for b in range(2):
        for h, p in enumerate([1, 0, 1]):
            keep = per_video_keep(plan.patterns[p], ids[b])
            ref = masked_attention_reference(
                q[b, h].astype(np.float64), k[b, h].astype(np.float64),
                v[b, h].astype(np.float64), keep,
            )  # fmt: skip
            err = np.max(np.abs(out[b, h] - ref)) / np.max(np.abs(ref))
            assert err <= TOLERANCE["float32"], f"element {b}, head {h}: {err:.2e}"


def test_generated_modules_are_formatted(tmp_path):
    from helpers import REPO, run_python

    for index, text in enumerate([spec_text("anchor"), spec_text("causal"), TWO_PATTERNS]):
        compile_spec_text(text, tmp_path / f"m{index}")
    config = str(REPO / "pyproject.toml")
    for command in (["format", "--check"], ["check"]):
        result = run_python("-m", "ruff", *command, "--config", config, str(tmp_path), cwd=None)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("mask", ["anchor", "causal"])
@pytest.mark.parametrize("layout", ["frame_major", "temporal_major"])
def test_one_video_from_frame_0_gives_the_compile_time_blocks(mask, layout, tmp_path):
    """The compile-time analysis as the oracle: for one segment starting at frame 0 (which
    the mask means at compile time) the per-video refinement of the superset visits exactly
    the compiler's blocks, each of its kind, except that a FULL block may come out BOUNDARY
    (the frame tree combines kinds, it does not re-classify the union) - never the reverse."""
    plan, module = compile_spec_text(spec_text(mask, layout), tmp_path)
    pattern, lay = module._PATTERNS[0], plan.layout
    ids = segments.call_ids(
        segments.RuntimeInputs(True, False, True), np.zeros(lay.seq_len, np.int32), None, None,
        [lay],
    )  # fmt: skip
    for transposed in (False, True):
        rows, cols = (ids.key, ids.query) if transposed else (ids.query, ids.key)
        refined = {}
        for video in ((pattern.video_frames,), ()):
            walk = segments.SegmentTables.build(
                [pattern.runs], (0,), module.SHAPE, 1, transposed, video=video, layouts=(lay,)
            )
            visits, kinds = walk.visits[0], walk.video[0] if video else None
            words = walk.pattern_words(visits, kinds, rows[0, 0], cols[0, 0], ids.start[0, 0])
            refined[bool(video)] = {
                b: k for b, k in block_kinds_of_words(visits, words).items() if k != 0
            }
        per_video, compiled = refined[True], refined[False]
        assert per_video.keys() == compiled.keys()
        for block, kind in compiled.items():
            assert per_video[block] in (kind, TileKind.BOUNDARY), (block, per_video[block], kind)
        changed = sum(per_video[b] != k for b, k in compiled.items())
        assert changed <= len(compiled) // 10, f"{changed} of {len(compiled)} blocks lost FULL"
