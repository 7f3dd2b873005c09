"""`svgen cost`: the static model of a kernel's time on a TPU, from libtpu's schedule of
the kernel compiled on this host."""

from __future__ import annotations

import importlib.util
import json
import sys

from svgen.cli.plan import plan_spec
from svgen.spec.errors import SpecError

#: What `svgen cost` says where libtpu is missing (a CPU-only install:
#: `pip install svgen-attention`).
NO_LIBTPU = (
    "svgen cost compiles the kernel with libtpu, the TPU compiler, which is not "
    "installed here; install it with: pip install 'svgen-attention[tpu]'"
)


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def cost_spec(args) -> int:
    """The cost report of `args.spec`; libtpu must be installed (svgen.cli checks first)."""
    from svgen.estimate import cost, cost_text

    # libtpu must learn where to dump its schedules before anything starts it.
    from svgen.estimate.tpu_schedule import NoGridLoop, ensure_dump_flags

    ensure_dump_flags()
    plan = plan_spec(args.spec, quiet=args.json, smem_budget=args.smem_budget, target=args.target)
    progress = None if args.json else (lambda message: print(f"  {message}", file=sys.stderr))
    try:
        report = cost.cost_plan(
            plan,
            args.spec,
            use_cache=not args.no_cache,
            progress=progress,
            training=args.backward,
            dense_search=True,
        )
    except NoGridLoop as err:  # a kernel check_costable let through: still no traceback
        raise SpecError(
            f"svgen cost cannot read this kernel's schedule: {err}", file=args.spec, key="tiling"
        ) from None
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for line in cost_text.format_report(report, plan):
            print(line)
    return 0
