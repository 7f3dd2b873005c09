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
    from svgen.runtime.layout import TokenLayout

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
    from svgen.runtime.layout import TokenLayout

    with pytest.raises(SpecError) as err:
        lower_mask_dict({"expr": text}, TokenLayout(1, 1, 256), 128, 128)
    message = str(err.value)
    assert "int32" in message and sub in message and "mask.expr" in message
    assert err.value.line is not None and err.value.column is not None


def test_predicates_just_inside_int32_are_accepted_and_exact():
    """255 * 8388608 = 2,139,095,040 fits int32: accepted, and the printed line agrees."""
    from svgen.runtime.layout import TokenLayout

    lay = TokenLayout(1, 1, 256)
    _, node = lower_mask_dict({"expr": "i_q * 8388608 - i_k * 8388608 < 1000000000"}, lay, 128, 128)
    fn, source = emitted_function(node, lay)
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(node, lay), source)


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


def test_a_neighborhood_prints_one_compare_per_axis():
    """NATTEN's clamped 3 x 3 x 5 window: three unsigned compares, no other comparison."""
    from svgen.runtime.layout import TokenLayout

    lay = TokenLayout(8, 8, 16)
    text = (
        "max(0, min(f_q - 1, 5)) <= f_k <= max(0, min(f_q - 1, 5)) + 2 and "
        "max(0, min(h_q - 1, 5)) <= h_k <= max(0, min(h_q - 1, 5)) + 2 and "
        "max(0, min(w_q - 2, 11)) <= w_k <= max(0, min(w_q - 2, 11)) + 4"
    )
    _, mask = lower_mask_dict({"expr": text}, lay, 128, 128)
    fn, source = emitted_function(mask, lay)
    body = source.split("expr = ", 1)[1]
    assert body.count("coords.within(") == 3 and "<=" not in body, source
    np.testing.assert_array_equal(emitted_keep(fn, lay), dense_keep(mask, lay), err_msg=source)
