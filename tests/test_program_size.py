"""The program-size budget (svgen.chip.program_size): the compiler counts each TPU module's
forward kernel program with libtpu on this host, leaves out straight-line bodies and then
residual-mask variants while it is over its chip's budget, and refuses, at the spec's tiling,
with the sizes and a tiling that fits, where that is not enough. The code left out is named in
the module, and the kernel built without it is still the mask's attention (float64 check)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from helpers import import_file, straight_band
from kernel_helpers import POISONED, check_per_head, mixed_inputs
from spec_corpus import ANCHOR, any_of, spec_text
from svgen import codegen
from svgen.analysis import analyze, targets
from svgen.core.program import SHRINK_STEPS, ProgramLimits
from svgen.chip import program_size
from svgen.spec import parse_spec

# A band with a prefix sink, 2 x 4 compute blocks per tile: two straight-line words.
BAND = straight_band("size_band")
# ... with a frame-local expr beside them: residual-mask variants (and no straight words).
RESIDUAL = straight_band("size_residual", beside=['{expr: "f_q == f_k and abs(h_q - h_k) <= 1"}'])


def _plan(text=BAND, target="v5e"):
    return analyze(parse_spec(text, source="size.yaml"), target_name=target)


def _render(plan):
    return codegen.render(plan, "specs/size.yaml")


def test_limits_are_said_in_the_module_and_the_default_module_says_nothing(tmp_path):
    plan = _plan()
    plain = _render(plan)["size_band.py"].decode()
    assert "program=" not in plain and "ProgramLimits" not in plain
    limited = dataclasses.replace(plan, program=SHRINK_STEPS[-1])
    files = _render(limited)
    text = files["size_band.py"].decode()
    assert "program=kernel.ProgramLimits(straight_words=0, residual_masks=False)," in text
    assert "v5e's budget of 64,000 bundles" in text
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    module = import_file(tmp_path / "size_band.py")
    assert module.attention.program == SHRINK_STEPS[-1]
    assert all(
        not code.straight_words and not code.residual_masks for code in module.attention.codes
    )


@pytest.mark.parametrize("text, code", [(BAND, "straight_words"), (RESIDUAL, "residual_masks")])
def test_a_kernel_without_the_left_out_code_is_still_the_masks_attention(tmp_path, text, code):
    """Fresh inputs, outputs poisoned, float64 reference: the module with its code and with
    everything the compiler may leave out left out."""
    plan = _plan(text)
    for step, limits in enumerate((ProgramLimits(), SHRINK_STEPS[-1])):
        folder = tmp_path / f"m{step}"
        folder.mkdir()
        for name, data in _render(dataclasses.replace(plan, program=limits)).items():
            (folder / name).write_bytes(data)
        module = import_file(folder / codegen.module_filename(plan.spec.name, "tpu"))
        present = any(getattr(c, code) for c in module.attention.codes)
        assert present == limits.is_default  # there by default, gone when left out
        q, k, v = mixed_inputs(plan, "float32", seed=10 + step, heads=2)
        # uninitialized memory is NaN: a row the kernel never writes fails the check
        out = module.attention(q, k, v, interpret=POISONED)
        check_per_head(plan, out, q, k, v, np.zeros(2, np.int32), "float32")


def test_fit_leaves_out_the_cheapest_code_first_and_stops_when_it_fits():
    plan = _plan()
    counts = {ProgramLimits(): 90_000, SHRINK_STEPS[0]: 70_000, SHRINK_STEPS[1]: 50_000}
    seen = []

    def count(files, candidate):
        seen.append(candidate.program)
        return counts[candidate.program]

    fitted, files, size = program_size.fit(plan, _render, count=count)
    assert seen == [ProgramLimits(), *SHRINK_STEPS]
    assert fitted.program == SHRINK_STEPS[1] and size.fits and size.bundles == 50_000
    assert b"residual_masks=False" in files["size_band.py"]
    assert "90,000 before the compiler left out" in size.words()
    assert size.to_json()["tried"][0] == {"left_out": None, "bundles": 90_000}
    counts[ProgramLimits()] = 60_000
    seen.clear()
    fitted, _, size = program_size.fit(plan, _render, count=count)
    assert seen == [ProgramLimits()] and fitted.program.is_default and size.limits.is_default


def test_over_budget_with_everything_left_out_is_refused_with_sizes_and_a_tiling():
    plan = _plan()

    def count(files, candidate):
        return 80_000

    with pytest.raises(program_size.OverBudget) as err:
        program_size.fit(plan, _render, count=count, suggest=lambda p: "the tiling X fits")
    text = str(err.value)
    assert "over v5e's budget of 64,000 bundles" in text and "80,000" in text
    assert text.endswith("the tiling X fits")


def test_smaller_tilings_cut_the_larger_side_first_down_to_one_block():
    assert program_size.smaller_tilings((1024, 2048, 512, 512)) == [
        (1024, 1024, 512, 512),
        (512, 1024, 512, 512),
        (512, 512, 512, 512),
    ]
    assert program_size.smaller_tilings((512, 512, 512, 512)) == []


def test_every_tpu_target_has_a_budget_and_only_v5es_is_measured():
    assert targets.TARGETS["v5e"].program_measured
    for name, target in targets.TARGETS.items():
        assert 40_000 <= target.program_bundles <= 71_080, name  # under the slow v5e program
        assert target.program_measured == (name == "v5e")


def test_compile_counts_the_program_and_refuses_one_over_budget(tmp_path, monkeypatch, capsys):
    """The real count (libtpu's AOT compile on this host): the default module fits v5e's
    budget; with the budget set under it, straight words go first, then residual masks, and
    where even that is over, `svgen compile` writes nothing and names a smaller tiling."""
    from svgen.cli import main

    monkeypatch.setattr(program_size, "SMALL_TILE_PAIRS", 0)  # count even these small tiles
    spec = tmp_path / "size.yaml"
    spec.write_text(BAND)
    plan = _plan()
    counts = program_size.kernel_bundles(_render(plan), plan)
    # One compile counts the forward kernel and the backward's (the dk/dv walk with dq fused).
    assert set(counts) == {"svgen_attention", "svgen_attention_dkv"}
    default = counts["svgen_attention"]
    without_straight = program_size.kernel_bundles(
        _render(dataclasses.replace(plan, program=SHRINK_STEPS[0])), plan
    )["svgen_attention"]
    assert 0 < without_straight < default < targets.TARGETS["v5e"].program_bundles
    out = tmp_path / "out"
    assert main(["compile", str(spec), "--target", "v5e", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"forward kernel program {default:,} bundles of v5e's budget" in err
    assert f"dkv {counts['svgen_attention_dkv']:,}" in err
    assert "ProgramLimits" not in (out / "size_band.py").read_text()

    tight = dataclasses.replace(
        targets.TARGETS["v5e"], program_bundles=(default + without_straight) // 2
    )
    monkeypatch.setitem(targets.TARGETS, "v5e", tight)
    assert main(["compile", str(spec), "--target", "v5e", "--out", str(out)]) == 0
    assert "ProgramLimits(straight_words=0)" in (out / "size_band.py").read_text()
    capsys.readouterr()

    # Under even the spec's tiling with its straight words left out (it has no residual masks
    # to leave out): refused, naming the largest smaller tiling whose program fits (fewer
    # compute blocks per tile, each counted), and nothing is written.
    over = dataclasses.replace(tight, program_bundles=without_straight - 1)
    monkeypatch.setitem(targets.TARGETS, "v5e", over)
    before = (out / "size_band.py").read_bytes()
    assert main(["compile", str(spec), "--target", "v5e", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "size.yaml:" in err and "tiling: the forward kernel's program is over" in err
    suggested = re.search(
        r"the tiling \{block_q: (\d+), block_kv: (\d+)[^}]*\} fits \(([\d,]+) bundles", err
    )
    assert suggested, err
    spec_tiling = _plan().spec.tiling
    assert int(suggested[1]) * int(suggested[2]) < spec_tiling.block_q * spec_tiling.block_kv
    assert int(suggested[3].replace(",", "")) <= without_straight - 1
    assert "svgen: nothing written" in err
    assert (out / "size_band.py").read_bytes() == before


def test_a_spec_without_a_tiling_gets_the_first_v5e_tiling_that_fits():
    """The chip-free pick: 1024x2048 / 512x512 where it fits with what the compiler may leave
    out, else 1024x1024 / 512x512, else 512x1024 / 512x512, else 512 x 512 (V5E_TILINGS);
    tilings the spec cannot take are passed over."""
    big = straight_band("size_big", geometry=(9, 16, 32))
    plan = _plan(big)
    assert [t[:2] for t in program_size.V5E_TILINGS] == [
        (1024, 2048),
        (1024, 1024),
        (512, 1024),
        (512, 512),
    ]

    def analyze_at(tiling):
        from svgen.chip.measured_tune import with_tiling

        return analyze(with_tiling(plan.spec, tiling), target_name="v5e")

    def counter(sizes):
        def count(files, candidate):
            t = candidate.spec.tiling
            return sizes.get((t.block_q, t.block_kv), {}).get(candidate.program, 10**6)

        return count

    def picked(sizes, at=analyze_at):
        chosen, _, size = program_size.chip_free(plan, at, _render, count=counter(sizes))
        return (chosen.spec.tiling.block_q, chosen.spec.tiling.block_kv), chosen.program, size

    first, second, third = (1024, 2048), (1024, 1024), (512, 1024)
    # straight-line bodies left out are enough at the first tiling
    sizes = {first: {ProgramLimits(): 70_000, SHRINK_STEPS[0]: 60_000}}
    tiling, program, size = picked(sizes)
    assert (tiling, program) == (first, SHRINK_STEPS[0]) and size.fits
    # whole masks left out too: still the first tiling (measured faster than a smaller one)
    sizes = {first: {SHRINK_STEPS[1]: 50_000}, second: {ProgramLimits(): 30_000}}
    assert picked(sizes)[:2] == (first, SHRINK_STEPS[1])
    # the first tiling over the budget whatever is left out: the second
    sizes = {first: {}, second: {ProgramLimits(): 30_000}, third: {ProgramLimits(): 20_000}}
    tiling, program, _ = picked(sizes)
    assert tiling == second and program.is_default
    # a tiling the spec cannot take (analyze_at: None) is passed over
    skip = lambda t: None if t[:2] in (first, second) else analyze_at(t)  # noqa: E731
    assert picked({third: {ProgramLimits(): 30_000}}, skip)[0] == third


def test_the_tuner_never_picks_a_candidate_over_the_program_budget(tmp_path):
    """svgen tune: a compiled candidate whose program is over the chip's budget is skipped
    with the reason (its costs stay a point for estimates), and the pick is one that fits."""
    from svgen.estimate import tune
    from tune_helpers import SPEC, synthetic_paths, write_spec

    def measure(plan):
        t = plan.spec.tiling
        c = tune.Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align)
        paths = synthetic_paths(c, len(plan.patterns))
        # every tiling of more than one compute block "compiles" past the budget
        return dataclasses.replace(paths, program=100_000 if c.blocks > 1 else 20_000)

    result = tune.tune(str(write_spec(tmp_path, SPEC)), target="v5e", measure=measure, confirm=50)
    assert result.rows and all(r.candidate.blocks == 1 for r in result.rows if r.exact)
    assert result.rows[0].candidate.blocks == 1
    over = [why for _, why in result.dropped if "over v5e's budget of 64,000" in why]
    assert over and all("100,000 bundles" in why for why in over)


def test_small_tiles_are_not_counted():
    """Tiles of at most 512 x 512 pairs and at most four patterns: no count (a libtpu compile
    each), since no such program has come near a budget; larger tiles are counted."""
    assert program_size.small_by_construction(_plan())  # 256 x 512 tiles
    big = straight_band(
        "size_band", tiling="{block_q: 512, block_kv: 1024, compute_q: 256, compute_kv: 256}"
    )
    assert not program_size.small_by_construction(_plan(big))


def test_inspect_prints_the_program_against_the_budget(tmp_path, monkeypatch, capsys):
    import json

    from svgen.cli import main

    monkeypatch.setattr(program_size, "SMALL_TILE_PAIRS", 0)  # count even these small tiles
    spec = tmp_path / "size.yaml"
    spec.write_text(BAND)
    assert main(["inspect", str(spec), "--target", "v5e"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("Program: forward kernel program ")
    assert "bundles of v5e's budget of 64,000 (measured on the chip) [forward " in last
    assert ", dkv " in last  # the backward kernel beside it
    assert main(["inspect", str(spec), "--target", "v5e", "--json"]) == 0
    program = json.loads(capsys.readouterr().out)["program"]
    assert program["fits"] and program["budget"] == 64_000 and program["left_out"] is None
    assert f"{program['forward_bundles']:,} bundles" in last
    assert main(["inspect", str(spec), "--target", "v5e", "--no-size-check"]) == 0
    assert "Program:" not in capsys.readouterr().out


# Three patterns, two layouts, chosen per head at run time: one kernel call per pattern.
THREE = spec_text(
    "size_three",
    (4, 8, 16),
    4,
    patterns={
        "near": any_of(ANCHOR, "{band: {width: 200}}"),
        "place": "{temporal_stride: {rows: 1, cols: 1}}",
        "frame": '{expr: "f_q == f_k and abs(h_q - h_k) <= 2"}',
    },
    layouts={"near": "frame_major", "place": "temporal_major", "frame": "frame_major"},
    tiling="{block_q: 256, block_kv: 256, compute_q: 128, compute_kv: 128}",
)


def _module_with(plan, limits, folder):
    folder.mkdir()
    for name, data in _render(dataclasses.replace(plan, program=limits)).items():
        (folder / name).write_bytes(data)
    return import_file(folder / codegen.module_filename(plan.spec.name, "tpu"))


def test_pattern_calls_are_the_first_step_of_a_module_of_several_patterns_on_one_core():
    from svgen.core.program import shrink_steps

    steps = shrink_steps(3, tensor_cores=1)
    assert steps[0] == ProgramLimits(pattern_calls=True)
    assert [dataclasses.replace(s, pattern_calls=False) for s in steps[1:]] == list(SHRINK_STEPS)
    assert all(s.pattern_calls for s in steps)
    # One pattern, or a chip of two cores (its per-head walk would step through every head).
    assert shrink_steps(1, tensor_cores=1) == SHRINK_STEPS
    assert shrink_steps(3, tensor_cores=2) == SHRINK_STEPS
    assert "one forward kernel per pattern" in steps[0].words()
    assert steps[0].source() == "ProgramLimits(pattern_calls=True)"


def test_the_budget_holds_the_forward_kernels_and_a_backward_one_over_it_is_a_warning():
    counts = {
        "svgen_attention_pattern0": 47_736,
        "svgen_attention_pattern1": 45_218,
        "svgen_attention_dkv_pattern0": 70_000,
        "svgen_attention_dkv_pattern1": 60_823,
    }
    assert program_size.forward_bundles(counts) == 47_736
    plan = _plan()
    _, _, size = program_size.fit(plan, _render, count=lambda files, candidate: counts)
    assert size.bundles == 47_736 and size.fits
    assert size.backward_over == (("svgen_attention_dkv_pattern0", 70_000),)
    assert "dkv_pattern0 70,000 bundles" in size.warning()
    assert size.to_json()["backward_over_budget"] == ["svgen_attention_dkv_pattern0"]
    counts["svgen_attention_dkv_pattern0"] = 50_000
    assert program_size.fit(plan, _render, count=lambda f, c: counts)[2].warning() is None


def test_one_call_per_pattern_is_still_each_heads_attention(tmp_path):
    """Fresh inputs, outputs poisoned, float64 reference: static and traced assignments
    (one of them leaving a pattern unused, so that its call walks no steps), forward and
    jax.grad, the module of one kernel per pattern against its plan's masks."""
    import jax
    import jax.numpy as jnp
    from kernel_helpers import check_grads

    plan = _plan(THREE)
    module = _module_with(plan, ProgramLimits(pattern_calls=True), tmp_path / "split")
    assert module.attention.program.pattern_calls and module.attention.tables.flat
    q, k, v = mixed_inputs(plan, "float32", seed=31, heads=4)
    for assignment in ([0, 1, 2, 1], [2, 2, 0, 0]):
        hp = np.asarray(assignment, np.int32)
        out = module.attention(q, k, v, head_pattern=hp, interpret=POISONED)
        check_per_head(plan, out, q, k, v, hp, "float32")
        traced = jax.jit(
            lambda q, k, v, hp: module.attention(q, k, v, head_pattern=hp, interpret=POISONED)
        )(q, k, v, jnp.asarray(hp))
        check_per_head(plan, traced, q, k, v, hp, "float32")
    check_grads(plan, module, q, k, v, [1, 0, 2, 2], "float32", jit_pattern=True)
    check_grads(plan, module, q, k, v, [2, 0, 0, 2], "float32")  # static: pattern 1 unused


def test_one_call_per_pattern_traces_one_kernel_per_pattern_each_with_its_own_code(tmp_path):
    """The split module's jaxpr holds a forward and a dk/dv kernel per pattern, each named for
    it; the union's one of each for every pattern."""
    import jax
    import jax.numpy as jnp

    plan = _plan(THREE)
    split = _module_with(plan, ProgramLimits(pattern_calls=True), tmp_path / "split")
    union = _module_with(plan, ProgramLimits(), tmp_path / "union")
    q, k, v = mixed_inputs(plan, "float32", seed=3, heads=4)
    hp = jnp.zeros(4, jnp.int32)

    def kernels(module):
        text = str(
            jax.make_jaxpr(lambda q, k, v, hp: module.attention(q, k, v, head_pattern=hp))(
                q, k, v, hp
            )
        )
        return sorted(set(re.findall(r"name=(svgen_attention\w*)", text)))

    assert kernels(union) == ["svgen_attention"]
    assert kernels(split) == [f"svgen_attention_pattern{i}" for i in range(3)]

    def grad_kernels(module):
        def loss(q, k, v, hp):
            return jnp.sum(module.attention(q, k, v, head_pattern=hp))

        text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, hp))
        return sorted(set(re.findall(r"name=(svgen_attention\w*)", text)))

    assert grad_kernels(union) == ["svgen_attention", "svgen_attention_dkv"]
    assert grad_kernels(split) == sorted(
        [f"svgen_attention_pattern{i}" for i in range(3)]
        + [f"svgen_attention_dkv_pattern{i}" for i in range(3)]
    )
