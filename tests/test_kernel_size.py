"""bench/kernel_size.py: a kernel's program size as libtpu compiles it for v5e on this host.
Every pattern a module carries adds its code, so two patterns make a larger program."""

from __future__ import annotations

import sys

sys.path.insert(0, "bench")
import kernel_size  # noqa: E402

from svgen.spec import parse_spec  # noqa: E402
from test_chip_bench import MIXED  # noqa: E402

# The same module with one pattern: its temporal candidate left out.
ONE = MIXED.replace("    - {pattern: temporal, layout: temporal_major}\n", "")


def test_a_second_pattern_makes_a_larger_program():
    assert ONE != MIXED
    one = kernel_size.kernel_bundles(parse_spec(ONE, source="one.yaml"), "v5e")
    two = kernel_size.kernel_bundles(parse_spec(MIXED, source="two.yaml"), "v5e")
    assert 0 < one < two
