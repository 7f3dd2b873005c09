"""Shared helpers: brute-force oracles, and compiling a spec into an importable module."""

from __future__ import annotations

import importlib.util
import itertools
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from svgen import codegen, ir, libtpu_env
from svgen.analysis import analyze
from svgen.codegen.predicate import emit_mask
from svgen.runtime.layout import TokenLayout
from svgen.runtime import coords
from svgen.runtime.kinds import TileKind
from svgen.runtime.reference import masked_attention_reference
from svgen.spec import parse_spec

# Before any test starts JAX's backends (importing JAX does not): the AOT tests, and the
# subprocesses tests start (they inherit the environment), share libtpu with other processes
# on the machine and print none of its "no TPU here" warnings. See svgen/libtpu_env.py.
libtpu_env.prepare()

REPO = pathlib.Path(__file__).resolve().parent.parent
SPECS = sorted((REPO / "specs").glob("*.yaml"))
_module_counter = itertools.count()
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}


def dense_keep(mask, layout) -> np.ndarray:
    """keep[q, k] for every real pair, from the IR oracle (small geometries only)."""
    c = layout.coordinates(np.arange(layout.seq_len))
    return mask.evaluate(c.reshape(-1, 1), c.reshape(1, -1))


def brute_force_kinds(keep: np.ndarray, block_q: int, block_kv: int) -> np.ndarray:
    seq_len = keep.shape[0]
    nq, nk = -(-seq_len // block_q), -(-seq_len // block_kv)
    kinds = np.empty((nq, nk), np.int8)
    for i in range(nq):
        for j in range(nk):
            tile = keep[i * block_q:(i + 1) * block_q, j * block_kv:(j + 1) * block_kv]
            kinds[i, j] = (TileKind.FULL if tile.all() else
                           TileKind.BOUNDARY if tile.any() else TileKind.EMPTY)
    return kinds


def lower_mask_dict(mask: dict, lay: TokenLayout, bq: int, bkv: int):
    """(spec, lowered mask) of a spec with this mask (a dict as YAML would load it) on the
    geometry of ``lay``, through the spec reader and lowering as a user's file goes."""
    spec = parse_spec(yaml.safe_dump({
        "svgen": 1, "name": "random_mask",
        "geometry": {"frames": lay.frames, "height": lay.height, "width": lay.width,
                     "text_tokens": lay.text_tokens,
                     "text_position": lay.text_position},
        "attention": {"heads": 1, "head_dim": 128, "dtype": "float32"},
        "mask": mask, "tiling": {"block_q": bq, "block_kv": bkv},
    }))
    return spec, ir.lower(spec)


def emitted_function(mask, layout: TokenLayout):
    """(boundary_mask, its source): the generated mask function of ``mask``, as the
    module template writes it."""
    src = emit_mask(mask, layout)
    body = "\n".join(f"    {line}" for line in src.lines)
    text = f"def boundary_mask(q, k):\n{body}\n    return {src.result}\n"
    namespace = {"coords": coords, "jnp": jnp, "lax": jax.lax, "LAYOUT": layout}
    exec(compile(text, "<generated>", "exec"), namespace)
    return namespace["boundary_mask"], text


def emitted_keep(fn, layout: TokenLayout) -> np.ndarray:
    """keep[q, k] for every real pair from a generated boundary_mask, queries decoded in row
    form and turned into columns, as the kernel does once per q tile."""
    pos = jnp.arange(layout.seq_len, dtype=jnp.int32)
    q = coords.QueryCoords(pos[None, :], layout)
    k = coords.TokenCoords(pos[None, :], layout)
    return np.broadcast_to(np.asarray(fn(q, k)), (layout.seq_len, layout.seq_len))


def user_order_keep(pattern) -> np.ndarray:
    """keep[q, k] in the user's token order for one pattern (oracle, small geometry)."""
    keep = dense_keep(pattern.mask, pattern.layout)  # kernel order
    position = np.empty(pattern.layout.seq_len, np.int64)
    position[pattern.layout.original_index(np.arange(pattern.layout.seq_len))] = np.arange(
        pattern.layout.seq_len)
    return keep[np.ix_(position, position)]


def mixed_inputs(plan, dtype, seed, heads=4):
    rng = np.random.default_rng(seed)
    shape = (heads, plan.layout.seq_len, plan.spec.attention.head_dim)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    if dtype == "bfloat16":
        q, k, v = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    return q, k, v


def check_per_head(plan, out, q, k, v, head_pattern, dtype):
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite output rows"
    q64, k64, v64 = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (q, k, v))
    keeps = [user_order_keep(p) for p in plan.patterns]
    for head, pattern in enumerate(np.asarray(head_pattern).tolist()):
        ref = masked_attention_reference(q64[head], k64[head], v64[head], keeps[pattern])
        err = np.max(np.abs(out[head] - ref)) / np.max(np.abs(ref))
        assert err <= TOLERANCE[dtype], f"head {head} ({plan.patterns[pattern].name}): {err:.2e}"
        assert np.all(out[head][~keeps[pattern].any(axis=1)] == 0.0)  # no key: exactly 0


def unprepared_environment() -> dict[str, str]:
    """This process's environment less what libtpu_env.prepare() set: a user's shell, for a
    subprocess that must prepare libtpu itself."""
    return {k: v for k, v in os.environ.items()
            if k not in (*libtpu_env.SHARING, *libtpu_env.NO_CHIP)}


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
    return plan, import_file(out_dir / codegen.module_filename(spec.name))


@pytest.fixture
def compile_text(tmp_path):
    counter = itertools.count()

    def run(text: str, **analyze_options):
        return compile_spec_text(text, tmp_path / f"gen{next(counter)}", **analyze_options)

    return run
