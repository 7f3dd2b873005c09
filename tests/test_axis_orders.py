"""`layout: {order: [a, b, c]}`: the video's tokens in any of the six orders of the axes f, h,
w (svgen.core.layout.AxisOrder). Two of them walk a frame column by column: their layouts are
of the transposed frame, and the compiler transposes the spec's mask to match (Node.transposed).

Each order is checked three ways, none of them through the code under test alone: the kernel
order is the lexicographic order of the axes; the plan's tile kinds equal brute force over
the mask the kernel runs; and that mask, taken back to the user's order, equals the spec's mask
evaluated on the user's own (frame, row, column) coordinates. The kernels run in Pallas's
interpreter against a float64 reference of the spec's mask in the user's order."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import yaml

from svgen import ir
from svgen.analysis import analyze
from svgen.core.layout import AxisOrder, TokenLayout
from svgen.spec import SpecError, parse_spec

from helpers import (
    brute_force_kinds,
    dense_keep,
    random_mask,
    user_order_keep,
)

ORDERS = [list(p) for p in itertools.permutations("fhw")]
GEOMETRY = {"frames": 4, "height": 5, "width": 7}


def _spec_text(
    order, mask, text=0, position="last", name="orders", geometry=GEOMETRY, **extra
) -> str:
    doc = {
        "svgen": 1,
        "name": name,
        "geometry": dict(geometry, text_tokens=text, text_position=position),
        "attention": {"heads": 2, "head_dim": 128, "dtype": "float32"},
        "layout": {"order": order},
        "mask": mask,
        "tiling": {"block_q": 128, "block_kv": 128},
        **extra,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _spec_keep(spec, plan) -> np.ndarray:
    """keep[q, k] in the user's order from the spec's own mask: (frame, row, column) of the
    user's frame-major tokens, i the token's place in the layout's nominal order."""
    pattern = plan.patterns[0]
    user = TokenLayout(**GEOMETRY, text_tokens=spec.geometry.text_tokens,
                       text_position=spec.geometry.text_position)  # fmt: skip
    coords = user.coordinates(np.arange(user.seq_len))
    nominal = pattern.layout.coordinates(pattern.layout.kernel_position).index
    coords = dataclasses.replace(coords, index=nominal)
    mask = ir.lower(spec, spec.pattern_mask(spec.head_patterns().candidates[0].pattern))
    return mask.evaluate(coords.reshape(-1, 1), coords.reshape(1, -1))


@pytest.mark.parametrize("order", ORDERS, ids="".join)
@pytest.mark.parametrize("text, position, anchors", [(0, "last", 0), (6, "first", 1)])
def test_kernel_order_is_the_lexicographic_order_of_the_axes(order, text, position, anchors):
    video = TokenLayout(**GEOMETRY, text_tokens=text, text_position=position)
    lay = video.with_order(AxisOrder(tuple(order)), anchors)
    index = lay.original_index(np.arange(lay.seq_len))
    assert sorted(index) == list(range(lay.seq_len))
    tokens = [i - video.video_start for i in index if 0 <= i - video.video_start < 140]
    h, w = GEOMETRY["height"], GEOMETRY["width"]
    coords = [{"f": t // (h * w), "h": t // w % h, "w": t % w} for t in tokens]
    if anchors and order[2] == "f":  # anchor frames first (their own order), then the rest
        coords = coords[h * w :]
    assert coords == sorted(coords, key=lambda c: [c[a] for a in order])
    x = np.random.default_rng(0).standard_normal((2, lay.seq_len, 3))
    assert np.array_equal(lay.to_kernel(x), x[:, index])
    assert np.array_equal(lay.from_kernel(lay.to_kernel(x)), x)
    assert lay.transposed == (order in (["f", "w", "h"], ["w", "h", "f"]))


MASKS = [
    {"any_of": [{"first_frame": {"frames": 1}}, {"spatial_window": {"frames": 1, "cols": 2}}]},
    {"temporal_stride": {"rows": 1, "cols": 0, "stride": 2}},
    {"expr": "abs(h_q - h_k) + 2 * abs(w_q - w_k) <= 3 and f_k <= f_q"},
    {"all_of": [{"band": {"width": 40}}, {"not": {"text": {}}}]},
    {
        "cube_window": {
            "cube_frames": 1,
            "cube_rows": 2,
            "cube_cols": 3,
            "frames": 1,
            "rows": 0,
            "cols": 1,
        }
    },
    {"neighborhood": {"rows": 3, "cols": 5, "frames": 3}},
]


@pytest.mark.parametrize("order", ORDERS, ids="".join)
@pytest.mark.parametrize("mask", MASKS, ids=lambda m: next(iter(m)))
def test_every_order_classifies_exactly_and_keeps_the_spec_mask(order, mask):
    for text, position in ((0, "last"), (6, "first")):
        spec = parse_spec(_spec_text(order, mask, text, position), source="orders.yaml")
        plan = analyze(spec)
        pattern = plan.patterns[0]
        kernel_keep = dense_keep(pattern.mask, pattern.layout)
        assert np.array_equal(pattern.kinds, brute_force_kinds(kernel_keep, 128, 128))
        assert np.array_equal(user_order_keep(pattern), _spec_keep(spec, plan))


@pytest.mark.parametrize("seed", range(6))
def test_random_masks_in_the_transposed_orders(seed):
    rng = np.random.default_rng(seed)
    video = TokenLayout(**GEOMETRY)
    for order in (["f", "w", "h"], ["w", "h", "f"]):
        mask = random_mask(rng, video)
        try:
            spec = parse_spec(_spec_text(order, mask), source="orders.yaml")
            plan = analyze(spec)
        except SpecError as err:  # radial: refused over a transposed frame, and said so
            assert "transposed frame" in str(err), err
            continue
        pattern = plan.patterns[0]
        kernel_keep = dense_keep(pattern.mask, pattern.layout)
        assert np.array_equal(pattern.kinds, brute_force_kinds(kernel_keep, 128, 128)), mask
        assert np.array_equal(user_order_keep(pattern), _spec_keep(spec, plan)), mask


@pytest.mark.parametrize("order", ORDERS, ids="".join)
def test_kernels_in_every_order_match_float64(order, compile_text):
    """The generated module, in Pallas's interpreter, against a float64 reference of the
    spec's own mask in the user's order (outputs poisoned: the interpreter starts them NaN);
    in the column-first orders the GPU kernel of the same module too."""
    import jax.numpy as jnp

    from svgen.runtime.reference import masked_attention_reference

    mask = {
        "any_of": [{"first_frame": {"frames": 1}}, {"spatial_window": {"frames": 1, "cols": 1}}]
    }
    text = _spec_text(order, mask, 6, "first")
    spec = parse_spec(text, source="orders.yaml")
    plan, module = compile_text(text)
    keep = _spec_keep(spec, plan)
    rng = np.random.default_rng(len("".join(order)))
    q, k, v = (rng.standard_normal((2, keep.shape[0], 128)).astype(np.float32) for _ in range(3))
    runs = [module.attention]
    if order in (["f", "w", "h"], ["w", "h", "f"]):  # the GPU kernel, from the same module
        from svgen.runtime import gpu

        runs.append(gpu.gpu_attention_of(module, block_q=64, block_kv=64))
    for attention in runs:
        out = np.asarray(attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), interpret=True))
        for head in range(2):
            x64 = (x[head].astype(np.float64) for x in (q, k, v))
            ref = masked_attention_reference(*x64, keep)
            assert np.max(np.abs(out[head] - ref)) <= 2e-5 * max(np.max(np.abs(ref)), 1e-30)


def test_heads_of_different_orders_in_one_call(compile_text):
    import jax.numpy as jnp

    from svgen.runtime.reference import masked_attention_reference

    doc = yaml.safe_load(_spec_text(["f", "h", "w"], None))
    del doc["mask"], doc["layout"]
    window = {"spatial_window": {"frames": 1, "rows": 0, "cols": 2}}
    doc["patterns"] = {"a": window, "b": window}
    doc["heads"] = {
        "candidates": [
            {"pattern": "a", "layout": {"order": ["w", "h", "f"]}},
            {"pattern": "b", "layout": {"order": ["f", "w", "h"]}},
        ],
        "assign": ["a", "b"],
    }
    text = yaml.safe_dump(doc, sort_keys=False)
    plan, module = compile_text(text)
    assert [p.layout.transposed for p in plan.patterns] == [True, True]
    video = TokenLayout(**GEOMETRY)
    spec = parse_spec(text)
    keep = dense_keep(ir.lower(spec, spec.pattern_mask("a")), video)  # the user's order
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, video.seq_len, 128)).astype(np.float32) for _ in range(3))
    out = np.asarray(
        module.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), interpret=True)
    )
    for head in range(2):
        ref = masked_attention_reference(*(x[head].astype(np.float64) for x in (q, k, v)), keep)
        assert np.max(np.abs(out[head] - ref)) <= 2e-5 * np.max(np.abs(ref))


@pytest.mark.parametrize(
    "layout, message",
    [
        ("{order: [f, h]}", "a list of the axes f, h and w.*got 2 items"),
        ("{order: [f, h, h]}", "each once"),
        ("{order: [f, h, x]}", "must be one of f, h, w"),
        ("{order: fhw}", "a list of the axes"),
        ("{order: [f, h, w], tiled: {frames: 1, rows: 1, cols: 1}}", "give one of"),
    ],
)
def test_bad_orders_are_refused_at_their_key(layout, message):
    text = _spec_text(["f", "h", "w"], {"text": {}}).replace(
        "layout:\n  order:\n  - f\n  - h\n  - w\n", f"layout: {layout}\n"
    )
    assert f"layout: {layout}" in text
    with pytest.raises(SpecError, match=message) as err:
        parse_spec(text, source="bad.yaml")
    line = text.splitlines().index(f"layout: {layout}") + 1
    assert str(err.value).startswith(f"bad.yaml:{line}:")


def test_a_mask_with_no_transposed_form_is_refused_at_the_layout():
    text = _spec_text(["w", "h", "f"], {"radial": {"width": 8}})
    with pytest.raises(SpecError, match=r"layout \[w, h, f\] walks a frame column by column"):
        analyze(parse_spec(text, source="radial.yaml"))
    analyze(parse_spec(_spec_text(["h", "f", "w"], {"radial": {"width": 8}}), source="r.yaml"))


def test_orders_are_part_of_the_digest_and_refused_beside_a_kv_cache():
    plain = parse_spec(_spec_text(["f", "h", "w"], {"text": {}}), source="a.yaml")
    other = parse_spec(_spec_text(["w", "h", "f"], {"text": {}}), source="a.yaml")
    assert plain.digest != other.digest
    text = _spec_text(
        ["f", "w", "h"], {"block_causal": {"frames": 1}}, runtime={"kv_cache": {"chunk_frames": 1}}
    )
    with pytest.raises(SpecError, match="needs frame_major layouts.*order \\[f, w, h\\]"):
        parse_spec(text, source="kv.yaml")


def test_a_selection_candidate_is_taken_over_the_transposed_frame_too():
    """select.candidate is a mask like the pattern: its region, in a column-first order, is
    the one the same mask has as a pattern there (whose meaning the tests above check)."""
    candidate = {"spatial_window": {"frames": 0, "rows": 0, "cols": 2}}
    wide = {"frames": 3, "height": 16, "width": 24}
    for order in (["w", "h", "f"], ["f", "w", "h"], ["f", "h", "w"]):
        select = {"candidate": candidate, "top_k": {"k": 2}}
        first = {"spatial_window": {"frames": 0, "rows": 0, "cols": 0}}  # no anchors
        selecting = parse_spec(_spec_text(order, first, geometry=wide, select=select))
        as_mask = analyze(parse_spec(_spec_text(order, candidate, geometry=wide)))
        plan = analyze(selecting)
        assert np.array_equal(plan.candidate_runs[0], as_mask.patterns[0].table.runs), order


def test_inspect_speaks_of_the_video_and_says_the_frame_is_transposed(tmp_path, capsys):
    from svgen.cli import main

    spec_file = tmp_path / "columns.yaml"
    spec_file.write_text(_spec_text(["w", "h", "f"], {"spatial_window": {"frames": 1}}))
    assert main(["inspect", str(spec_file)]) == 0
    text = capsys.readouterr().out
    assert "Geometry: 4 frames x 5 x 7 = 140 video tokens" in text  # the video's, not 7 x 5
    assert "of the transposed frame (7 x 5" in text
    assert main(["inspect", "--json", str(spec_file)]) == 0
    assert '"transposed_frame": true' in capsys.readouterr().out


def test_packed_segments_in_a_column_first_order(compile_text):
    """Run-time segment ids are given in the user's order; in a column-first order they are
    moved with q, k and v (through the transposed frame) and compared in the kernel."""
    import jax.numpy as jnp

    from svgen.runtime.reference import masked_attention_reference

    mask = {"spatial_window": {"frames": 2, "cols": 2}}
    text = _spec_text(["f", "w", "h"], mask, runtime={"segments": True})
    spec = parse_spec(text, source="packed.yaml")
    plan, module = compile_text(text)
    video = TokenLayout(**GEOMETRY)
    # Runs of 10 tokens alternating between two segments: ids vary inside a frame, so ids
    # moved in any other order than q, k and v would pair the wrong tokens.
    ids = (np.arange(video.seq_len) // 10 % 2).astype(np.int32)
    keep = _spec_keep(spec, plan) & (ids[:, None] == ids[None, :])
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((2, video.seq_len, 128)).astype(np.float32) for _ in range(3))
    out = module.attention(
        jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), segment_ids=ids, interpret=True
    )
    for head in range(2):
        ref = masked_attention_reference(*(x[head].astype(np.float64) for x in (q, k, v)), keep)
        assert np.max(np.abs(np.asarray(out)[head] - ref)) <= 2e-5 * np.max(np.abs(ref))
