"""A kernel libtpu refuses for lack of VMEM at compile time (CompileTimeScopedVmemOom):
`svgen cost` says so in one line (exit 2) naming the tiling and the VMEM needed against the
limit; `svgen tune` skips the candidate, with why, and ranks the rest."""

import textwrap

import pytest

from svgen.estimate import tune
from svgen.estimate.cost import KernelOutOfVmem
from svgen.spec.errors import SpecError
from svgen.estimate.tune import Candidate

from helpers import run_python
from tune_helpers import fake_measure, write_spec

OOM = (
    "libtpu cannot compile the kernel for v6e at 2048 x 2048 tiles with 1024 x 512 compute "
    "blocks (head_dim 64, bfloat16): it needs 16.33 MiB of VMEM, over the scoped limit of "
    "15.00 MiB it was compiled with (CompileTimeScopedVmemOom); use smaller tiles or compute "
    "blocks"
)


def refusing_measure(refuse, compiled: list):
    """fake_measure, but libtpu 'runs out of VMEM' on the candidates `refuse` picks."""
    measure = fake_measure(compiled)

    def run(plan):
        t = plan.spec.tiling
        if refuse(Candidate(t.block_q, t.block_kv, t.cq, t.ckv, t.align)):
            raise KernelOutOfVmem(OOM, file=plan.spec.source, key="tiling")
        return measure(plan)

    return run


def test_tune_skips_kernels_libtpu_refuses(tmp_path):
    def refuse(c):  # every 1024-row tile, probes and the spec's own 512 x 512 included
        return c.block_q == 1024 or c.label() == "512x512/512x512"

    compiled = []
    result = tune.tune(
        str(write_spec(tmp_path)), confirm=3, measure=refusing_measure(refuse, compiled)
    )
    skipped = [c for c, why in result.dropped if "CompileTimeScopedVmemOom" in why]
    assert skipped and all(refuse(c) for c in skipped)
    # Compiled rows are never refused ones (the rest are estimates, compiled only if they
    # rank high), and the first three, compiled, are not among them.
    assert not any(refuse(r.candidate) for r in result.rows if r.exact)
    assert all(r.exact for r in result.rows[:3]) and result.choice.exact
    assert "over the VMEM budget" in "\n".join(tune.summary_lines(result))


def test_tune_refuses_when_libtpu_refuses_every_kernel(tmp_path):
    with pytest.raises(SpecError) as err:
        tune.tune(str(write_spec(tmp_path)), measure=refusing_measure(lambda c: True, []))
    assert "no candidate tiling compiled" in err.value.message and err.value.key == "tiling"
    assert "CompileTimeScopedVmemOom" in err.value.message


# `svgen cost` with the kernel compiled at a 1 MiB scoped limit, whatever the module asks for.
COST_AT_ONE_MIB = textwrap.dedent(
    """
    import sys
    from svgen import cli
    from svgen.runtime import forward
    forward._vmem_limit = lambda *args, **kwargs: 1 << 20
    sys.exit(cli.main(["cost", sys.argv[1], "--no-cache"]))
    """
)


def test_cost_reports_a_vmem_refusal_in_one_line(tmp_path):
    from tune_helpers import SPEC

    spec = tmp_path / "small_band.yaml"
    spec.write_text(SPEC)
    result = run_python("-c", COST_AT_ONE_MIB, str(spec), timeout=600)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("svgen: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    (line,) = errors
    assert line.startswith(f"svgen: error: {spec}")
    assert "tiling: libtpu cannot compile the kernel for v6e at 512 x 512 tiles" in line
    assert "MiB of VMEM, over the scoped limit of 1.00 MiB" in line
    assert "CompileTimeScopedVmemOom" in line and "custom-call" not in line
