"""Helpers several test modules share (no test module imports another), NumPy and svgen
only: importing this module loads no JAX (tests/test_no_jax.py checks), so the spec, IR,
analysis and codegen tests run without it. Brute-force oracles (dense masks, tile kinds,
alignment), spec texts at test size, random masks, layouts and predicates, the text of a
generated mask function, and compiling a spec into a module and importing it (that import,
not this module's, loads JAX). The helpers that need JAX or Pallas are in kernel_helpers.py."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import itertools
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap
import types
from fractions import Fraction

import numpy as np
import yaml

from svgen import codegen, ir
from svgen.analysis import analyze
from svgen.runtime import libtpu_env
from svgen.core.kinds import TileKind
from svgen.core.layout import Tiled, TokenLayout
from svgen.spec import parse_spec
from spec_corpus import any_of, spec_text

REPO = pathlib.Path(__file__).resolve().parent.parent
SPECS = sorted((REPO / "specs").glob("*.yaml"))
#: Shipped specs whose calls choose blocks from the activations (`select:`): the generic
#: numerical tests compare against the mask alone, so they take MASK_SPECS; tests/test_select.py
#: checks these against references built from their selections.
SELECT_SPECS = [p for p in SPECS if "\nselect:" in p.read_text()]
# Select specs whose heads have patterns of their own (svgen.runtime.select.HeadSelections).
HEADS_SELECT_SPECS = [p for p in SELECT_SPECS if "\nheads:" in p.read_text()]
#: Shipped specs with int8 QK^T (attention.qk: int8): TPU only, each the mask of a float spec
#: beside it, so the generic numerical tests (float tolerances, GPU kernels) leave them out;
#: tests/test_int8_qk.py checks their kernels.
INT8_SPECS = [p for p in SPECS if "qk: int8" in p.read_text()]
MASK_SPECS = [p for p in SPECS if p not in SELECT_SPECS and p not in INT8_SPECS]
#: Shipped specs with a spatial (frame-major) and a temporal (temporal-major) pattern.
MIXED_SPECS = ["wan21_720p_mixed", "hunyuan_720p_mixed", "cogvideox_mixed"]
_module_counter = itertools.count()
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1  # what a generated module computes in
GRAD_TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}


def readme_blocks(language: str) -> list[str]:
    """The README's fenced code blocks of one language (```sh, ```python), in order, as printed
    (what CI runs and the README's snippet test runs are taken from here, never retyped)."""
    readme = (REPO / "README.md").read_text()
    return [block.split("```")[0].strip() for block in readme.split(f"```{language}\n")[1:]]


def readme_first_kernel_output() -> str:
    """What the README says its first Python snippet prints ("It prints `...`" after it)."""
    readme = (REPO / "README.md").read_text()
    after = readme.split("```python\n", 1)[1].split("```", 1)[1]
    return after.split("It prints `", 1)[1].split("`", 1)[0]


def dense_keep(mask, layout) -> np.ndarray:
    """keep[q, k] for every real pair, from the IR oracle (small geometries only)."""
    c = layout.coordinates(np.arange(layout.seq_len))
    return mask.evaluate(c.reshape(-1, 1), c.reshape(1, -1))


def brute_force_kinds(keep: np.ndarray, block_q: int, block_kv: int) -> np.ndarray:
    """Tile kinds of keep[q, k] (square, or a chunk's rows against every key)."""
    nq, nk = -(-keep.shape[0] // block_q), -(-keep.shape[1] // block_kv)
    kinds = np.empty((nq, nk), np.int8)
    for i in range(nq):
        for j in range(nk):
            tile = keep[i * block_q : (i + 1) * block_q, j * block_kv : (j + 1) * block_kv]
            kinds[i, j] = (
                TileKind.FULL if tile.all() else TileKind.BOUNDARY if tile.any() else TileKind.EMPTY
            )
    return kinds


def lower_mask_dict(mask: dict, lay: TokenLayout, bq: int, bkv: int):
    """(spec, lowered mask) of a spec with this mask (a dict as YAML would load it) on the
    geometry of ``lay``, through the spec reader and lowering as a user's file goes."""
    spec = parse_spec(
        mask_spec_text(mask, lay, order=None, tiling={"block_q": bq, "block_kv": bkv})
    )
    return spec, ir.lower(spec)


def mask_spec_text(
    mask: dict, lay: TokenLayout, *, name="random_mask", order="", tiling=None, **extra
) -> str:
    """A one-head float32 spec of ``mask`` on the geometry of ``lay`` (its order unless
    ``order`` says otherwise; None: no `layout:` key), 128 x 128 tiles unless ``tiling``."""
    spec = {
        "svgen": 1,
        "name": name,
        "geometry": {
            "frames": lay.frames,
            "height": lay.height,
            "width": lay.width,
            "text_tokens": lay.text_tokens,
            "text_position": lay.text_position,
        },
        "attention": {"heads": 1, "head_dim": 128, "dtype": "float32"},
        "layout": lay.order if order == "" else order,
        **extra,
        "mask": mask,
        "tiling": tiling or {"block_q": 128, "block_kv": 128},
    }
    if spec["layout"] is None:
        del spec["layout"]
    if spec["tiling"] is False:
        del spec["tiling"]
    return yaml.safe_dump(spec)


def mask_function_source(mask, layout: TokenLayout, name: str = "boundary_mask") -> str:
    """The source of the generated mask function of ``mask`` on ``layout`` (its name in a
    module of one pattern unless ``name``), rendered by the module template's own macro
    (codegen.render_mask_function; test_codegen.py's
    test_the_mask_tests_run_the_modules_mask_function checks it against whole modules)."""
    return codegen.render_mask_function(mask, layout, name)


def user_order_keep(pattern) -> np.ndarray:
    """keep[q, k] in the user's token order for one pattern (oracle, small geometry)."""
    keep = dense_keep(pattern.mask, pattern.layout)  # kernel order
    position = np.empty(pattern.layout.seq_len, np.int64)
    position[pattern.layout.original_index(np.arange(pattern.layout.seq_len))] = np.arange(
        pattern.layout.seq_len
    )
    return keep[np.ix_(position, position)]


def unprepared_environment() -> dict[str, str]:
    """This process's environment less what libtpu_env.prepare() set: a user's shell, for a
    subprocess that must prepare libtpu itself."""
    return {
        k: v for k, v in os.environ.items() if k not in (*libtpu_env.SHARING, *libtpu_env.NO_CHIP)
    }


def literals_past_int32(source: str) -> list[int]:
    """The integer literals of Python `source` outside int32, a negated literal with its sign
    (the printer writes negative constants as `(-5)`): a generated module computes in
    int32, and JAX refuses a Python int past it at the first call (OverflowError)."""
    tree = ast.parse(source)
    negated = {
        id(node.operand)
        for node in ast.walk(tree)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is int:
            value = -node.value if id(node) in negated else node.value
            if not INT32_MIN <= value <= INT32_MAX:
                found.append(value)
    return found


def packed_sides_past_int32(module) -> list[str]:
    """Where a generated module's mask functions hand coords.pack, fields, same or windows a
    value outside int32 on some token of their pattern's geometry: each function run on
    every token at once (queries and keys the same tokens, so every value of a query-side
    or key-side term is met), with NumPy's int64 for jnp and lax and a recording coords, so
    the values are exact where int32 would wrap. coords.same's mixed-radix packings are
    checked too; the other calls' sums wrap by design (runtime/coords.py)."""
    calls = _PackedCalls()
    namespace = dict(vars(module), coords=calls, jnp=_NUMPY_JNP, lax=_NUMPY_LAX)
    for name, value in vars(module).items():  # the functions, reading the stand-ins
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            namespace[name] = types.FunctionType(value.__code__, namespace, name)
    found = []
    for pattern in module._PATTERNS:
        tokens = _Tokens(pattern.layout)
        for mask in (pattern.boundary_mask, *pattern.residual_masks):
            calls.values.clear()
            namespace[mask.__name__](tokens, tokens)
            for call, value in calls.values:
                lo, hi = int(np.min(value)), int(np.max(value))
                if lo < INT32_MIN or hi > INT32_MAX:
                    found.append(f"{mask.__name__}: coords.{call} term takes {lo} .. {hi}")
    return found


class _Tokens:
    """Every token of a layout as a generated mask reads q or k (TokenCoords' attributes),
    int64 [seq_len]."""

    def __init__(self, layout: TokenLayout):
        self.pos = np.arange(layout.seq_len)
        c = layout.coordinates(self.pos)
        self.frame, self.row, self.col, self.index = c.frame, c.row, c.col, c.index
        self.place = c.row * layout.width + c.col
        self.is_text, self.is_text_int = c.is_text, c.is_text.astype(np.int64)

    def once(self, function):
        return function(self)


class _PackedCalls:
    """runtime.coords' fused calls, recording each packed value (name, int64 array) and
    answering an array of the tokens' shape (what the mask does with it does not matter)."""

    def __init__(self):
        self.values: list[tuple[str, np.ndarray]] = []

    def _take(self, call: str, values) -> np.ndarray:
        values = [np.asarray(v, np.int64) for v in values]
        self.values += [(call, v) for v in values]
        return np.zeros(np.broadcast_shapes(*(v.shape for v in values)), bool)

    def pack(self, *terms):
        return self._take("pack", [value for value, _ in terms])

    def fields(self, query, *terms):  # the query's terms: coords.pack's
        return self._take("fields", [key for key, _, _ in terms])

    def windows(self, *terms, width):
        return self._take("windows", [side for term in terms for side in term])

    def same(self, *terms):
        query, key, base = 0, 0, 1
        for a, b, n in terms:
            a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
            query, key, base = query + a * base, key + b * base, base * n
        return self._take("same", [side for a, b, _ in terms for side in (a, b)] + [query, key])

    def within(self, shifted, width, unless=None):
        return np.zeros(np.shape(shifted), bool)


_NUMPY_JNP = types.SimpleNamespace(
    abs=np.abs,
    minimum=np.minimum,
    maximum=np.maximum,
    right_shift=np.right_shift,
    bitwise_and=np.bitwise_and,
    ones_like=np.ones_like,
    zeros_like=np.zeros_like,
    bool_=np.bool_,
)
# lax.div and lax.rem truncate toward zero (the printer makes their dividends non-negative)
_NUMPY_LAX = types.SimpleNamespace(div=lambda x, d: np.sign(x) * (np.abs(x) // d), rem=np.fmod)


def import_file(path: pathlib.Path):
    name = f"_svgen_test_module_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compile_spec_text(text: str, out_dir: pathlib.Path, **analyze_options):
    """Analyze + render a spec given as YAML text; import the generated module."""
    spec = parse_spec(text, source="test.yaml")
    plan = analyze(spec, **analyze_options)
    out_dir.mkdir(parents=True, exist_ok=True)
    for filename, data in codegen.render(plan, "specs/test.yaml").items():
        (out_dir / filename).write_bytes(data)
    return plan, import_file(out_dir / codegen.module_filename(spec.name, plan.backend))


# -- child processes -----------------------------------------------------------------------


def run_python(*args: str, cwd=REPO, **options) -> subprocess.CompletedProcess:
    """`python ARGS` with this interpreter in a child process, from ``cwd``, its output
    captured as text; ``options`` go to subprocess.run (env, timeout, check)."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, **options
    )


def run_svgen(*args: str, cwd=REPO, **options) -> subprocess.CompletedProcess:
    """`svgen ARGS` in a child process (python -m svgen.cli), as run_python runs it."""
    return run_python("-m", "svgen.cli", *args, cwd=cwd, **options)


# What run_on_cpu_devices runs first: the device count, set before JAX initialises.
_ON_CPU_DEVICES = """\
import os, sys, tempfile, pathlib
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={devices}"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
sys.path.insert(0, {tests!r})
"""


def run_on_cpu_devices(body: str, devices: int, **fields) -> str:
    """``body`` (a script, dedented and its {fields} formatted) in a child process of its own
    on ``devices`` virtual CPU devices, after the lines that set them up and import os, sys,
    tempfile, pathlib, jax, jnp, np, Mesh and P, with the tests folder on its path: it must
    exit 0 having printed OK; returns what it printed."""
    script = _ON_CPU_DEVICES.format(devices=devices, tests=str(REPO / "tests"))
    script += textwrap.dedent(body).format(**fields)
    result = run_python("-c", script, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert "OK" in result.stdout
    return result.stdout


# -- random specs (the brute-force, codegen and alignment tests) --------------------------

PREDICATES = [
    "abs(f_q - f_k) <= 1 and (h_q + f_k) % 3 != 1",
    "i_k < 100 or w_q == w_k",
    "(f_q - f_k) // 2 == 0 and not is_text_k",
    "max(h_q, h_k) - min(w_q, w_k) > 2",
    "is_text_q or abs(i_q - i_k) <= 17",
    "f_k * 2 <= f_q + 1 and h_q == h_k",
]


def _maybe(rng, hi) -> dict:
    """Sometimes nothing (the parameter left out), else {"v": a value in [0, hi]}."""
    return {} if rng.random() < 0.3 else {"v": int(rng.integers(0, hi + 1))}


def _spatial_window(rng, lay):
    frames = int(rng.integers(0, lay.frames))
    # The widest window is written without `frames` (every frame: the same mask), so the
    # random masks cover both forms and draw the same numbers as before.
    params = {} if frames == lay.frames - 1 else {"frames": frames}
    for key, size in (("rows", lay.height), ("cols", lay.width)):
        params.update({key: v for v in _maybe(rng, size).values()})
    return params


def _temporal_stride(rng, lay):
    params = {
        "rows": int(rng.integers(0, lay.height)),
        "cols": int(rng.integers(0, lay.width)),
        "stride": int(rng.integers(1, 4)),
    }
    params.update({"frames": v for v in _maybe(rng, lay.frames).values()})
    return params


def random_neighborhood(rng, lay, sized=0.8, dilated=0.3, least_dilation=1) -> dict:
    """Random parameters of a neighborhood on ``lay``: each axis given a size with chance
    ``sized`` and a dilation from ``least_dilation`` to 3 with chance ``dilated``, causal with
    chance 0.3."""
    params = {}
    for key, size in (("frames", lay.frames), ("rows", lay.height), ("cols", lay.width)):
        if rng.random() < sized:
            params[key] = int(rng.integers(1, size + 2))
        if rng.random() < dilated:
            params[f"{key[:-1]}_dilation"] = int(rng.integers(least_dilation, 4))
    if rng.random() < 0.3:
        params["causal"] = 1
    return params


def _band(rng, lay):
    if rng.random() < 0.5:
        return {"width": int(rng.integers(0, lay.seq_len))}
    return {"density": float(rng.choice([0.05, 0.2, 0.35, 0.9]))}


#: Random parameters of every primitive (not the combinators and ref, which random_mask
#: builds), by spec key: a primitive missing here fails test_classify.py's
#: test_every_primitive_is_generated.
PRIMITIVE_GENERATORS = {
    "first_frame": lambda rng, lay: {"frames": int(rng.integers(1, lay.frames + 2))},
    "spatial_window": _spatial_window,
    "temporal_stride": _temporal_stride,
    "band": _band,
    "prefix": lambda rng, lay: {"tokens": int(rng.integers(1, lay.seq_len + 5))},
    "text": lambda rng, lay: {},
    "causal_frames": lambda rng, lay: {},
    "block_causal": lambda rng, lay: {"frames": int(rng.integers(1, lay.frames + 2))},
    "cube_window": lambda rng, lay: {
        "cube_frames": int(rng.integers(1, 3)),
        "cube_rows": int(rng.integers(1, 4)),
        "cube_cols": int(rng.integers(1, 4)),
        "frames": int(rng.integers(0, 2)),
        "rows": int(rng.integers(0, 2)),
        "cols": int(rng.integers(0, 3)),
    },
    "neighborhood": lambda rng, lay: random_neighborhood(rng, lay),
    "radial": lambda rng, lay: (
        {} if rng.random() < 0.4 else {"width": int(rng.integers(1, lay.height * lay.width + 3))}
    ),
    "expr": lambda rng, lay: (
        str(rng.choice(PREDICATES)) if rng.random() < 0.5 else random_predicate(rng)
    ),
    "blocks": lambda rng, lay: _random_blocks(rng, lay),
}
#: Primitives whose values are files, left out of random_primitive: the GPU, run-time and
#: chunk tests take every random mask, and those calls refuse them (docs/limits.md);
#: tests/test_block_data.py composes them with random masks of the others instead.
FILE_PRIMITIVES = ("blocks",)


def _random_blocks(rng, lay) -> dict:
    """A random block mask for `lay`, written to a .npy named by its content (so that equal
    draws share one file and a test's mask never changes under it)."""
    block = int(rng.choice([1, 3, 8, 16, 40]))
    n = -(-lay.seq_len // block)
    bits = (rng.random((n, n)) < rng.uniform(0.1, 0.7)).astype(np.uint8)
    digest = hashlib.sha256(bits.tobytes() + bytes([block])).hexdigest()[:16]
    folder = pathlib.Path(tempfile.gettempdir()) / "svgen-test-blocks"
    folder.mkdir(exist_ok=True)
    path = folder / f"{digest}_{n}.npy"
    if not path.exists():  # written whole, then renamed: another worker may read it now
        partial = folder / f"{digest}_{n}.{os.getpid()}.partial.npy"
        np.save(partial, bits)
        os.replace(partial, path)
    return {"file": str(path), "block": block}


# -- tiling.align by brute force (test_align and the fuzzing of whole specs) ----------------


def _blocks(seq_len: int, block: int):
    return [(s, min(s + block, seq_len)) for s in range(0, seq_len, block)]


def brute_force_align(keep: np.ndarray, bq: int, bkv: int, mode: str):
    """(aligned kinds, aligned keep) from the dense mask, straight from the mode's definition."""
    n = keep.shape[0]
    qs, ks = _blocks(n, bq), _blocks(n, bkv)
    kinds = np.empty((len(qs), len(ks)), np.int8)
    kept, real = {}, {}
    for i, (q0, q1) in enumerate(qs):
        for j, (k0, k1) in enumerate(ks):
            block = keep[q0:q1, k0:k1]
            kinds[i, j] = (
                TileKind.FULL
                if block.all()
                else TileKind.BOUNDARY
                if block.any()
                else TileKind.EMPTY
            )
            if kinds[i, j] == TileKind.BOUNDARY:
                kept[i, j], real[i, j] = int(block.sum()), block.size
    if mode == "superset":
        promote = set(kept)
    elif mode == "subset":
        promote = set()
    elif mode == "nearest":
        promote = {b for b in kept if 2 * kept[b] >= real[b]}
    else:  # balanced: every prefix of the order tried, the closest count (first of equals)
        order = sorted(kept, key=lambda b: (-Fraction(kept[b], real[b]), b))
        base = int(keep.sum()) - sum(kept.values())
        counts = [base + sum(real[b] for b in order[:m]) for m in range(len(order) + 1)]
        distance = [abs(c - int(keep.sum())) for c in counts]
        promote = set(order[: distance.index(min(distance))])
    aligned = keep.copy()
    for i, j in kept:
        kinds[i, j] = TileKind.FULL if (i, j) in promote else TileKind.EMPTY
        aligned[qs[i][0] : qs[i][1], ks[j][0] : ks[j][1]] = (i, j) in promote
    return kinds, aligned


def check_budget(budget, keep: np.ndarray, aligned: np.ndarray):
    n = keep.shape[0]
    assert budget.total_pairs == n * n
    assert budget.exact_pairs == int(keep.sum())
    assert budget.aligned_pairs == int(aligned.sum())
    assert budget.pairs_added == int((aligned & ~keep).sum())
    assert budget.pairs_dropped == int((keep & ~aligned).sum())
    assert budget.rows_emptied == int((keep.any(axis=1) & ~aligned.any(axis=1)).sum())
    both = int((keep & aligned).sum())
    assert budget.recall == (both / keep.sum() if keep.sum() else 1.0)
    assert budget.precision == (both / aligned.sum() if aligned.sum() else 1.0)


def aligned_user_keep(pattern) -> np.ndarray:
    """The aligned mask, dense, in the user's order: FULL blocks keep every pair, EMPTY none
    (an aligned pattern has no BOUNDARY block)."""
    lay, grid = pattern.layout, pattern.compute_grid
    kinds = pattern.compute_kinds
    expand = np.repeat(np.repeat(kinds, grid.block_q, 0), grid.block_kv, 1)[
        : lay.seq_len, : lay.seq_len
    ]
    assert not np.any(kinds == TileKind.BOUNDARY)
    aligned = expand == TileKind.FULL
    position = np.empty(lay.seq_len, np.int64)
    position[lay.original_index(np.arange(lay.seq_len))] = np.arange(lay.seq_len)
    return aligned[np.ix_(position, position)]


# -- random user predicates: the printer's hard cases ---------------------------------------
# Sums and differences of floor divisions and modulos of shifted coordinates (dividends of
# both signs), products, nested abs / min / max, chained comparisons, boolean equalities,
# and / or / not: every form svgen.analysis.mask_code prints, drawn where a dropped
# parenthesis or a wrong shift changes values.


def random_integer(rng, depth: int, coords=("f", "h", "w", "i")) -> str:
    r = rng.random()
    if depth >= 3 or r < 0.3:
        name = f"{rng.choice(list(coords))}_{rng.choice(['q', 'k'])}"
        offset = int(rng.integers(-12, 13))
        return name if offset == 0 else f"({name} {'-' if offset > 0 else '+'} {abs(offset)})"
    if r < 0.36:
        return str(int(rng.integers(-9, 10)))
    a = random_integer(rng, depth + 1, coords)
    if r < 0.58:  # often minus a floor division or modulo: where parentheses matter most
        b = random_integer(rng, depth + 1, coords)
        if rng.random() < 0.4:
            b = f"({b} {rng.choice(['//', '%'])} {int(rng.integers(2, 9))})"
        return f"({a} {rng.choice(['+', '-'])} {b})"
    if r < 0.76:
        return f"({a} {rng.choice(['//', '%'])} {int(rng.integers(1, 9))})"
    if r < 0.82:
        return f"({a} * {int(rng.integers(-3, 4))})"
    if r < 0.9:
        return f"-abs({a})" if rng.random() < 0.3 else f"abs({a})"
    fn = rng.choice(["min", "max"])
    return f"{fn}({a}, {random_integer(rng, depth + 1, coords)})"


def _random_comparison(rng, coords=("f", "h", "w", "i")) -> str:
    ops = ["<", "<=", ">", ">=", "==", "!="]
    text = random_integer(rng, 1, coords)
    for _ in range(1 if rng.random() < 0.75 else 2):  # sometimes chained: a < b <= c
        text += f" {rng.choice(ops)} {random_integer(rng, 1, coords)}"
    return text


def random_axis_predicate(rng, depth: int = 0, places: bool = False) -> str:
    """A random `expr` whose comparisons each read one axis (f, h or w: clamps, windows,
    dilations, bands of every shape), with `places` also rows and columns together (a window
    over h * W + w), or only the token classes, joined by and / or / not / boolean
    (in)equality: the per-axis form svgen.analysis.product analyzes exactly."""
    r = rng.random()
    if depth >= 2 or r < 0.4:
        if rng.random() < 0.1:
            return str(rng.choice(["is_text_q", "is_text_k", "not is_text_k"]))
        if places and rng.random() < 0.3:
            return _random_comparison(rng, ("h", "w"))
        return _random_comparison(rng, (str(rng.choice(["f", "h", "w"])),))
    if r < 0.5:
        return f"not ({random_axis_predicate(rng, depth + 1, places)})"
    a = random_axis_predicate(rng, depth + 1, places)
    b = random_axis_predicate(rng, depth + 1, places)
    if r < 0.9:
        return f"({a}) {rng.choice(['and', 'or'])} ({b})"
    return f"({a}) {rng.choice(['==', '!='])} ({b})"


def random_predicate(rng, depth: int = 0) -> str:
    """A random `expr` (user syntax) over any geometry; at most ~150 tokens."""
    r = rng.random()
    if depth >= 2 or r < 0.45:
        return _random_comparison(rng)
    if r < 0.55:
        return f"not ({random_predicate(rng, depth + 1)})"
    if r < 0.85:
        joiner = rng.choice(["and", "or"])
        return f"({random_predicate(rng, depth + 1)}) {joiner} ({random_predicate(rng, depth + 1)})"
    op = rng.choice(["==", "!="])  # boolean (in)equality: a segment mask's natural form
    return f"({random_predicate(rng, depth + 1)}) {op} ({random_predicate(rng, depth + 1)})"


def random_primitive(rng, lay: TokenLayout) -> dict:
    keys = [k for k in PRIMITIVE_GENERATORS if k not in FILE_PRIMITIVES]
    key = keys[rng.integers(0, len(keys))]
    return {key: PRIMITIVE_GENERATORS[key](rng, lay)}


def random_mask(rng, lay, depth=0) -> dict:
    r = rng.random()
    if depth >= 3 or r < 0.35:
        return random_primitive(rng, lay)
    if r < 0.6:
        return {"any_of": [random_mask(rng, lay, depth + 1) for _ in range(rng.integers(1, 4))]}
    if r < 0.85:
        return {"all_of": [random_mask(rng, lay, depth + 1) for _ in range(rng.integers(1, 4))]}
    return {"not": random_mask(rng, lay, depth + 1)}


def random_layout(rng) -> TokenLayout:
    text = int(rng.choice([0, 0, 3, 17]))
    frames = int(rng.integers(1, 6))
    order = str(rng.choice(["frame_major", "temporal_major"]))
    anchors = int(rng.integers(0, frames + 1)) if order == "temporal_major" else 0
    return TokenLayout(
        frames,
        int(rng.integers(1, 6)),
        int(rng.integers(1, 9)),
        text,
        "first" if bool(rng.integers(0, 2)) else "last",
        order,
        anchors,
    )


def random_tiled_layout(rng) -> TokenLayout:
    """A tiled layout with cubes that may not divide the video (ragged edge cubes)."""
    frames, height, width = (int(rng.integers(1, n)) for n in (6, 7, 9))
    cube = tuple(int(rng.integers(1, n + 1)) for n in (frames, height, width))
    text = int(rng.choice([0, 0, 3, 17]))
    position = "first" if rng.integers(0, 2) else "last"
    return TokenLayout(frames, height, width, text, position).with_order(Tiled(*cube))


def random_any_layout(rng) -> TokenLayout:
    """Any of the three token orders (a third of the draws tiled)."""
    return random_tiled_layout(rng) if rng.random() < 1 / 3 else random_layout(rng)


# -- kernels at test size ------------------------------------------------------------

SMALL_GEOMETRY = {"frames": 5, "height": 4, "width": 26}  # 520 video tokens: not a tile multiple


TWO_LEVEL = {"block_q": 256, "block_kv": 512, "compute_q": 128, "compute_kv": 128}


def scaled_spec_text(path, text_tokens=None, heads=2, tiling=None, dtype="float32") -> str:
    """The same pattern at SMALL_GEOMETRY, `heads` heads, 128 x 128 tiles (or `tiling`), for
    q, k, v of `dtype` (a kernel refuses any other)."""
    spec = yaml.safe_load(path.read_text())
    full = spec["geometry"]
    full_video = full["frames"] * full["height"] * full["width"]
    small = dict(full, **SMALL_GEOMETRY)
    chunk = (spec.get("runtime") or {}).get("kv_cache", {}).get("chunk_frames")
    if chunk:  # whole chunks of frames
        small["frames"] = chunk * -(-small["frames"] // chunk)
    cache = (spec.get("runtime") or {}).get("kv_cache", {})
    if "window_frames" in cache:  # a rolling cache fitting the smaller video (it may not wrap)
        cache["sink_frames"] = min(cache.get("sink_frames", 0), small["frames"] - chunk)
        cache["window_frames"] = min(cache["window_frames"], small["frames"] - cache["sink_frames"])
    small_video = small["frames"] * small["height"] * small["width"]
    if full.get("text_tokens"):
        small["text_tokens"] = 40 if text_tokens is None else text_tokens
    spec["geometry"] = small
    spec["attention"] = dict(spec["attention"], heads=heads, dtype=dtype)
    assign = (spec.get("heads") or {}).get("assign")
    if isinstance(assign, list):  # the first `heads` heads' patterns
        spec["heads"]["assign"] = assign[:heads]
    spec["tiling"] = tiling or {"block_q": 128, "block_kv": 128}
    # "the first frame's tokens" at either size, a band's width: scaled with the video
    from svgen.chip.gpu_bench import scale_mask_terms

    scale_mask_terms(spec, small_video, full_video)
    return yaml.safe_dump(spec, sort_keys=False)


def straight_band(name: str, *, geometry=(5, 8, 15), tiling=None, beside=()) -> str:
    """A band with a prefix sink at a small size (as the blog spec), and the terms ``beside``
    them: 2 x 4 compute blocks a tile unless ``tiling`` says otherwise, so its BOUNDARY tiles
    have straight-line words, and the last kv tile holds padding keys."""
    mask = any_of("{band: {width: 150}}", "{prefix: {tokens: 100}}", *beside)
    tiling = tiling or "{block_q: 256, block_kv: 512, compute_q: 128, compute_kv: 128}"
    return spec_text(name, geometry, 2, layout="frame_major", mask=mask, tiling=tiling)
