"""The libtpu final-bundles parser and per-path costs, on a synthetic listing and end to end."""

import json
import subprocess
import textwrap

import pytest

from helpers import run_python, unprepared_environment
from svgen.estimate.tpu_schedule import DELAY_SLOTS, op_family, parse_bundles

# A listing in libtpu's format: straight-line code, the grid loop [0x2, 0x1f] (exit test
# immediate 6) holding a forward branch at 0x4 (target: region 20 at 0x18) whose body holds a
# nested branch at 0xa (target: region 21 at 0x11) and an inner loop [0x12, 0x17] of 3 trips;
# plus a multi-line comment quoting another op (nested /* */, braces, ;;) as libtpu prints
# bounds checks.
SYNTHETIC = """\
= control target key start
LB: loop body
PF: predicated region fallthrough
= control target key end

     0   :  { %s1_s0 = smov 0  ;;  %2 = vsyncpa [#allocation3], 0 }
   0x1   :  { %s3_s1 = smov 0 } /* Start region 5 */
   0x2 LB: > { %s4_s2 = sadd.s32 1, %s3_s1 } /* Start region 9 */
   0x3   : > { %p5_p0 = scmp.eq.s32.totalorder %s4_s2, 2  ;;  %6 = shalt.err (!%p7_p1) /* BoundsCheck for %8 = dma.hbm_to_vmem (%p9), /*hbm=*/%s1 ;; {x} /*
base_bounds: {1, 2} ;; x
 */ */ }
   0x4   : > { %10 = sbr.rel (%p5_p0) target = $region20 }
   0x5   : > { %s11_s3 = smov 7 }
   0x6   :  {}
   0x7   :  {}
   0x8   :  {}
   0x9   : > { %v12_v0 = vld [vmem:[#allocation2] sm:$0xff]  ;;  %p13_p2 = scmp.lt.s32.totalorder %s4_s2, 1 }
   0xa   : > { %14 = sbr.rel (!%p13_p2) target = $region21 }
   0xb   :  {}
   0xc   :  {}
   0xd   :  {}
   0xe   :  {}
   0xf   : > { %15 = vmatmul.mubr.bf16.gmra.mxu0 %v12_v0 }
  0x10   : > { %v16_v1 = vpop.f32.mrf.mxu0 }
  0x11 PF: > { %v17_v2 = vpow2.f32 %v16_v1 } /* Start/End empty region 21 */
  0x12 LB: > { %p18_p3 = scmp.ge.s32.totalorder %s19_s4, 3 /* loop exit test */ } /* Start region 30 */
  0x13   : > { %20 = sbr.rel (!%p18_p3) target = $region30 }
  0x14   :  {}
  0x15   :  {}
  0x16   :  {}
  0x17   :  {} /* End region 30 */
  0x18 PF: > { %21 = vst [vmem:[#allocation2] sm:$0xff] %v17_v2 } /* Start/End empty region 20 */
  0x19   : > { %22 = dma.done.wait (%p5_p0), [#allocation4], 128 }
  0x1a   : > { %p23_p4 = scmp.ge.s32.totalorder %s4_s2, 6 /* loop exit test */ }
  0x1b   : > { %24 = sbr.rel (!%p23_p4) target = $region9 }
  0x1c   :  {}
  0x1d   :  {}
  0x1e   :  {}
  0x1f   :  {} /* End region 9 */
  0x20   :  { %25 = vsyncpa [#allocation3], 1 } /* exit bundle */
"""


def test_parse_synthetic_listing():
    schedule = parse_bundles(SYNTHETIC)
    assert len(schedule.bundles) == 0x21
    assert schedule.bundles[2].markers == ("LB",)
    assert len(schedule.bundles[3].ops) == 2  # comment braces and ;; do not split ops
    assert schedule.bundles[6].ops == ()
    grid = schedule.grid_loop
    assert (grid.start, grid.end, grid.trip_count) == (0x2, 0x1B + DELAY_SLOTS, 6)
    inner = [loop for loop in schedule.loops if loop is not grid]
    assert [(loop.start, loop.end, loop.trip_count) for loop in inner] == [(0x12, 0x17, 3)]
    assert schedule.outside_loop_bundles == 3

    outer, nested = schedule.branches_in_loop()
    assert (outer.address, outer.target, outer.depth) == (0x4, 0x18, 0)
    assert (nested.address, nested.target, nested.depth) == (0xA, 0x11, 1)
    assert (outer.predicate, nested.predicate) == ("%p5_p0", "!%p13_p2")
    assert outer.skipped == range(0x9, 0x18) and nested.skipped == range(0xF, 0x11)
    assert nested.mix == {"vmatmul": 1, "vpop.mrf": 1}
    assert outer.mix["vmatmul"] == 1 and outer.mix["vpow2"] == 1 and outer.mix["vld"] == 1
    assert "vst" not in outer.mix and "dma.wait" not in outer.mix

    # Nothing skipped: 30 loop bundles, the inner loop's 6 counted 3 times, not once.
    assert schedule.path_cost() == 30 + 2 * 6
    # The nested body (2 bundles) skipped.
    assert schedule.path_cost({0xA}) == 42 - 2
    # The outer body (0x9..0x17: 15 bundles, inner loop included) skipped: nested is moot.
    assert schedule.path_cost({0x4}) == 30 - 15
    assert schedule.path_cost({0x4, 0xA}) == 30 - 15
    with pytest.raises(ValueError):
        schedule.path_cost({0x5})  # not a branch


def test_op_families():
    assert op_family("%v1_v2 = vpop.f32.mrf.mxu1") == "vpop.mrf"
    assert op_family("%v1 = vpop.eup %3") == "vpop.eup"
    assert op_family("%7 = vmatpush3.bf16.msra.mxu0 %v1") == "vmatpush"
    assert op_family("%7 = dma.done.wait (%p1), %s2, 8192") == "dma.wait"
    assert op_family("%v9 = vcmp.lt.s32.totalorder %v1, %v2") == "vcmp"


def test_unterminated_bundle_is_an_error():
    with pytest.raises(ValueError):
        parse_bundles("   0   :  { %s1_s0 = smov 0 /* } */\n")


# Runs in its own process: libtpu reads its dump flags once, when it loads, and other tests
# of this suite load it (get_topology_desc) without them.
E2E_SCRIPT = textwrap.dedent("""
    import json
    from svgen.estimate import tpu_schedule
    tpu_schedule.ensure_dump_flags()
    import jax, jax.numpy as jnp
    from jax.experimental import pallas as pl

    STEPS = 4

    def kernel(x_ref, y_ref, o_ref):
        step = pl.program_id(0)

        @pl.when(step == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        @pl.when(step > 0)
        def _():
            o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    def fn(x, y):
        return pl.pallas_call(
            kernel, grid=(STEPS,),
            in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0)),
                      pl.BlockSpec((128, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((STEPS * 128, 128), jnp.float32),
            name="tpu_schedule_probe")(x, y)

    sharding = tpu_schedule.tpu_sharding("v6e")
    x = jax.ShapeDtypeStruct((STEPS * 128, 128), jnp.bfloat16, sharding=sharding)
    y = jax.ShapeDtypeStruct((128, 128), jnp.bfloat16, sharding=sharding)
    schedule = tpu_schedule.compile_and_dump(fn, x, y, kernel_name="tpu_schedule_probe")
    branches = schedule.branches_in_loop()
    print(json.dumps({
        "steps": STEPS,
        "trip_count": schedule.grid_loop.trip_count,
        "branches": [{"address": b.address, "depth": b.depth, "mix": b.mix} for b in branches],
        "costs": {b.address: schedule.path_cost({b.address}) for b in branches},
        "cost_all": schedule.path_cost(),
    }))
""")


def test_end_to_end_tiny_pallas_kernel_for_v6e():
    result = run_script(E2E_SCRIPT, env=unprepared_environment())
    assert result.returncode == 0, result.stderr[-3000:]
    # ensure_dump_flags() prepared libtpu's environment itself: none of its warnings here.
    assert "WARNING" not in result.stderr and "E0000" not in result.stderr, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["trip_count"] == report["steps"] + 2  # + pipeline prologue and epilogue
    branches = report["branches"]
    assert len(branches) >= 2
    matmul = [b for b in branches if b["mix"].get("vmatmul", 0) > 0 and b["depth"] > 0]
    assert len(matmul) == 1  # the step > 0 body (depth 0 is the pipeline stage around it)
    assert report["costs"][str(matmul[0]["address"])] < report["cost_all"]


def run_script(script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_python("-c", script, timeout=300, env=env)


def test_dump_flags_after_libtpu_started_is_an_error():
    """Flags set after libtpu loaded would be ignored silently: refuse instead."""
    result = run_script(
        textwrap.dedent("""
        import jax
        jax.devices("cpu")  # probes the TPU plugin: libtpu loads
        from svgen.estimate import tpu_schedule
        try:
            tpu_schedule.ensure_dump_flags()
        except RuntimeError as error:
            print("fresh process" in str(error))
    """)
    )
    assert result.stdout.strip().splitlines()[-1:] == ["True"], result.stderr[-3000:]
