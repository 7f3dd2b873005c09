"""A spec's canonical JSON: what its digest hashes (only the keys a spec declares where a
default would otherwise change every generated module's digest).
"""

from __future__ import annotations

import hashlib
import json


from svgen.core.layout import (
    TILED,
    AxisOrder,
    Curve,
    Tiled,
)
from svgen.spec.model import (
    GpuTiling,
    HeadPatterns,
    MaskTerm,
    Runtime,
    SOFTMAX_MODES,
    QK_MODES,
    Select,
    Spec,
    Tiling,
)

# ----------------------------------------------------------------------------- canonical form


def _term_json(term: MaskTerm) -> dict:
    return {
        "op": term.op,
        "params": {k: v for k, v in term.params},
        "children": [_term_json(c) for c in term.children],
    }


def _heads_json(heads: HeadPatterns) -> dict:
    return {
        "candidates": [
            {"pattern": c.pattern, "layout": _layout_json(c.layout)} for c in heads.candidates
        ],
        "assign": "runtime" if heads.assign is None else list(heads.assign),
    }


def _canonical_obj(name, geometry, attention, layout, mask, patterns, heads, tiling) -> dict:
    # A mask spec's form is exactly what it was before ``heads`` existed (no "heads" key),
    # so the digests embedded in generated files stay valid; a heads spec has no "mask".
    obj = {
        "name": name,
        "geometry": {
            "frames": geometry.frames,
            "height": geometry.height,
            "width": geometry.width,
            "text_tokens": geometry.text_tokens,
            "text_position": geometry.text_position,
        },
        "attention": {
            "heads": attention.heads,
            "head_dim": attention.head_dim,
            "dtype": attention.dtype,
        },
        "layout": _layout_json(layout),
        "mask": _term_json(mask) if mask is not None else None,
        "patterns": {n: _term_json(t) for n, t in patterns},
        "tiling": _tiling_json(tiling),
    }
    if heads is not None:
        del obj["mask"]
        obj["heads"] = _heads_json(heads)
    if attention.softmax != SOFTMAX_MODES[0]:  # declared only: older digests stay valid
        obj["attention"]["softmax"] = attention.softmax
    if attention.qk != QK_MODES[0]:  # declared only, as softmax
        obj["attention"]["qk"] = attention.qk
    return obj


def _layout_json(layout: str | Tiled | AxisOrder | Curve) -> str | dict:
    # A name as before (digests of older specs stay valid); a tiled layout as written, so
    # that its cube is part of the spec's identity.
    if isinstance(layout, str):
        return layout
    if isinstance(layout, AxisOrder):
        return {"order": list(layout.axes)}
    if isinstance(layout, Curve):  # `over` only where it is not the default
        return {"curve": layout.kind, **({"over": layout.over} if layout.over != "frame" else {})}
    return {TILED: {"frames": layout.frames, "rows": layout.rows, "cols": layout.cols}}


def _tiling_json(tiling: Tiling) -> dict:
    # Compute blocks appear only when given, and align only when it changes the mask, so
    # digests of older specs stay valid.
    out = {"block_q": tiling.block_q, "block_kv": tiling.block_kv}
    for key in ("compute_q", "compute_kv"):
        if getattr(tiling, key) is not None:
            out[key] = getattr(tiling, key)
    if tiling.aligned:
        out["align"] = tiling.align
    return out


def _with_gpu(obj: dict, gpu: GpuTiling | None) -> dict:
    # Only when given, so the digests of specs without it stay what they were.
    if gpu is not None:
        obj["gpu"] = {
            "block_q": gpu.block_q,
            "block_kv": gpu.block_kv,
            "num_warps": gpu.num_warps,
            "num_stages": gpu.num_stages,
        }
    return obj


def _with_runtime(obj: dict, runtime: Runtime) -> dict:
    # Only when something is declared, so the digests of specs without it stay what they were.
    if runtime.any:
        obj["runtime"] = {"segments": runtime.segments, "text_lengths": runtime.text_lengths}
        if runtime.per_video_frames:
            obj["runtime"]["per_video_frames"] = True
    if runtime.kv_cache:
        cache = {"chunk_frames": runtime.chunk_frames}
        if runtime.rolling:
            cache.update(sink_frames=runtime.sink_frames, window_frames=runtime.window_frames)
        obj.setdefault("runtime", {})["kv_cache"] = cache
    return obj


def _with_select(obj: dict, select: Select | None) -> dict:
    # Only when given, so the digests of specs without it stay what they were.
    if select is not None:
        obj["select"] = _select_json(select, select.rule)
        if select.sampled_rows:
            obj["select"]["sampled_rows"] = select.sampled_rows
        if select.patterns:  # only when given, as above
            obj["select"]["patterns"] = {
                own.pattern: _select_json(own, select.rule) for own in select.patterns
            }
    return obj


def _select_json(select, rule: str) -> dict:
    """A candidate and its amounts (the select section's, or one pattern's)."""
    out = {
        "candidate": _term_json(select.candidate),
        rule: {"default": select.default, "min": select.min_blocks, "max": select.max_blocks},
    }
    if select.max_blocks is None:  # declared only: the digests of specs with max stay
        del out[rule]["max"]
    return out


def _with_chip_tilings(obj: dict, spec: Spec) -> dict:
    # Only when the spec names a chip (`tiling.<chip>`), so the digests of specs without one
    # stay what they were. "tiling" is the tiling in effect (the chip's the spec was read
    # for), so modules of two chips with different tilings differ; the plain keys' and each
    # chip's are the rest of what the spec says.
    if spec.tilings:
        obj["chip_tilings"] = {
            "plain": _tiling_json(spec.tiling_for(None)),
            "chips": {name: _tiling_json(t) for name, t in spec.tilings},
        }
    return obj


def _canonical_dumps(obj: dict) -> str:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def canonical_json(spec: Spec) -> str:
    """The canonical JSON text the digest is computed from (no source, no locations)."""
    obj = _canonical_obj(
        spec.name,
        spec.geometry,
        spec.attention,
        spec.layout,
        spec.mask,
        spec.patterns,
        spec.heads,
        spec.tiling,
    )
    return _canonical_dumps(
        _with_chip_tilings(
            _with_select(_with_runtime(_with_gpu(obj, spec.gpu), spec.runtime), spec.select),
            spec,
        )
    )


def spec_digest(spec: Spec) -> str:
    """A spec's digest: the sha256 of its canonical JSON (what generated modules record)."""
    return hashlib.sha256(canonical_json(spec).encode("utf-8")).hexdigest()
