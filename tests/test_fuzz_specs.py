"""Differential fuzzing of whole specs, everything at once: random masks (every primitive,
random user predicates), all three token orders (tiled with ragged cubes), text first or
last, tiles cut into compute blocks, every align mode; the plan against brute force (kinds
of tiles and compute blocks, densities, the pair budget) and, for a sample, the generated
module's kernel and its gradients against float64 in NaN-poisoned interpret mode."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from svgen.analysis import analyze
from svgen.runtime.layout import Tiled, TokenLayout
from svgen.runtime.reference import masked_attention_reference
from svgen.spec import ALIGN_MODES, parse_spec

from helpers import (
    TOLERANCE,
    aligned_user_keep,
    brute_force_align,
    brute_force_kinds,
    check_budget,
    dense_keep,
    random_mask,
    user_order_keep,
)
from kernel_helpers import POISONED, check_grads, check_per_head, mixed_inputs

CASES = 48
KERNEL_EVERY = 6  # every sixth case runs its kernel (and gradients) too


def _layout_key(lay):
    if lay.is_tiled:
        return {"tiled": dict(zip(("frames", "rows", "cols"), lay.cube))}
    return lay.order


def random_geometry(rng) -> TokenLayout:
    """Any order (tiled with ragged cubes a third of the time), 96-1,600 tokens, text first,
    last or none: several 128-512-token tiles, sizes that rarely divide them."""
    frames, height, width = (
        int(rng.integers(1, 7)),
        int(rng.integers(2, 11)),
        int(rng.integers(4, 25)),
    )
    text = int(rng.choice([0, 0, 9, 40, 77]))
    lay = TokenLayout(frames, height, width, text, str(rng.choice(["first", "last"])))
    r = rng.random()
    if r < 1 / 3:
        cube = tuple(int(rng.integers(1, n + 1)) for n in (frames, height, width))
        return lay.with_order(Tiled(*cube))
    return lay.with_order("temporal_major" if r < 2 / 3 else "frame_major")


def random_spec(rng) -> tuple[str, str]:
    """(spec text, align mode) of a random mask on a random geometry and tiling (tiles of one
    or two compute blocks of 128 or 256 per side)."""
    geometry = random_geometry(rng)
    cq, ckv = (int(rng.choice([128, 256])) for _ in range(2))
    tiling = {
        "block_q": cq * int(rng.choice([1, 2])),
        "block_kv": ckv * int(rng.choice([1, 2])),
        "compute_q": cq,
        "compute_kv": ckv,
    }
    mode = str(rng.choice(ALIGN_MODES))
    if mode != "exact":
        tiling["align"] = mode
    spec = {
        "svgen": 1,
        "name": "fuzz",
        "geometry": {
            "frames": geometry.frames,
            "height": geometry.height,
            "width": geometry.width,
            "text_tokens": geometry.text_tokens,
            "text_position": geometry.text_position,
        },
        "attention": {"heads": 2, "head_dim": 128, "dtype": "float32"},
        "layout": _layout_key(geometry),
        "mask": random_mask(rng, geometry),
        "tiling": tiling,
    }
    return yaml.safe_dump(spec, sort_keys=False), mode


def _check_plan(plan, mode: str, text: str) -> None:
    (pattern,) = plan.patterns
    keep = dense_keep(pattern.mask, pattern.layout)
    fine, tile = pattern.compute_grid, pattern.grid
    exact = pattern.classification.density_is_exact
    if mode == "exact":
        want_fine = brute_force_kinds(keep, fine.block_q, fine.block_kv)
        assert pattern.classification.kept_pairs == int(keep.sum()), text
        want_tiles = brute_force_kinds(keep, tile.block_q, tile.block_kv)
        if exact:
            np.testing.assert_array_equal(pattern.compute_kinds, want_fine, err_msg=text)
            np.testing.assert_array_equal(pattern.kinds, want_tiles, err_msg=text)
        assert pattern.density == pytest.approx(keep.mean()), text
        return
    assert exact, text  # align needs exact counts: small specs always have them
    want_fine, aligned = brute_force_align(keep, fine.block_q, fine.block_kv, mode)
    np.testing.assert_array_equal(pattern.compute_kinds, want_fine, err_msg=text)
    want_tiles = brute_force_kinds(aligned, tile.block_q, tile.block_kv)
    np.testing.assert_array_equal(pattern.kinds, want_tiles, err_msg=text)
    assert pattern.classification.kept_pairs == int(aligned.sum()), text
    check_budget(pattern.budget, keep, aligned)


@pytest.mark.parametrize("seed", range(CASES))
def test_random_specs_against_brute_force(seed, compile_text):
    rng = np.random.default_rng(70_000 + seed)
    text, mode = random_spec(rng)
    if seed % KERNEL_EVERY:
        _check_plan(analyze(parse_spec(text)), mode, text)
        return
    plan, module = compile_text(text)
    _check_plan(plan, mode, text)
    (pattern,) = plan.patterns
    keeps = [user_order_keep(pattern) if mode == "exact" else aligned_user_keep(pattern)]
    q, k, v = mixed_inputs(plan, "float32", seed=seed, heads=2)
    out = module.attention(q, k, v, interpret=POISONED)
    if mode == "exact":
        check_per_head(plan, out, q, k, v, [0, 0], "float32")
    else:
        _check_against(out, q, k, v, keeps[0])
    check_grads(plan, module, q, k, v, [0, 0], "float32", keeps=keeps)


def _check_against(out, q, k, v, keep) -> None:
    out = np.asarray(out)
    assert np.all(np.isfinite(out)), "unwritten (NaN) or non-finite output rows"
    for head in range(out.shape[0]):
        q64, k64, v64 = (np.asarray(x[head], np.float64) for x in (q, k, v))
        ref = masked_attention_reference(q64, k64, v64, keep)
        err = np.max(np.abs(out[head] - ref)) / max(np.max(np.abs(ref)), 1e-30)
        assert err <= TOLERANCE["float32"], err
        assert np.all(out[head][~keep.any(axis=1)] == 0.0)
