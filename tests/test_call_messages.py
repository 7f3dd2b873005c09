"""What a user of a generated module is told: attention's docstring, the errors of a wrong
dtype, a wrong layout of q, k, v and a wrong sm_scale (TPU and GPU wrappers), and no libtpu
warnings in a script that imports it."""

from __future__ import annotations

import importlib.util
import inspect
import os
import pydoc
import subprocess

import jax.numpy as jnp
import numpy as np
import pytest

from svgen.runtime import libtpu_env
from svgen import spec as spec_reader
from svgen.runtime import calls, gpu

from helpers import REPO, import_file, run_python, unprepared_environment

SPEC = """svgen: 1
name: call_messages
geometry: {frames: 2, height: 8, width: 16, text_tokens: 0, text_position: last}
attention: {heads: 2, head_dim: 128, dtype: DTYPE}
mask: {spatial_window: {frames: 0}}
tiling: {block_q: 128, block_kv: 128}
"""


@pytest.fixture(scope="module")
def modules(tmp_path_factory):
    """A bfloat16 and a float32 module (256 tokens, head_dim 128, 2 heads)."""
    from helpers import compile_spec_text

    out = {}
    for dtype in ("bfloat16", "float32"):
        path = tmp_path_factory.mktemp(dtype)
        out[dtype] = compile_spec_text(SPEC.replace("DTYPE", dtype), path)[1]
    return out


def _zeros(shape, dtype):
    return (jnp.zeros(shape, dtype),) * 3


def test_spec_and_runtime_agree_on_the_dtypes_a_spec_names():
    # The advice of a dtype mismatch names what the spec reader accepts.
    assert calls.SPEC_DTYPES == tuple(sorted(spec_reader.DTYPES))
    assert set(calls.SPEC_DTYPES) <= set(gpu.DTYPES)


def test_shipped_module_attention_has_a_docstring():
    module = import_file(REPO / "generated" / "wan21_720p_mixed.py")
    doc = inspect.getdoc(module.attention)
    assert doc.splitlines()[0] == (
        'attention(q, k, v, *, head_pattern=None, interpret=False, sm_scale=None, token_order="user")'
    )
    for argument in ("q, k, v:", "head_pattern:", "interpret:", "sm_scale:", "token_order:"):
        assert f"\n{argument}" in doc, argument
    n, d = module.SEQ_LEN, module.HEAD_DIM
    assert f"[heads, {n}, {d}] or [batch, heads, {n}, {d}] arrays of dtype bfloat16" in doc
    assert "0: spatial, 1: temporal" in doc
    assert "required: this kernel's patterns are chosen at run time" in doc
    assert "jnp.swapaxes(x, -3, -2)" in doc
    assert "Differentiable" in doc
    shown = pydoc.render_doc(module.attention, renderer=pydoc.plaintext)
    assert "head_pattern: int [heads]" in shown and "sm_scale: the factor" in shown


def test_static_assignment_and_gpu_docstrings(modules):
    doc = inspect.getdoc(modules["float32"].attention)
    assert "None: the spec's assignment, HEAD_PATTERN = (0, 0)" in doc
    gpu_doc = inspect.getdoc(gpu.gpu_attention_of(modules["float32"]))
    assert gpu_doc.splitlines()[0] == doc.splitlines()[0]
    assert "Block-sparse attention on GPU" in gpu_doc and "Forward only" in gpu_doc
    any_doc = inspect.getdoc(gpu.gpu_attention_of(modules["float32"], dtype=None))
    assert "arrays of float32 or bfloat16 or float16" in any_doc


@pytest.mark.parametrize(
    "given, advice",
    [
        ("float32", "or compile a spec with attention.dtype: float32"),
        ("float16", "; a spec's attention.dtype is one of bfloat16, float32"),
    ],
)
def test_dtype_error_advises_what_the_spec_reader_accepts(modules, given, advice):
    with pytest.raises(TypeError) as info:
        modules["bfloat16"].attention(*_zeros((2, 256, 128), given), interpret=True)
    message = str(info.value)
    assert message.startswith("this kernel was compiled for bfloat16 (the spec's attention.dtype)")
    assert "cast them (x.astype(jnp.bfloat16))" in message and message.endswith(advice)
    assert "spec with attention.dtype: float16" not in message  # the spec reader refuses it


def test_gpu_dtype_error_names_the_float16_kernel(modules):
    attention = gpu.gpu_attention_of(modules["bfloat16"])
    with pytest.raises(TypeError) as info:
        attention(*_zeros((2, 256, 128), "float16"), interpret=True)
    assert str(info.value).endswith(
        'or build one for it: svgen.runtime.gpu.gpu_attention_of(module, dtype="float16")'
    )


@pytest.mark.parametrize(
    "shape, swapped",
    [
        ((256, 2, 128), True),  # [seq, heads, d]
        ((1, 256, 2, 128), True),  # PyTorch's [batch, seq, heads, d]
        ((2, 255, 128), False),
        ((2, 256, 64), False),
        ((256, 128), False),
    ],
)
def test_shape_error_says_heads_come_before_tokens(modules, shape, swapped):
    with pytest.raises(ValueError) as info:
        modules["float32"].attention(*_zeros(shape, "float32"), interpret=True)
    message = str(info.value)
    assert message.startswith(
        "expected [heads, 256, 128] or [batch, heads, 256, 128] ([..., heads, seq, head_dim]"
    )
    assert f"got {shape}" in message
    assert ("jnp.swapaxes(q, -3, -2)" in message) == swapped


@pytest.mark.parametrize(
    "sm_scale, error, words",
    [
        ("0.1", TypeError, "sm_scale must be a real number"),
        (True, TypeError, "sm_scale must be a real number"),
        (np.bool_(True), TypeError, "sm_scale must be a real number"),
        (jnp.asarray([0.1]), TypeError, "sm_scale must be a real number"),
        (float("nan"), ValueError, "sm_scale must be finite, got nan"),
        (float("inf"), ValueError, "sm_scale must be finite, got inf"),
        (np.float32("-inf"), ValueError, "sm_scale must be finite, got -inf"),
    ],
)
@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_meaningless_sm_scale_is_refused(modules, backend, sm_scale, error, words):
    module = modules["float32"]
    attention = module.attention if backend == "tpu" else gpu.gpu_attention_of(module)
    with pytest.raises(error) as info:
        attention(*_zeros((2, 256, 128), "float32"), interpret=True, sm_scale=sm_scale)
    assert words in str(info.value)


@pytest.mark.parametrize("sm_scale", [None, 0.125, 1, np.float32(0.125), jnp.asarray(0.125)])
def test_real_sm_scales_are_taken(sm_scale):
    expected = 1 / np.sqrt(128) if sm_scale is None else 0.125 if sm_scale != 1 else 1.0
    assert calls.checked_sm_scale(sm_scale, 128) == pytest.approx(expected)


IMPORT_AND_START_JAX = """
import importlib.util, sys
if sys.argv[1] != "-":
    spec = importlib.util.spec_from_file_location("shipped", sys.argv[1])
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
import jax, jax.numpy as jnp
print(jax.devices()[0].platform, int(jnp.arange(4).sum()))
"""
LIBTPU_WARNINGS = ("accelerator type", "worker hostname", "host bounds", "E0000")


def _start_jax(module_path: str) -> subprocess.CompletedProcess:
    # a user's script: svgen's variables not set
    return run_python(
        "-c", IMPORT_AND_START_JAX, module_path, env=unprepared_environment(), timeout=300
    )


# A user's CPU script that imports svgen first but JAX starts before the (small) generated
# module is imported: what keeps libtpu quiet is svgen's own import. argv: the module's path,
# and "svgen" or "-" (the control: no svgen import before JAX starts).
SVGEN_THEN_JAX_THEN_MODULE = """
import importlib.util, sys
if sys.argv[2] == "svgen":
    import svgen  # noqa: F401
import jax, jax.numpy as jnp
q = jnp.ones((1, 2, 256, 128), jnp.float32)  # JAX's backends (and libtpu) start here
spec = importlib.util.spec_from_file_location("small", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
out = module.attention(q, q, q, interpret=True)
print(jax.devices()[0].platform, out.shape, bool(jnp.all(jnp.isfinite(out))))
"""


def _run_script(module_path, first: str) -> subprocess.CompletedProcess:
    script = SVGEN_THEN_JAX_THEN_MODULE
    # a user's script: svgen's variables not set
    return run_python(
        "-c", script, str(module_path), first, env=unprepared_environment(), timeout=300
    )


def test_importing_svgen_quiets_libtpu_for_a_script_that_runs_jax_first(tmp_path):
    """Importing svgen (any of it) sets libtpu's no-chip variables, so a script that runs JAX
    before it imports a generated module (whose own import is then too late) prints none of
    libtpu's warnings, and runs the module on the CPU."""
    from helpers import compile_spec_text

    _, module = compile_spec_text(SPEC.replace("DTYPE", "float32"), tmp_path)
    quiet = _run_script(module.__file__, "svgen")
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stdout.split() == ["cpu", "(1,", "2,", "256,", "128)", "True"]
    assert not [w for w in LIBTPU_WARNINGS if w in quiet.stderr], quiet.stderr
    if importlib.util.find_spec("libtpu") is not None and not libtpu_env._tpu_chips_attached():
        # The control: without the svgen import the same script prints them (the module's
        # import comes after JAX started), so the test above is not vacuous.
        noisy = _run_script(module.__file__, "-")
        assert noisy.returncode == 0, noisy.stderr[-3000:]
        assert "worker hostname" in noisy.stderr


def test_importing_svgen_on_a_tpu_host_sets_nothing(monkeypatch):
    """On a TPU VM svgen's import changes no variable: libtpu learns its slice itself, and
    its lock keeps two processes off the same chips (the package's import runs quiet())."""
    import svgen

    names = (*libtpu_env.SHARING, *libtpu_env.NO_CHIP)
    # A copy of the environment without them, put back after the test whatever it sets.
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in names})
    monkeypatch.setattr(libtpu_env, "_tpu_chips_attached", lambda: True)
    importlib.reload(svgen)
    assert not [n for n in names if n in os.environ]
    monkeypatch.setattr(libtpu_env, "_tpu_chips_attached", lambda: False)
    importlib.reload(svgen)  # the control: without chips, the import does set them
    assert [n for n in libtpu_env.NO_CHIP if n in os.environ] == list(libtpu_env.NO_CHIP)


def test_generated_module_prepares_libtpu_before_jax_starts():
    """A script that imports a generated module and then uses JAX prints none of libtpu's
    no-TPU warnings, without calling svgen.runtime.libtpu_env.prepare() itself."""
    quiet = _start_jax(str(REPO / "generated" / "wan21_720p_spatial.py"))
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stdout.split() == ["cpu", "6"]
    assert not [w for w in LIBTPU_WARNINGS if w in quiet.stderr], quiet.stderr
    if importlib.util.find_spec("libtpu") is not None and not libtpu_env._tpu_chips_attached():
        # The control, where libtpu is installed on a host without chips: without the
        # module, the same script prints them, so the test above is not vacuous.
        noisy = _start_jax("-")
        assert noisy.returncode == 0, noisy.stderr[-3000:]
        assert "worker hostname" in noisy.stderr
