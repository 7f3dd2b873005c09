"""A fingerprint of what `svgen bench` times: the kernels, their tables and the XLA ops around
them, for one spec at one tiling, computed on any host (no TPU, no libtpu compile).

`svgen bench` times `chip_bench.timed_calls(module, assignment)`: the module compiled for the
chip, called with a fixed head assignment (`splash_mask.head_patterns`) on q, k, v already
in kernel order, forward and `jax.grad` through it. This module traces exactly those
functions and digests three things per direction:

* `kernels`: each Pallas kernel of the trace, its name and the sha256 of its kernel jaxpr
  with its parameters (grid, block specs and their index maps, compiler parameters), source
  locations removed: what Mosaic compiles;
* `constants`: the constants of the program lowered for a TPU, in order: the scalar-prefetch
  tables and every other array the call bakes in (a table edit changes the time and nothing
  else);
* `program`: that whole lowered program (StableHLO, no debug locations) with each kernel's
  serialized Mosaic body left out (it embeds file paths and line numbers; `kernels` stands
  for it): the ops around the kernels, how their operands are made and how the custom calls
  are configured.

Two trees whose fingerprints agree time the same thing on the chip. `svgen bench` records the
fingerprint of what it timed in its JSON (chip_bench.fingerprint_module: this module digests
the calls chip_bench builds, and imports nothing of it); bench/results/fingerprints.json
holds the references of the code at HEAD (`svgen fingerprint --write` rewrites them,
`--check` compares), which `svgen report` reads to tell a result of today's kernels from an
older one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import re

#: Where the references live, and the specs they cover (relative to the checkout).
REFERENCES = pathlib.Path("bench/results/fingerprints.json")
REFERENCE_SPECS = (
    "specs/*.yaml",
    "bench/specs/untuned/paro_like_band_blocks.yaml",
    "bench/specs/untuned/jenga_like_block_causal.yaml",
    "bench/specs/untuned/sparse_vdit_like.yaml",
    "examples/first_kernel.yaml",
    "examples/dit_small.yaml",
)
REFERENCE_TARGET = "v5e"
WRITE_COMMAND = "svgen fingerprint --write"

# A kernel's source location as Pallas names it ("kernel at /path/forward.py:147"), and the
# file:line references jaxpr printing may add: they move with any edit.
_LOCATION = re.compile(r"\s+at\s+[^\s,)]+:\d+|[\w./-]+\.py:\d+(?::\d+)?")
# A Mosaic kernel's serialized body inside a tpu_custom_call's backend_config (the quotes
# are printed as \22 in StableHLO text).
_MOSAIC_BODY = re.compile(r'(\\22body\\22: \\22)[^\\"]*(\\22)')
_CONSTANT = re.compile(r"stablehlo\.constant .*")
# Fields of a grid mapping that name where an operand came from or hold callables.
_NOT_THE_KERNEL = {"origin", "debug", "get_grid_indices", "local_grid_env"}


def digest(text: str) -> str:
    """sha256 (16 hex digits) of `text` with its source locations removed."""
    return hashlib.sha256(_LOCATION.sub("", text).encode()).hexdigest()[:16]


def pallas_kernels(closed_jaxpr) -> list[tuple[str, str]]:
    """(kernel name, digest) of every pallas_call in a traced program, in trace order."""
    found: list[tuple[str, str]] = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                info = eqn.params.get("name_and_src_info")
                name = getattr(info, "name", None) or str(eqn.params.get("name", "pallas_call"))
                text = "\n".join(
                    f"{key}={_describe(eqn.params[key])}"
                    for key in sorted(eqn.params)
                    if key not in ("name_and_src_info", "debug", "cost_estimate")
                )
                found.append((name, digest(text)))
                continue
            for sub in _subjaxprs(eqn.params):
                visit(sub)

    visit(closed_jaxpr.jaxpr)
    return found


def _describe(value) -> str:
    """A grid mapping's every field (its block mappings' index-map jaxprs included, which its
    repr leaves out), recursively; anything else as printed."""
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = (
            f"{f.name}={_describe(getattr(value, f.name))}"
            for f in dataclasses.fields(value)
            if f.name not in _NOT_THE_KERNEL
        )
        return f"{type(value).__name__}(" + ", ".join(fields) + ")"
    return str(value)


def _subjaxprs(params):
    from jax.extend import core

    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, core.Jaxpr):
                yield v


def lowered_program(traced) -> str:
    """The StableHLO text of a traced call (`jitted.trace(*args)`), lowered for a TPU on this
    host, without debug locations."""
    return traced.lower(lowering_platforms=("tpu",)).as_text(debug_info=False)


def program_digests(hlo: str) -> dict[str, str]:
    """{'constants', 'program'} of a lowered program's text (see the module docstring)."""
    # The text holds no source locations (lowered without debug info): hashed as it is
    # (the location pattern would scan its long base64 bodies quadratically).
    constants = "\n".join(m.group(0) for m in _CONSTANT.finditer(hlo))
    program = _MOSAIC_BODY.sub(r"\1(the kernel)\2", hlo)
    return {"constants": _sha(constants), "program": _sha(program)}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def of_calls(calls: dict, args) -> dict[str, dict]:
    """Per direction of `calls` ({direction: jitted function}, chip_bench.timed_calls), its
    kernels, constants and program digests on `args` (shape-dtype structs or arrays)."""
    out = {}
    for direction, function in calls.items():
        traced = function.trace(*args)  # traced once: its jaxpr and its lowering
        out[direction] = {
            "kernels": [list(k) for k in pallas_kernels(traced.jaxpr)],
            **program_digests(lowered_program(traced)),
        }
    return out


def reference_paths(root: pathlib.Path) -> list[str]:
    """The specs the references cover, relative to `root`, sorted within each glob."""
    paths: list[str] = []
    for pattern in REFERENCE_SPECS:
        for path in sorted(root.glob(pattern)):
            relative = path.relative_to(root).as_posix()
            if relative not in paths:
                paths.append(relative)
    return paths


def reference_file(specs: dict) -> dict:
    """What REFERENCES holds: the fingerprints and what they depend on besides svgen."""
    import jax

    return {
        "target": REFERENCE_TARGET,
        "jax": jax.__version__,
        "command": WRITE_COMMAND,
        "specs": specs,
    }


def differences(before: dict, after: dict) -> list[str]:
    """A line per spec and direction whose fingerprint part differs (`after`'s specs only)."""
    lines = []
    for source in sorted(after):
        old, new = before.get(source), after[source]
        if old is None:
            lines.append(f"{source}: no reference")
            continue
        for key in ("tiling", "head_patterns"):
            if old.get(key) != new.get(key):
                lines.append(f"{source}: {key} {old.get(key)} -> {new.get(key)}")
        for direction in ("forward", "backward"):
            a, b = old.get(direction, {}), new.get(direction, {})
            for part in sorted(set(a) | set(b)):
                if a.get(part) != b.get(part):
                    lines.append(f"{source} {direction} {part}: {a.get(part)} -> {b.get(part)}")
    return lines
