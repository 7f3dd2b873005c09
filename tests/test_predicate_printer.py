"""The generated boundary_mask has the value of the predicate it comes from, element by element,
whatever the signs and magnitudes: random user predicates (floor divisions and modulos of
dividends of both signs, subtracted; products; nested abs / min / max; chained comparisons;
boolean equalities) on every (q, k) pair of small random geometries in all three token
orders, against the IR oracle and, on a sample of pairs, against Python evaluating the
user's text itself. Predicates whose values leave int32 are refused before analysis."""

from __future__ import annotations

import numpy as np
import pytest

from svgen.spec.errors import SpecError

from helpers import dense_keep, lower_mask_dict, random_any_layout, random_predicate
from kernel_helpers import emitted_function, emitted_keep

CASES_PER_TEST = 25


def _python_keep(text: str, lay, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """keep(q, k) by Python itself evaluating the user's text (our own generated test text,
    never user input) on each sampled pair's coordinates: an oracle that shares nothing with
    svgen's parser, sympy tree or printer."""
    cq, ck = lay.coordinates(q_pos), lay.coordinates(k_pos)
    out = np.empty(len(q_pos), bool)
    code = compile(text, "<predicate>", "eval")
    builtins = {"abs": abs, "min": min, "max": max, "true": True, "false": False}
    for n in range(len(q_pos)):
        env = dict(builtins)
        for side, c in (("q", cq), ("k", ck)):
            env.update(
                {
                    f"f_{side}": int(c.frame[n]),
                    f"h_{side}": int(c.row[n]),
                    f"w_{side}": int(c.col[n]),
                    f"i_{side}": int(c.index[n]),
                    f"is_text_{side}": int(c.is_text[n]),
                }
            )
        out[n] = bool(eval(code, env))  # noqa: S307 - test-generated text only
    return out


@pytest.mark.parametrize("chunk", range(8))
def test_random_predicates_print_as_the_oracle(chunk):
    """200 random predicates in 8 chunks; a planted printer bug (a dropped parenthesis around
    a subtracted shifted floor division) fails the first chunk within seconds."""
    for case in range(CASES_PER_TEST):
        seed = 90_000 + chunk * CASES_PER_TEST + case
        rng = np.random.default_rng(seed)
        lay = random_any_layout(rng)
        text = random_predicate(rng)
        _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
        fn, source = emitted_function(mask, lay)
        oracle = dense_keep(mask, lay)
        where = f"seed {seed}, {lay}\n{text}\n{source}"
        np.testing.assert_array_equal(emitted_keep(fn, lay), oracle, err_msg=where)
        sample = rng.integers(0, lay.seq_len, (2, 64))
        np.testing.assert_array_equal(
            oracle[sample[0], sample[1]], _python_keep(text, lay, *sample), err_msg=where
        )


# The expressions that were miscompiled (issue 19): a subtracted floor division or modulo of
# a dividend that can be negative, on indices and on coordinates, alone and in a union.
MISCOMPILED = [
    "abs((i_q - 100) // 8 - (i_k - 100) // 8) <= 1",
    "(i_q - 100) % 8 - (i_k - 100) % 8 >= -2 and -((i_q - 3) // 8) + 20 > (i_k - 100) // 8",
    "(h_q - 3) // 2 - (h_k - 3) // 2 == 0",
    "-((h_q - 3) % 2) - (w_q - 5) // 3 + (w_k - 5) // 3 >= 0",
]


@pytest.mark.parametrize("text", MISCOMPILED)
def test_the_miscompiled_expressions_print_right(text):
    from svgen.core.layout import TokenLayout

    for lay in (TokenLayout(1, 1, 256), TokenLayout(3, 7, 9, 5, "first")):
        for mask in ({"expr": text}, {"any_of": [{"expr": text}, {"first_frame": {}}]}):
            _, node = lower_mask_dict(mask, lay, 128, 128)
            fn, source = emitted_function(node, lay)
            np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(node, lay), source)


OVERFLOWING = [
    ("i_q * 16777216 + i_k * 16777216 < 2147483647", "16777216*i_k + 16777216*i_q"),
    ("i_q * 65536 * 65536 > 0", "4294967296*i_q"),
    ("(i_q - 2147483647) - i_k < 0", "i_q - 2147483647"),
    ("abs(i_q * 2147483647) > 5", "2147483647*i_q"),
]


@pytest.mark.parametrize("text,sub", OVERFLOWING, ids=range(len(OVERFLOWING)))
def test_predicates_past_int32_are_refused_with_their_location(text, sub):
    from svgen.core.layout import TokenLayout

    with pytest.raises(SpecError) as err:
        lower_mask_dict({"expr": text}, TokenLayout(1, 1, 256), 128, 128)
    message = str(err.value)
    assert "int32" in message and sub in message and "mask.expr" in message
    assert err.value.line is not None and err.value.column is not None


def test_predicates_just_inside_int32_are_accepted_and_exact():
    """255 * 8388608 = 2,139,095,040 fits int32: accepted, and the printed line agrees."""
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(1, 1, 256)
    _, node = lower_mask_dict({"expr": "i_q * 8388608 - i_k * 8388608 < 1000000000"}, lay, 128, 128)
    fn, source = emitted_function(node, lay)
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(node, lay), source)


# Issue 44: fused forms whose printed literals left int32, though every value of the user's
# predicate fits: compile accepted the spec and the kernel raised OverflowError at its first
# call. (geometry, expr, what was printed)
PAST_INT32_FORMS = [
    # a window 0 <= x <= 247,891 scaled by m = 8,663 into a 31-bit coords.fields field, its
    # sides m * (786,432 * f + 266,982) (the int32 check covered the sides, not m times them)
    (
        (1, 1, 1),
        "(((f_q + 1) // 3) - ((f_k + 1) // 3) > -1 and abs((min(i_k, 8)) - (min(i_q, 8))) <= 2)"
        " or not ((abs(f_k - f_q) < 1) and (786432 * f_q) - (786432 * f_k) >= -266982"
        " and (786432 * f_q) - (786432 * f_k) <= -19091)",
        "6812860416 * q.frame + 2312865066",
    ),
    # |x| <= c as coords.within(x + c, 2c): x + c's constant 4,000,000,000
    (
        (1, 1, 256),
        "abs(i_q - i_k + 2000000000) <= 2000000000 and f_q <= f_k",
        "q.index + 4000000000 - k.index",
    ),
    # a chain as coords.within(x, c), c 4,100,000,000 (an unsigned width there, but a literal
    # past int32 all the same)
    (
        (1, 1, 256),
        "i_q - i_k >= -2000000000 and i_q - i_k <= 2100000000 and f_q < 3",
        "4100000000",
    ),
]


@pytest.mark.parametrize("geometry,text,printed", PAST_INT32_FORMS, ids=range(3))
def test_fused_forms_print_no_literal_past_int32(geometry, text, printed):
    """Each is printed in a form whose literals fit int32 (the plain compares where the
    fused form's would not), and keeps the predicate's value on every pair."""
    from svgen.core.layout import TokenLayout

    from helpers import literals_past_int32

    lay = TokenLayout(*geometry)
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    assert printed not in source and literals_past_int32(source) == [], source
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), source)


def test_the_issue_44_packing_compiles_and_runs(compile_text):
    """The spec of issue 44's defect 2 (1 x 1 x 1): its module's first call ran into the
    packing's literal and raised; it runs, and agrees with float64."""
    from kernel_helpers import POISONED, check_per_head, mixed_inputs

    plan, module = compile_text(_kernel_spec(PAST_INT32_FORMS[0][1], 1, 1, 1))
    q, k, v = mixed_inputs(plan, "float32", seed=44, heads=1)
    out = module.attention(q, k, v, interpret=POISONED)
    check_per_head(plan, out, q, k, v, [0], "float32")


def test_packed_sides_fit_int32_over_the_geometry(compile_text):
    """A window of width 443 over indices (a - b in -208,167 .. 5,974,718 on the geometry),
    scaled by m = 591 into an 18-bit field with 32 bits of room beside two fields without
    room: its literals fit, but m * a reached 3,531,058,338 on the last query. The packing
    wrapped to the right answer, but every value a module computes is to be one the
    printer's int32 checks cover (issue 44): the window stays out of the fields."""
    from svgen.core.layout import TokenLayout

    from helpers import mask_spec_text, packed_sides_past_int32

    lay = TokenLayout(1, 1, 64)
    text = (
        "-2883497 <= 49067 * i_q - 49067 * i_k <= -2883054"
        " and f_q == f_k and h_q == h_k and (i_q + i_k) % 3 != 5"
    )
    _, module = compile_text(mask_spec_text({"expr": text}, lay))
    assert packed_sides_past_int32(module) == []
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), source)


def test_fields_without_room_take_no_shift():
    """A field whose a - b is 0 on every pair (an equality of one-column frames) has no
    bits; after a 32-bit field it was printed shifted by 32, past an int32's bits. It adds
    nothing to the difference wherever it sits, so it sits at bit 0."""
    from svgen.analysis.mask_code import _field_layout
    from svgen.core.layout import TokenLayout

    wide = (-2139095040, 2139095040, None)  # 8388608 * (h_q - h_k) >= 0: 32 bits of room
    assert [shift for _, shift, _ in _field_layout([wide, (0, 0, 0)])] == [0, 0]
    lay = TokenLayout(1, 256, 1)
    text = "8388608 * h_q - 8388608 * h_k >= 0 and w_q == w_k and w_q >= w_k and w_q + 1 >= w_k + 1"
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    assert "coords.fields(" in source and ", 32" not in source, source
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), source)


def _kernel_spec(expr: str, frames: int, height: int, width: int) -> str:
    """A one-head spec of `expr` (in a union with the first frame when there are frames
    after it)."""
    mask = f'{{expr: "{expr}"}}'
    if frames > 1:
        mask = f"{{any_of: [{mask}, {{first_frame: {{frames: 1}}}}]}}"
    return f"""
svgen: 1
name: printer_case
geometry: {{frames: {frames}, height: {height}, width: {width}}}
attention: {{heads: 1, head_dim: 128, dtype: float32}}
mask: {mask}
tiling: {{block_q: 128, block_kv: 128}}
"""


KERNEL_CASES = [
    ("abs((i_q - 100) // 8 - (i_k - 100) // 8) <= 1", (1, 1, 256)),
    (
        "(i_q - 100) % 8 - (i_k - 100) % 8 >= 0 and (i_q - 100) // 8 - (i_k - 100) // 8 <= 2",
        (1, 1, 256),
    ),
    ("abs((h_q - 3) // 2 - (h_k - 3) // 2) <= 0 and f_k <= f_q", (2, 8, 16)),
]


@pytest.mark.parametrize("target", ["tpu", "h100"])
@pytest.mark.parametrize("expr,geometry", KERNEL_CASES, ids=range(len(KERNEL_CASES)))
def test_miscompiled_expressions_run_right_in_the_kernels(expr, geometry, target, compile_text):
    """TPU and GPU modules (interpret mode, outputs NaN-poisoned on TPU) against float64."""
    from svgen.runtime import gpu

    from kernel_helpers import POISONED, check_per_head, mixed_inputs

    options = {} if target == "tpu" else {"target_name": target}
    plan, module = compile_text(_kernel_spec(expr, *geometry), **options)
    q, k, v = mixed_inputs(plan, "float32", seed=len(expr), heads=1)
    if target == "tpu":
        out = module.attention(q, k, v, interpret=POISONED)
    else:
        out = gpu.gpu_attention_of(module)(q, k, v, interpret=True)
    check_per_head(plan, out, q, k, v, [0], "float32")


@pytest.mark.parametrize("seed", range(24))
def test_clamped_windows_print_as_one_compare_each(seed):
    """lo <= x <= lo + c (NATTEN's clamped window: lo = max(0, min(x_q - r, n - kernel)),
    or any other lo, of either sign), printed as one unsigned compare where it reads both
    sides, keeps the predicate's value on every pair; so do divisions and modulos by powers of
    two, printed as shifts and masks."""
    from helpers import random_integer

    rng = np.random.default_rng(31_000 + seed)
    lay = random_any_layout(rng)
    parts = []
    for axis in rng.choice(["f", "h", "w", "i"], size=int(rng.integers(1, 4)), replace=False):
        low = random_integer(rng, 1, (str(axis),)).replace(f"{axis}_k", f"{axis}_q")
        if rng.random() < 0.5:
            low = f"max(0, min({low}, {int(rng.integers(0, 5))}))"
        width = int(rng.integers(0, 7))
        chain = f"{low} <= {axis}_k <= {low} + {width}"
        if rng.random() < 0.3:  # the same window written as two comparisons, reversed
            chain = f"{axis}_k - {width} <= {low} and {low} <= {axis}_k"
        parts.append(chain)
    text = " and ".join(parts)
    if rng.random() < 0.3:
        text += f" and (w_q - w_k) % {int(rng.choice([2, 4]))} == 0 or f_k // 2 == f_q // 2"
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    where = f"seed {seed}, {lay}\n{text}\n{source}"
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=where)


def test_a_neighborhood_prints_one_compare_for_all_axes():
    """NATTEN's clamped 3 x 3 x 5 window: one coords.fields over the three axes (the frame
    and row windows of width 2 scaled by 3 to fill 3 bits, the column's 4 by 7 to fill 5),
    no other comparison or AND."""
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(8, 8, 16)
    text = (
        "max(0, min(f_q - 1, 5)) <= f_k <= max(0, min(f_q - 1, 5)) + 2 and "
        "max(0, min(h_q - 1, 5)) <= h_k <= max(0, min(h_q - 1, 5)) + 2 and "
        "max(0, min(w_q - 2, 11)) <= w_k <= max(0, min(w_q - 2, 11)) + 4"
    )
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    query, body = source.split("expr = ", 1)
    assert body.count("coords.fields(") == body.count("q.once(boundary_mask_fields)") == 1, source
    assert "<=" not in body and "&" not in body and "within" not in body, source
    assert "(3 * k.frame, 0, 3)" in body and "(3 * k.row, 5, 3)" in body, source
    assert "(7 * k.col, 10, 5)" in body and "jnp.maximum" not in body, source
    assert query.startswith("def boundary_mask_fields(q):") and "coords.pack(" in query, source
    assert "(3 * jnp.maximum(0, jnp.minimum(5, q.frame - 1)) + 6, 0)" in query, source
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=source)


@pytest.mark.parametrize("seed", range(24))
def test_conjunctions_of_windows_print_as_one_compare(seed):
    """Random conjunctions of windows of any widths (0 included), written as chains
    lo <= x_k <= lo + c (lo reading the query, of either sign) or as |x_q - x_k + s| <= c,
    on random axes and layouts, some with a divided side, plus other conjuncts: the printed
    mask keeps the predicate's value on every pair, and two or more windows are one fused
    call (coords.fields, or coords.windows where the fields would not fit 32 bits)."""
    rng = np.random.default_rng(47_000 + seed)
    lay = random_any_layout(rng)
    parts, fusable = [], 0
    for _ in range(int(rng.integers(2, 5))):
        axis = str(rng.choice(["f", "h", "w", "i"]))
        width = int(rng.choice([0, 1, 2, 3, 5, 8, 13, 40]))
        divided = rng.random() < 0.2
        key = f"{axis}_k // 2" if divided else f"{axis}_k"
        if rng.random() < 0.5:
            low = f"{int(rng.integers(1, 4))} * {axis}_q - {int(rng.integers(-9, 10))}"
            if rng.random() < 0.5:
                low = f"max(0, min({low}, {int(rng.integers(0, 5))}))"
            parts.append(f"{low} <= {key} <= {low} + {width}")
        else:
            shift = int(rng.integers(-6, 7))
            parts.append(f"abs({axis}_q - ({key}) + {shift}) <= {width // 2}")
        fusable += 1
    if rng.random() < 0.5:
        parts.append(str(rng.choice(["f_q != f_k", "h_k < 3", "(w_q + w_k) % 3 == 1"])))
    text = " and ".join(parts)
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    where = f"seed {seed}, {lay}\n{text}\n{source}"
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=where)
    if fusable >= 2:  # every window left reading both sides is in one call (lowering may
        # decide a window, or the whole mask, from the geometry)
        calls = ("coords.fields(", "coords.windows(", "coords.within(")
        assert sum(source.count(c) for c in calls) <= 1, where


@pytest.mark.parametrize("seed", range(12))
def test_same_residues_print_as_one_compare(seed):
    """(a - b) % d == 0 (or != 0), a reading the query and b the key, prints as
    a % d == b % d: one full-block compare, no modulo of the difference; values kept on
    every pair for divisors of all kinds and dividends of both signs."""
    rng = np.random.default_rng(48_000 + seed)
    lay = random_any_layout(rng)
    axis = str(rng.choice(["f", "h", "w", "i"]))
    d = int(rng.choice([2, 3, 4, 5, 7, 8]))
    shift = int(rng.integers(-9, 10))
    op = str(rng.choice(["==", "!="]))
    text = f"({axis}_q + {shift} - 2 * {axis}_k) % {d} {op} 0"
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    where = f"seed {seed}, {lay}\n{text}\n{source}"
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=where)
    body = source.split("expr = ", 1)[1]
    assert f" {op} " in body and body.count("k.") == 1, where  # the key side read once
    assert "- 2 * k." not in body and "- (2 * k." not in body, where  # no difference


def test_windows_compare_is_exact_across_int32():
    """coords.windows against 0 <= a - b <= width on values spread over int32 (a - b
    itself within int32)."""
    from svgen.runtime import coords

    rng = np.random.default_rng(5)

    def side_values(width):
        """a [64, 1], b [1, 64] near a common base anywhere in int32, and a few keys far
        away (a - b up to about +-2^31: what the wrap must not confuse)."""
        base = int(rng.integers(-(2**30), 2**30))
        a = base + rng.integers(-8, width + 8, (64, 1))
        b = base + rng.integers(-8, width + 8, (1, 64))
        b[0, :4] = base + np.array([2**30, -(2**30), 2**31 - 9 - width, -(2**31) + 9])
        b = np.clip(b, -(2**31), 2**31 - 1)
        keep = a - b  # int64: the truth
        return a.astype(np.int32), b.astype(np.int32), (0 <= keep) & (keep <= width)

    for width in (0, 1, 6, 48, 4096):
        a1, b1, want1 = side_values(width)
        a2, b2, want2 = side_values(width)
        got = np.asarray(coords.windows((a1, b1), (a2, b2), width=width))
        np.testing.assert_array_equal(got, want1 & want2, err_msg=f"width {width}")
        assert (want1 & want2).any() and not (want1 & want2).all()
        one = np.asarray(coords.windows((a1, b1), width=width))
        np.testing.assert_array_equal(one, want1, err_msg=f"width {width}")


def test_common_width_keeps_every_window():
    """For random widths, W and the scales: 0 <= x <= c exactly when 0 <= m x <= W."""
    from svgen.analysis.mask_code import MAX_COMMON_WIDTH, _common_width

    rng = np.random.default_rng(6)
    for _ in range(300):
        widths = [int(c) for c in rng.integers(0, 30, int(rng.integers(2, 5)))]
        width, scales = _common_width(widths)
        assert max(widths) <= width <= MAX_COMMON_WIDTH
        for c, m in zip(widths, scales):
            x = np.arange(-3 * (c + 2), 3 * (c + 2))
            np.testing.assert_array_equal((0 <= m * x) & (m * x <= width), (0 <= x) & (x <= c))
    assert _common_width([MAX_COMMON_WIDTH + 1, 1]) is None


def test_windows_whose_scaled_sides_leave_int32_stay_apart():
    """A width-1 window over the indices of a 2M-token video beside a 1,200-wide one: the
    index window scaled by 1,200 would pass int32, so both stay unsigned compares."""
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(2, 1000, 1000)
    text = "abs(h_q - h_k) <= 600 and i_k <= i_q <= i_k + 1"
    _, mask = lower_mask_dict({"expr": text}, lay, 1024, 1024)
    _, source = emitted_function(mask, lay)
    assert "coords.windows(" not in source and source.count("coords.within(") == 2, source


@pytest.mark.parametrize("seed", range(12))
def test_conjunctions_of_equalities_print_as_one_compare(seed):
    """Two or more equalities a == b (a reading the query, b the key) or same residues
    (a - b) % d == 0 in one conjunction: one coords.same (one compare of their mixed-radix
    packings), or with a window beside them one coords.fields for all; values kept on every
    pair (sides of both signs, ranges not starting at 0)."""
    rng = np.random.default_rng(49_000 + seed)
    lay = random_any_layout(rng)
    parts = []
    for _ in range(int(rng.integers(2, 4))):
        axis = str(rng.choice(["f", "h", "w", "i"]))
        shift = int(rng.integers(-5, 6))
        if rng.random() < 0.5:
            parts.append(f"({axis}_q - {axis}_k + {shift}) % {int(rng.choice([2, 3, 4]))} == 0")
        else:
            parts.append(f"{axis}_q // 2 + {shift} == {axis}_k // 3")
    window = rng.random() < 0.5
    if window:
        parts.append("abs(f_q - f_k) <= 2")
    text = " and ".join(parts)
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    where = f"seed {seed}, {lay}\n{text}\n{source}"
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=where)
    code = [line for line in source.split('"""')[-1].splitlines() if "#" not in line]
    if "expr = " in source:  # (lowering may decide the mask, or find a built-in equal to it)
        body = "\n".join(code)
        fused = "coords.fields(" if window else "coords.same("
        assert body.count(fused) == 1 and " == " not in body and "!=" not in body, where
        assert "within" not in body and "&" not in body, where


def test_equalities_whose_packing_passes_int32_stay_apart():
    """Equal indices of a 2M-token video beside a column equality of 1,999 values: the
    packing would pass int32, so two compares."""
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(2, 1000, 1000)
    text = "i_q == i_k and w_q + 5 == 2 * w_k"
    _, mask = lower_mask_dict({"expr": text}, lay, 1024, 1024)
    _, source = emitted_function(mask, lay)
    assert source.split("expr = ", 1)[1].count(" == ") == 2, source


def test_field_scale_keeps_every_window():
    """For every width, m and bits: 0 <= x <= c exactly when 0 <= m x <= 2^bits - 1, with
    bits the fewest that allow it; a one-sided bound (width None) keeps x >= 0 over x <= hi."""
    from svgen.analysis.mask_code import _field_scale

    for c in range(0, 200):
        m, bits = _field_scale(c, 10**6)
        x = np.arange(-3 * (c + 2), 3 * (c + 2))
        top = (1 << bits) - 1
        np.testing.assert_array_equal((0 <= m * x) & (m * x <= top), (0 <= x) & (x <= c))
        for fewer in range(bits):  # no m works with fewer bits
            t = (1 << fewer) - 1
            assert not any(k * c <= t < k * (c + 1) for k in range(1, t + 2)), (c, fewer)
    for hi in (0, 1, 5, 64, 1000):
        m, bits = _field_scale(None, hi)
        assert m == 1 and (1 << bits) - 1 >= hi and (bits == 0 or (1 << (bits - 1)) <= hi)


@pytest.mark.parametrize("seed", range(6))
def test_fields_are_exact_on_every_value_of_their_ranges(seed):
    """coords.fields with the printer's layout (_field_layout) against the int64 truth,
    0 <= a - b <= width per term (width None: a - b >= 0), on random term sets: windows of
    any width, equalities and one-sided bounds, each a - b drawn over its whole declared
    range (the extremes included, most terms in range so that a failing field is often the
    only one), with sides anywhere in int32 (the packing wraps)."""
    from svgen.analysis.mask_code import _field_layout
    from svgen.runtime import coords

    rng = np.random.default_rng(58_000 + seed)
    checked = 0
    while checked < 40:
        terms = []
        for _ in range(int(rng.integers(2, 6))):
            kind = rng.choice(["window", "equality", "bound"])
            lo = int(rng.integers(-300, 1))
            hi = int(rng.integers(max(lo, 0), 400))
            width = {"window": int(rng.integers(0, 30)), "equality": 0, "bound": None}[kind]
            terms.append((lo, hi, width))
        layout = _field_layout(terms)
        if layout is None:
            assert sum(max(hi - lo, 1).bit_length() for lo, hi, _ in terms) > 10
            continue
        checked += 1
        n = 96
        args, want = [], np.ones((n, n), bool)
        for (lo, hi, width), (m, shift, bits) in zip(terms, layout):
            top = hi if width is None else min(hi, width)
            anywhere = rng.integers(lo, hi + 1, (n, n))
            low = max(lo, 0)
            inside = rng.integers(low, top + 1, (n, n)) if low <= top else anywhere
            x = np.where(rng.random((n, n)) < 0.8, inside, anywhere)
            x[0, :4] = [lo, hi, max(lo, min(hi, -1)), max(lo, min(hi, top + 1))]
            ok = x >= 0 if width is None else (0 <= x) & (x <= width)
            want &= ok
            # a query side [n, 1] and key side [1, n] with a - b = x: a = x + b, b per key
            # near a random base (the packed sums wrap through int32)
            base = int(rng.integers(-(2**30), 2**30))
            b = base + rng.integers(-50, 50, (1, n))
            a = x + b  # [n, n]: each pair's own a; fields is elementwise, so this is fine
            args.append((m * a, m * b, shift, bits))
        query = coords.pack(*((a.astype(np.int32), s) for a, _, s, _ in args))
        got = np.asarray(coords.fields(query, *((b.astype(np.int32), s, w) for _, b, s, w in args)))
        np.testing.assert_array_equal(got, want, err_msg=f"{terms} {layout}")
        assert want.any() and not want.all(), terms


def test_fields_that_cannot_fit_32_bits_leave_the_widest_out():
    """Over a 2M-token video the frame, row and column windows take 6 + 9 + 13 bits of
    fields, and the index window's differences alone span more than 2^21: the widest term,
    the index window, is left to the fusions after coords.fields (alone there, an unsigned
    compare), the other three fused."""
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(20, 100, 1000)
    text = (
        "abs(h_q - h_k) <= 3 and abs(w_q - w_k) <= 3 and abs(f_q - f_k) <= 1 "
        "and i_k <= i_q <= i_k + 100000"
    )
    _, mask = lower_mask_dict({"expr": text}, lay, 1024, 1024)
    _, source = emitted_function(mask, lay)
    fields = source.split("coords.pack(", 1)[1].split("\n    )", 1)[0]
    assert source.count("coords.fields(") == 1 and "index" not in fields, source
    assert "q.row" in fields and "q.col" in fields and "q.frame" in fields, source
    assert "coords.within(q.index - k.index, 100000)" in source, source


@pytest.mark.parametrize("seed", range(16))
def test_strict_windows_print_as_one_compare(seed):
    """|x| < c is |x| <= c - 1 on integers (c 0: never): written either way round, with
    sides that sum several coordinates (Radial Attention's place 80 * h + w), alone, in a
    conjunction and in a union, the printed mask keeps the predicate's value on every pair;
    a window alone whose side sums several coordinates is one subtract of the two sides, the
    query side a query function (q.once), and one unsigned compare: no abs."""
    rng = np.random.default_rng(53_000 + seed)
    lay = random_any_layout(rng)
    scale = int(rng.integers(1, 20))
    place = f"{scale} * (h_q - h_k) + w_q - w_k"
    if rng.random() < 0.3:
        place = f"{scale} * (f_q - f_k) + h_q - h_k + {int(rng.integers(-5, 6))}"
    bound = int(rng.choice([0, 1, 2, 5, 17, 60]))
    window = f"abs({place}) < {bound}" if rng.random() < 0.5 else f"{bound} > abs({place})"
    form = seed % 3
    text = (
        window,
        f"{window} and abs(f_q - f_k) < {int(rng.integers(1, 4))}",
        f"f_k < 1 or {window}",
    )[form]
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    where = f"seed {seed}, {lay}\n{text}\n{source}"
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=where)
    body = source.split("def boundary_mask(q, k):", 1)[1]
    if form == 0 and bound > 0 and "coords.within(" in body:
        assert "jnp.abs" not in body and "q.once(boundary_mask_side) - (" in body, where
    if form == 1 and "coords.fields(" not in body and "coords.windows(" not in body:
        assert "jnp.abs" not in body or "h_q" not in text, where


def test_a_radial_band_window_prints_as_one_subtract_and_compare():
    """abs(16 * (h_q - h_k) + w_q - w_k) < 20 on 16-wide frames: the place 16 * h + w of the
    query once per q tile, the key's shifted by 19 on the block's row, then one compare
    against 38 (0 <= x + 19 <= 38)."""
    from svgen.core.layout import TokenLayout

    lay = TokenLayout(4, 6, 16)
    _, mask = lower_mask_dict({"expr": "abs(16 * (h_q - h_k) + w_q - w_k) < 20"}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    query, body = source.split("def boundary_mask(q, k):", 1)
    assert "side = 16 * q.row + q.col" in query, source
    assert "coords.within(q.once(boundary_mask_side) - (16 * k.row + k.col - 19), 38)" in body
    assert "jnp.abs" not in body and "<" not in body.split("expr = ", 1)[1], source
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=source)


@pytest.mark.parametrize("seed", range(16))
def test_complements_of_other_disjuncts_are_dropped(seed):
    """A or (not A and B) prints as A or B (Radial Attention's bands: |df| <= 1 or 2 <= |df|
    and ...): on integers not x <= c is x >= c + 1, written any way round; the printed mask
    keeps the predicate's value on every pair, without the complement where it was one."""
    rng = np.random.default_rng(61_000 + seed)
    lay = random_any_layout(rng)
    c = int(rng.integers(0, 4))
    a = str(
        rng.choice(
            [f"abs(f_q - f_k) <= {c}", f"abs(f_q - f_k) < {c + 1}", f"{c} >= abs(f_q - f_k)"]
        )
    )
    complement = str(
        rng.choice(
            [f"{c + 1} <= abs(f_q - f_k)", f"abs(f_q - f_k) > {c}", f"abs(f_q - f_k) >= {c + 1}"]
        )
    )
    if seed % 4 == 3:  # not a complement: kept
        complement = f"abs(f_q - f_k) >= {c + 2}"
    text = f"{a} or {complement} and abs(h_q - h_k) <= 2 or w_k < 2"
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    where = f"seed {seed}, {lay}\n{text}\n{source}"
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=where)
    if seed % 4 != 3:  # the complement's bound is gone (c + 1 <= |df| is printed with abs)
        assert "<= jnp.abs(" not in source and "jnp.abs(k.frame - q.frame) >" not in source, where


def test_simplify_union_drops_complements():
    from svgen.spec.expr import SYMBOLS, simplify_union
    import sympy

    x = sympy.Abs(SYMBOLS["f_q"] - SYMBOLS["f_k"])
    y = SYMBOLS["h_k"]
    a = sympy.Le(x, 1)
    assert simplify_union([a, sympy.And(sympy.Ge(x, 2), y < 3)]) == [a, y < 3]
    assert simplify_union([a, sympy.And(sympy.Gt(x, 1), y < 3)]) == [a, y < 3]
    assert simplify_union([a, sympy.And(sympy.Le(2, x), y < 3)]) == [a, y < 3]
    kept = sympy.And(sympy.Ge(x, 3), y < 3)  # x >= 3 is no complement of x <= 1
    assert simplify_union([a, kept]) == [a, kept]
    assert simplify_union([sympy.Lt(y, 4), sympy.And(sympy.Ge(y, 4), a)]) == [sympy.Lt(y, 4), a]


def test_nested_bounds_of_one_difference_merge():
    """x <= a or x <= b is x <= max(a, b), each way round, strict or not: nested windows of
    one difference (a radial mask written without its bands' lower bounds) print as one."""
    import sympy

    from svgen.spec.expr import SYMBOLS, simplify_union

    x = sympy.Abs(80 * (SYMBOLS["h_q"] - SYMBOLS["h_k"]) + SYMBOLS["w_q"] - SYMBOLS["w_k"])
    y = SYMBOLS["f_k"]
    assert simplify_union([sympy.Lt(x, 900), sympy.Lt(x, 450), y < 1]) == [
        sympy.Lt(x, 900),
        y < 1,
    ]
    assert simplify_union([sympy.Le(x, 449), sympy.Gt(900, x)]) == [sympy.Gt(900, x)]
    assert simplify_union([sympy.Ge(y, 3), sympy.Gt(y, 5)]) == [sympy.Ge(y, 3)]
    both = [sympy.Ge(y, 3), sympy.Le(y, 1)]  # opposite ways: both kept
    assert simplify_union(both) == both


@pytest.mark.parametrize("seed", range(8))
def test_unions_of_nested_windows_print_as_the_oracle(seed):
    rng = np.random.default_rng(67_000 + seed)
    lay = random_any_layout(rng)
    widths = rng.integers(0, 40, size=int(rng.integers(2, 4)))
    place = f"{int(rng.integers(1, 20))} * (h_q - h_k) + w_q - w_k"
    text = " or ".join(f"abs({place}) < {int(w)}" for w in widths) + " or f_k < 1"
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    where = f"seed {seed}, {lay}\n{text}\n{source}"
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=where)
    if widths.max() > 0 and "q.once(" in source:
        assert source.count("coords.within(") == 1, where
