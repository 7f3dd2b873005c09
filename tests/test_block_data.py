"""`blocks`: a block mask given as data (issue 45, item 1).

The mask is checked against the rule it states, keep(q, k) = bits[p_q // block, p_k //
block] in kernel order, written here from the array with NumPy alone; tile classes against
brute force; the kernels (forward and jax.grad, NaN-poisoned, interpret mode) against a
float64 reference; the file's every way of being wrong against its message; and the
generated files against themselves (deterministic, and stale when the file changes)."""

import pathlib

import numpy as np
import pytest

from svgen import ir
from svgen.analysis import analyze
from svgen.analysis.classify import TileGrid, classify_tiles
from svgen.spec import parse_spec
from svgen.spec.errors import SpecError

from helpers import brute_force_kinds, compile_spec_text, dense_keep, random_any_layout
from helpers import lower_mask_dict, mask_spec_text, run_svgen
from kernel_helpers import POISONED, check_grads, check_per_head, mixed_inputs
from tpu_helpers import v5e_gradient_hlo


def _rule(bits: np.ndarray, block: int, layout) -> np.ndarray:
    """keep[q, k] over kernel positions, from the array alone."""
    pos = np.arange(layout.seq_len)
    return bits[pos[:, None] // block, pos[None, :] // block]


def _save(path: pathlib.Path, array, name="mask") -> str:
    if path.suffix == ".npz":
        np.savez(path, **{name: array})
    else:
        np.save(path, array)
    return str(path)


def _lower(mask: dict, layout):
    """The node of `mask` (through the spec reader and lowering; a node does not depend on
    the spec's layout, the coordinates it is evaluated on carry it)."""
    return lower_mask_dict(mask, layout, 128, 128)[1]


@pytest.mark.parametrize("seed", range(12))
def test_mask_classes_and_pairs_match_the_rule(seed, tmp_path):
    """Pure data, or data under any_of / all_of / not with built-ins, in every token order:
    the IR keeps what the array says, and the tile classes and kept pairs are exact."""
    rng = np.random.default_rng(9100 + seed)
    layout = random_any_layout(rng)
    block = int(rng.choice([3, 8, 16, 40]))
    n = -(-layout.seq_len // block)
    bits = rng.random((3, n, n)) < rng.uniform(0.1, 0.6)
    file = _save(tmp_path / "masks.npy", bits.astype(np.uint8))
    head = int(rng.integers(3))
    data = {"blocks": {"file": file, "block": block, "head": head}}
    rule = _rule(bits[head], block, layout)
    c = layout.coordinates(np.arange(layout.seq_len))
    video = ~c.is_text[:, None] & ~c.is_text[None, :]
    window = video & (np.abs(c.frame[:, None] - c.frame[None, :]) <= 1)
    cases = [
        (data, rule),
        ({"any_of": [data, {"spatial_window": {"frames": 1}}]}, rule | window),
        ({"all_of": [data, {"not": {"spatial_window": {"frames": 1}}}]}, rule & ~window),
        ({"not": data}, ~rule),
    ]
    for mask_dict, want in cases:
        mask = _lower(mask_dict, layout)
        np.testing.assert_array_equal(dense_keep(mask, layout), want, err_msg=str(mask_dict))
        for bq, bkv in ((8, 16), (24, 8)):
            got = classify_tiles(mask, layout, TileGrid(layout.seq_len, bq, bkv))
            assert got.density_is_exact and got.kept_pairs == int(want.sum())
            np.testing.assert_array_equal(got.kinds, brute_force_kinds(want, bq, bkv))


SPEC = """
svgen: 1
name: {name}
geometry: {{frames: 4, height: 8, width: 16{text}}}
attention: {{heads: 2, head_dim: 128, dtype: {dtype}}}
layout: {layout}
patterns:
  data: {{blocks: {{file: {file}, block: {block}, head: 0}}}}
  mixed:
    any_of:
      - blocks: {{file: {file}, block: {block}, head: 1}}
      - first_frame: {{frames: 1}}
heads:
  candidates:
    - {{pattern: data}}
    - {{pattern: mixed}}
  assign: [data, mixed]
tiling: {tiling}
"""


def _kernel_spec(tmp_path, block, layout, text, tiling, dtype="float32", name="blocks", seed=0):
    seq = 4 * 8 * 16 + text
    n = -(-seq // block)
    bits = np.random.default_rng(seed).random((2, n, n)) < 0.4
    file = _save(tmp_path / f"{name}.npz", bits.astype(np.uint8), "masks")
    text_key = f", text_tokens: {text}" if text else ""
    return SPEC.format(
        name=name,
        text=text_key,
        dtype=dtype,
        layout=layout,
        file=file,
        block=block,
        tiling=tiling,
    )


@pytest.mark.parametrize(
    "block, layout, text, tiling",
    [
        # Data blocks smaller than a compute block and not dividing it, in temporal-major order.
        (48, "temporal_major", 0, "{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}"),
        # Blocks across the end of the video into the text tokens.
        (100, "frame_major", 40, "{block_q: 256, block_kv: 128, compute_q: 128, compute_kv: 128}"),
        # PAROAttention's setting: the head in another axis order, the mask in that order.
        (
            64,
            "{order: [w, h, f]}",
            0,
            "{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}",
        ),
        # Data blocks larger than a compute block: each compute block inside one of them.
        (256, "frame_major", 0, "{block_q: 128, block_kv: 256, compute_q: 128, compute_kv: 128}"),
    ],
)
def test_kernels_match_float64(tmp_path, block, layout, text, tiling):
    plan, module = compile_spec_text(_kernel_spec(tmp_path, block, layout, text, tiling), tmp_path)
    q, k, v = mixed_inputs(plan, "float32", seed=block, heads=2)
    out = module.attention(q, k, v, interpret=POISONED)
    check_per_head(plan, out, q, k, v, [0, 1], "float32")
    check_grads(plan, module, q, k, v, [0, 1], "float32")


def test_profile_reads_the_whole_table(tmp_path):
    """The module's reference path (profile, the Splash mask of `svgen bench`) gathers from
    the whole table; it keeps what the kernels keep."""
    from svgen.chip.splash_mask import pattern_keep

    tiling = "{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}"
    plan, module = compile_spec_text(
        _kernel_spec(tmp_path, 48, "frame_major", 24, tiling), tmp_path
    )
    pos = np.arange(plan.layout.seq_len, dtype=np.int32)
    for pattern, planned in zip(module._PATTERNS, plan.patterns):
        got = np.asarray(pattern_keep(pattern)(pos[:, None], pos[None, :]))
        np.testing.assert_array_equal(got, dense_keep(planned.mask, planned.layout))


def test_generated_files_are_deterministic_and_name_the_file(tmp_path):
    tiling = "{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}"
    text = _kernel_spec(tmp_path, 64, "frame_major", 0, tiling)
    plan = analyze(parse_spec(text, source="x.yaml"))
    from svgen import codegen

    first, second = codegen.render(plan, "x.yaml"), codegen.render(plan, "x.yaml")
    assert first == second
    module = first["blocks.py"].decode()
    digest = plan.patterns[0].mask.digest
    assert digest in module  # the source file's sha256, in full
    tables = [name for name in first if name.endswith(".npy")]
    assert tables and all(name in module for name in tables)


def test_check_fails_when_the_file_changes(tmp_path):
    (tmp_path / "specs").mkdir()
    n = -(-(4 * 8 * 16) // 64)
    data = tmp_path / "specs" / "calibrated.npy"
    np.save(data, np.eye(n, dtype=np.uint8))
    spec = (
        SPEC.format(
            name="calibrated",
            text="",
            dtype="float32",
            layout="frame_major",
            file="calibrated.npy",  # beside the spec
            block=64,
            tiling="{block_q: 128, block_kv: 128}",
        )
        .replace(", head: 0", "")
        .replace(", head: 1", "")
    )
    (tmp_path / "specs" / "calibrated.yaml").write_text(spec)

    def cli(*args):
        return run_svgen(*args, cwd=tmp_path)

    assert cli("compile", "specs/calibrated.yaml").returncode == 0
    assert cli("compile", "--check", "specs/calibrated.yaml").returncode == 0
    np.save(data, np.ones((n, n), np.uint8))
    result = cli("compile", "--check", "specs/calibrated.yaml")
    assert result.returncode == 1 and "stale" in result.stderr


def _error(tmp_path, params: dict, seq_layout=None) -> str:
    layout = seq_layout or random_any_layout(np.random.default_rng(5))
    text = mask_spec_text({"blocks": params}, layout, order=None)
    with pytest.raises(SpecError) as caught:
        ir.lower(parse_spec(text, source=str(tmp_path / "spec.yaml")))
    message = str(caught.value)
    assert "spec.yaml:" in message and "mask.blocks" in message  # file, line and key
    return message


def test_every_bad_file_gets_one_clear_error(tmp_path, monkeypatch):
    from svgen.core.layout import TokenLayout
    from svgen.spec import block_data

    layout = TokenLayout(frames=2, height=4, width=8)  # 64 tokens
    n = 64 // 8

    def error(params):
        return _error(tmp_path, {"block": 8, **params}, layout)

    good = np.zeros((n, n), np.uint8)
    assert "cannot read missing.npy" in error({"file": "missing.npy"})
    (tmp_path / "folder.npy").mkdir()
    assert "not a regular file" in error({"file": "folder.npy"})
    (tmp_path / "mask.txt").write_text("1 0\n0 1\n")
    assert ".npy or .npz" in error({"file": "mask.txt"})
    (tmp_path / "garbage.npy").write_bytes(b"not an array at all")
    assert "cannot read garbage.npy as .npy" in error({"file": "garbage.npy"})
    _save(tmp_path / "shape.npy", np.zeros((n, n + 1), np.uint8))
    assert f"8 x 9, expected {n} x {n}" in error({"file": "shape.npy"})
    _save(tmp_path / "float.npy", good.astype(np.float32))
    assert "boolean or integer dtype" in error({"file": "float.npy"})
    twos = good.copy()
    twos[3, 5] = 2
    _save(tmp_path / "twos.npy", twos)
    assert "only 0 and 1; 2 at [3, 5]" in error({"file": "twos.npy"})
    _save(tmp_path / "heads.npy", np.zeros((3, n, n), np.uint8))
    assert "give `head`" in error({"file": "heads.npy"})
    assert "must be below 3, got 3" in error({"file": "heads.npy", "head": 3})
    _save(tmp_path / "plain.npy", good)
    assert "with `head` the array must be" in error({"file": "plain.npy", "head": 0})
    assert "`array` names an array of a .npz" in error({"file": "plain.npy", "array": "m"})
    np.savez(tmp_path / "two.npz", a=good, b=good)
    assert "holds 2 arrays (a, b)" in error({"file": "two.npz"})
    assert "has no array 'c'" in error({"file": "two.npz", "array": "c"})
    named = {"blocks": {"file": str(tmp_path / "two.npz"), "block": 8, "array": "b"}}
    assert isinstance(ir.lower(parse_spec(mask_spec_text(named, layout, order=None))), ir.BlockData)
    monkeypatch.setattr(block_data, "MAX_BLOCK_ENTRIES", 10)
    block_data._load.cache_clear()
    assert "over the 10 a block mask may have" in error({"file": "plain.npy"})
    monkeypatch.setattr(block_data, "MAX_BLOCK_FILE_BYTES", 100)
    block_data._load.cache_clear()
    assert "over the 100 a block-mask file may have" in error({"file": "plain.npy"})


def test_parameters_are_checked_before_the_file_is_opened(tmp_path):
    layout = random_any_layout(np.random.default_rng(6))
    for params, words in (
        ({"block": 8}, "missing required key 'file'"),
        ({"file": "", "block": 8}, "non-empty string"),
        ({"file": 3, "block": 8}, "must be a string"),
        ({"file": "x" * 2000, "block": 8}, "at most 1024 characters"),
        ({"file": "m.npy", "block": 0}, "block"),
    ):
        text = mask_spec_text({"blocks": params}, layout, order=None)
        with pytest.raises(SpecError, match="mask.blocks") as caught:
            parse_spec(text)
        assert words in str(caught.value)


@pytest.mark.parametrize(
    "extra, words",
    [
        ("", "the h100 (GPU) kernel"),
        ("runtime: {segments: true}\n", "runtime: (packed videos"),
        ("runtime: {kv_cache: {chunk_frames: 2}}\n", "runtime.kv_cache"),
    ],
)
def test_calls_that_do_not_read_the_tables_are_refused(tmp_path, extra, words):
    """Run-time tables (packed videos, KV-cache chunks) and the GPU kernel do not read block
    tables yet: refused at the `blocks` key, before any work."""
    tiling = "{block_q: 128, block_kv: 128}"
    text = _kernel_spec(tmp_path, 64, "frame_major", 0, tiling) + extra
    target = "h100" if not extra else "v6e"
    with pytest.raises(SpecError, match="does not run with") as caught:
        analyze(parse_spec(text, source="x.yaml"), target_name=target)
    assert words in str(caught.value) and "x.yaml:" in str(caught.value)


def test_a_kernel_table_past_its_limit_is_refused_before_it_is_built(tmp_path, monkeypatch):
    import svgen.analysis as analysis

    text = _kernel_spec(tmp_path, 16, "frame_major", 0, "{block_q: 128, block_kv: 128}")
    plan = analyze(parse_spec(text, source="x.yaml"))  # 16-token blocks: 8 x 8 a block
    assert plan.patterns[0].mask.block == 16
    monkeypatch.setattr(analysis, "MAX_BLOCK_TABLE_BYTES", 1000)
    with pytest.raises(SpecError, match="over the 1,000 allowed") as caught:
        analyze(parse_spec(text, source="x.yaml"))
    assert "x.yaml:" in str(caught.value) and "x 8 x 8" in str(caught.value)


def test_select_over_a_block_mask_is_refused(tmp_path):
    file = _save(tmp_path / "m.npy", np.eye(8, dtype=np.uint8))
    text = f"""
svgen: 1
name: selected
geometry: {{frames: 4, height: 8, width: 16}}
attention: {{heads: 1, head_dim: 128, dtype: float32}}
mask: {{blocks: {{file: {file}, block: 64}}}}
select:
  candidate: {{spatial_window: {{frames: 1}}}}
  top_p: {{p: 0.9, min: 1, max: 2}}
tiling: {{block_q: 128, block_kv: 128}}
"""
    with pytest.raises(SpecError, match="does not run with select"):
        analyze(parse_spec(text, source="x.yaml"))


def test_kernels_compile_for_v5e(tmp_path):
    """Mosaic and libtpu accept the forward and the backward kernels that read the tables
    (AOT for a v5e on this host: not the chip's speed, only that it compiles)."""
    tiling = "{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}"
    text = _kernel_spec(tmp_path, 48, "frame_major", 0, tiling, dtype="bfloat16")
    _, module = compile_spec_text(text, tmp_path)
    hlo = v5e_gradient_hlo(module)
    assert hlo.count("tpu_custom_call") >= 2  # the forward and the dk/dv walk


@pytest.mark.parametrize("block", [512, 128])
def test_bench_data_masks_are_their_exprs(block):
    """bench/specs/blocks: each mask given as data is the mask of its `expr` twin (the chip
    compares their speed), compute block by compute block, and bit by bit: each data block's
    bit is the twin's keep at the block's first query and first key (the rule is constant
    over a pair of blocks). The study that writes the files, bench/make_block_masks.py, is
    not imported: the twin is the rule."""
    from svgen.spec import load_spec

    from helpers import REPO

    folder = REPO / "bench" / "specs" / "blocks"
    data = analyze(load_spec(folder / f"band_{block}_data.yaml"), target_name="v5e")
    expr = analyze(load_spec(folder / f"band_{block}_expr.yaml"), target_name="v5e")
    (d,), (e,) = data.patterns, expr.patterns
    np.testing.assert_array_equal(d.compute_kinds, e.compute_kinds)
    # The data's count is exact (the expr's analysis may leave tiles unproven: bounds).
    n = d.layout.seq_len
    sizes = (
        np.minimum(np.arange(1, d.mask.bits.shape[0] + 1) * block, n)
        - np.arange(d.mask.bits.shape[0]) * block
    )
    exact = int(sizes @ d.mask.bits.astype(np.int64) @ sizes)
    got = d.classification
    assert got.kept_pairs == got.kept_pairs_upper == exact
    assert e.classification.kept_pairs <= exact <= e.classification.kept_pairs_upper

    corners = e.layout.coordinates(np.arange(d.mask.bits.shape[0]) * block)
    twin = e.mask.evaluate(corners.reshape(-1, 1), corners.reshape(1, -1))
    np.testing.assert_array_equal(d.mask.bits.astype(bool), twin)


@pytest.mark.parametrize("seed", range(16))
def test_data_composed_with_random_masks(seed):
    """A random block mask under any_of / all_of / not with a random mask of the built-ins and
    predicates (helpers.random_mask, which leaves file primitives out): exact classes where
    the other mask's analysis is exact, sound where it bounds a predicate."""
    from helpers import PRIMITIVE_GENERATORS, random_mask

    rng = np.random.default_rng(9300 + seed)
    layout = random_any_layout(rng)
    data = {"blocks": PRIMITIVE_GENERATORS["blocks"](rng, layout)}
    other = random_mask(rng, layout)
    combined = [
        {"any_of": [data, other]},
        {"all_of": [data, other]},
        {"all_of": [{"not": data}, other]},
    ]
    for mask_dict in combined:
        mask = _lower(mask_dict, layout)
        keep = dense_keep(mask, layout)
        got = classify_tiles(mask, layout, TileGrid(layout.seq_len, 8, 16))
        want = brute_force_kinds(keep, 8, 16)
        assert got.kept_pairs <= int(keep.sum()) <= got.kept_pairs_upper
        if got.density_is_exact:
            np.testing.assert_array_equal(got.kinds, want, err_msg=str(mask_dict))
        else:
            from svgen.core.kinds import TileKind

            assert np.all((got.kinds != TileKind.EMPTY) | (want == TileKind.EMPTY))
            assert np.all((got.kinds != TileKind.FULL) | (want == TileKind.FULL))
