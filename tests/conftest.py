"""pytest's hooks for the whole suite: libtpu's environment, prepared before any test starts a
JAX backend, and the fixtures. The helpers test modules share are plain modules beside this
one: helpers.py (NumPy and svgen only), kernel_helpers.py (JAX and Pallas), and the
*_helpers.py of a few concerns. Nothing here imports JAX (tests/test_no_jax.py checks), so
`pytest tests/test_spec.py` loads none of it."""

from __future__ import annotations

import itertools

import pytest

from helpers import compile_spec_text
from svgen.runtime import libtpu_env

# Before any test starts JAX's backends (importing JAX does not): the AOT tests, and the
# subprocesses tests start (they inherit the environment), share libtpu with other processes
# on the machine and print none of its "no TPU here" warnings. See svgen/runtime/libtpu_env.py.
libtpu_env.prepare()


@pytest.fixture
def compile_text(tmp_path):
    """compile_text(spec_text, **analyze_options) -> (plan, imported module), each call in a
    directory of its own under the test's tmp_path."""
    counter = itertools.count()

    def run(text: str, **analyze_options):
        return compile_spec_text(text, tmp_path / f"gen{next(counter)}", **analyze_options)

    return run


@pytest.fixture(scope="session")
def shared_compile(tmp_path_factory):
    """shared_compile(spec_text, **analyze_options) -> (plan, imported module), compiled once a
    test process (each xdist worker) per text and options, and the same module for every test
    that asks: with kernel_helpers.jitted, a kernel of one module, shapes and call arguments is
    traced and compiled once, however many tests run it. Only for tests that leave the module
    as it is (a module changed by one test would be another test's too)."""
    folder = tmp_path_factory.mktemp("shared")
    modules: dict[str, tuple] = {}

    def run(text: str, **analyze_options):
        key = repr((text, sorted(analyze_options.items())))
        if key not in modules:
            modules[key] = compile_spec_text(text, folder / f"gen{len(modules)}", **analyze_options)
        return modules[key]

    return run
