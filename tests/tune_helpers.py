"""Helpers of the `svgen tune` tests that test_compile_refusals uses too (no test module
imports another): a small band spec, per-path costs of the shape libtpu's schedules have
(so estimate_paths is exact on them), and a stand-in for the compile."""

from svgen.estimate.cost import PathCosts
from svgen.estimate.tune import Candidate

SPEC = """\
# yaml-language-server: $schema=../svgen.schema.json
# A small band: comments here, and after keys, must survive --apply.
svgen: 1
name: small_band
geometry: {frames: 5, height: 8, width: 26}   # 1,040 tokens
attention: {heads: 2, head_dim: 128, dtype: bfloat16}
layout: frame_major
mask:
  any_of:
    - band: {width: 200}   # the band
    - prefix: {tokens: 208}
# the tiling, as a flow mapping
tiling: {block_q: 512, block_kv: 512}  # tuned later
"""


SEQ_LEN = 1040


def synthetic_paths(c: Candidate, patterns: int = 1) -> PathCosts:
    """Per-path costs of the form estimate_paths assumes (so its estimates are exact)."""
    area = c.compute_q * c.compute_kv / (512 * 512)
    rq, rk = c.block_q // c.compute_q, c.block_kv // c.compute_kv
    per_block, r0 = round(600 * area), 150
    full, boundary, padded = round(700 * area), round(800 * area), round(900 * area)
    column = (SEQ_LEN - 1) % c.block_kv // c.compute_kv  # the block column holding padding
    block = tuple(
        (full, boundary, padded if i % rk == column else boundary) for i in range(c.blocks)
    )
    if c.blocks == 1:
        block = ((0, boundary + 14, padded + 14),)
    mixed = 300 if c.blocks == 1 else 300 + 14 * c.blocks
    return PathCosts(
        300,
        300 + rq * (r0 + rk * per_block),
        (mixed,) * patterns,
        (block,) * patterns,
        (c.block_q // 4,) * patterns,
        c.block_q // 8,
        90,
    )


def fake_measure(compiled: list):
    def measure(plan):
        t = plan.spec.tiling
        c = Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align)
        compiled.append(c.code_key)
        return synthetic_paths(c, len(plan.patterns))

    return measure


def write_spec(tmp_path, text=SPEC):
    path = tmp_path / "small_band.yaml"
    path.write_text(text)
    return path
