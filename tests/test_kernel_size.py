"""bench/kernel_size.py: a kernel's program size as libtpu compiles it for v5e on this host.
Every pattern a module carries adds its code, so two patterns make a larger program."""

from __future__ import annotations

import sys

sys.path.insert(0, "bench")
import kernel_size  # noqa: E402

from svgen.spec import parse_spec  # noqa: E402

ONE = """
svgen: 1
name: tiny_one
geometry: {frames: 4, height: 8, width: 16}
attention: {heads: 2, head_dim: 128, dtype: bfloat16}
mask:
  any_of:
    - first_frame: {frames: 1}
    - spatial_window: {frames: 1}
tiling: {block_q: 128, block_kv: 128}
"""

TWO = """
svgen: 1
name: tiny_two
geometry: {frames: 4, height: 8, width: 16}
attention: {heads: 2, head_dim: 128, dtype: bfloat16}
patterns:
  spatial:
    any_of:
      - first_frame: {frames: 1}
      - spatial_window: {frames: 1}
  temporal:
    any_of:
      - first_frame: {frames: 1}
      - temporal_stride: {rows: 0, cols: 0}
heads:
  candidates:
    - {pattern: spatial}
    - {pattern: temporal, layout: temporal_major}
  assign: runtime
tiling: {block_q: 128, block_kv: 128}
"""


def test_a_second_pattern_makes_a_larger_program():
    one = kernel_size.kernel_bundles(parse_spec(ONE, source="one.yaml"), "v5e")
    two = kernel_size.kernel_bundles(parse_spec(TWO, source="two.yaml"), "v5e")
    assert 0 < one < two
