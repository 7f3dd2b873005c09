"""Splash Attention at its best, given svgen's mask: the peer `svgen bench` times svgen against.

A speedup is only as honest as its peer. This module runs the mask the way a Splash user who
knew it would, and searches what such a user would tune:

* **One Splash call per pattern.** Heads are grouped by their pattern and each group is one
  Splash call whose heads share one mask object, so Splash processes the mask once and its grid
  holds that pattern's blocks only (one mask per head would make every head walk the union's
  grid). The grouping is done before the timed call, on both sides: svgen reads each head's
  pattern from its tables and moves nothing, and Splash gets its inputs already grouped.
* **The exact mask**, in the pattern's kernel order (the order svgen's kernel runs it in, and
  the order a user keeping activations that way would give Splash: temporal-major heads are
  compared in temporal-major order), over the padded length, padding keys never kept.
* **Nothing but the kernels in the timed call.** q is scaled by 1 / sqrt(d) and q, k, v are
  padded to Splash's blocks once, before timing; outputs stay padded (svgen's call has no such
  passes either). The backward is jax.grad of the real rows' sum, as svgen's is of its output's.
* **The faster mask form**: given as data (`data`: partial blocks loaded from HBM) or computed
  in the kernel (`computed`: Splash's computable mask calling the spec's own mask code on
  positions). The computed form needs a mask that lowers inside Splash's kernel; a mask that
  reads tables (data block masks, aligned rounding) does not, and is recorded as failed there.
* **A small search of block sizes**: the forward over FORWARD_BLOCKS, the backward over
  BACKWARD_BLOCKS with the fused and the two-kernel backward. The winner is cached per chip,
  versions, spec and direction (a later run re-times the winner only, and searches again if it
  fails); every configuration tried is recorded in the result.

Nothing here decides anything from a clock of its own: timing goes through the `time_config`
callable the caller passes (svgen.chip.chip_bench), so the search is tested without a chip.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
from typing import Callable

import numpy as np

from svgen.core.safe_io import read_json_cache, write_json_cache
from svgen.chip import splash_mask

#: Splash's forward blocks searched given a mask (block_q, block_kv, block_kv_compute): the
#: first is where the search of the mask form starts (the best measured for the blog mask on a
#: v5e); the others are searched with the form that won there.
FORWARD_BLOCKS = ((1024, 1024, 512), (512, 512, 512), (1024, 1024, 1024), (2048, 1024, 1024))
#: The backward's dq/dk/dv blocks searched, after the forward winner's own blocks.
BACKWARD_BLOCKS = ((1024, 1024, 512), (512, 512, 512), (1024, 2048, 512))
MASK_FORMS = ("computed", "data")


@dataclasses.dataclass(frozen=True)
class Config:
    """One way to run Splash on a mask: its form, its forward blocks and, for a backward, the
    backward's blocks and whether its fused dq/dk/dv kernel runs."""

    mask: str  # "data" or "computed"
    blocks: tuple[int, int, int]
    backward_blocks: tuple[int, int, int] | None = None
    fused: bool | None = None

    def label(self) -> str:
        text = f"{self.mask} {'/'.join(map(str, self.blocks))}"
        if self.backward_blocks is not None:
            kind = "fused" if self.fused else "two-kernel"
            text += f", {kind} bwd {'/'.join(map(str, self.backward_blocks))}"
        return text

    def to_json(self) -> dict:
        return {
            "mask": self.mask,
            "blocks": list(self.blocks),
            "backward_blocks": None if self.backward_blocks is None else list(self.backward_blocks),
            "fused": self.fused,
        }

    @classmethod
    def from_json(cls, obj) -> "Config | None":
        """The config a cache entry holds, or None where it is not one (a cache is input)."""
        try:
            blocks = tuple(int(b) for b in obj["blocks"])
            back = obj.get("backward_blocks")
            back = None if back is None else tuple(int(b) for b in back)
            fused = obj.get("fused")
            if obj["mask"] not in MASK_FORMS or len(blocks) != 3 or (back and len(back) != 3):
                return None
            if fused not in (None, True, False):
                return None
            return cls(obj["mask"], blocks, back, fused)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def head_groups(assignment) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """((pattern, its heads), ...) in pattern order: one Splash call each."""
    patterns = sorted(set(int(p) for p in assignment))
    return tuple((p, tuple(h for h, q in enumerate(assignment) if int(q) == p)) for p in patterns)


# ----------------------------------------------------------------------------- the masks
class ComputedKeep(splash_mask.mask_lib._ComputableMask):
    """Splash's computable mask over a pattern's keep function: in the kernel Splash calls
    `mask_function(q_pos, k_pos)` on each partial block (no mask is loaded from HBM); while it
    classifies blocks on the host, it reads the same mask's bits (`bits`, computed once on the
    device: evaluating the mask block by block on the host would take minutes at 75K tokens).
    Equal only to itself, so heads sharing the object share Splash's processing."""

    def __init__(self, name: str, keep, seq_len: int, bits: np.ndarray):
        # keep(q_pos, k_pos) on any int32 positions of the padded length (a computed mask of
        # coordinates; one that reads tables does not lower inside Splash's kernel).
        padded = bits.shape[0]
        self.name = name
        self._bits = splash_mask.PackedKeep(name, bits)

        def mask_function(q_pos, k_pos):
            import jax.numpy as jnp

            # Padding keys are never kept; padding queries are dropped, whatever they keep.
            kept = jnp.broadcast_to(keep(q_pos, k_pos), k_pos.shape)
            return kept if padded == seq_len else kept & (k_pos < seq_len)

        super().__init__((padded, padded), mask_function)

    def __getitem__(self, idx) -> np.ndarray:
        return self._bits[idx]

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"ComputedKeep({self.name!r}, {self.shape[0]} x {self.shape[1]})"


class Peer:
    """Splash's side of one spec: its head groups, masks and prepared inputs, built once per
    padded length (one sequence-squared set of bits alive at a time)."""

    def __init__(self, module, plan, assignment, qkv, interpret: bool, full: bool = False):
        # full: dense Splash (every head one group, every pair kept)
        self.module, self.plan, self.interpret, self.full = module, plan, interpret, full
        self.seq = int(module.SEQ_LEN)
        self.heads = int(module.HEADS)
        self.scale = 1.0 / float(np.sqrt(int(module.HEAD_DIM)))
        self.groups = head_groups(assignment)
        self.qkv = qkv
        self._padded = None
        self._bits: dict[int, np.ndarray] = {}
        self._inputs: tuple = ()
        self.mask_build_s = 0.0

    def describe(self) -> list:
        """[[pattern name, heads], ...]: the calls Splash makes."""
        names = self.module.attention.patterns
        return [[names[p].name, len(heads)] for p, heads in self.groups]

    def prepare(self, padded: int) -> None:
        """Bits and inputs for `padded` tokens (kept while the padded length stays)."""
        if padded != self._padded:
            self._bits, self._inputs = {}, ()
            start = time.perf_counter()
            for p, _ in () if self.full else self.groups:
                plan_pattern = self.plan.patterns[p] if self.plan is not None else None
                self._bits[p] = splash_mask.packed_keep_bits(
                    self.module.attention.patterns[p], self.seq, padded, plan_pattern=plan_pattern
                )
            self.mask_build_s = time.perf_counter() - start
            self._padded = padded
        if not self._inputs:
            self._inputs = self._prepared_inputs(padded)

    def _prepared_inputs(self, padded: int) -> tuple:
        """Each group's q (scaled), k, v, padded: made once, outside any timed call."""
        import jax.numpy as jnp

        q, k, v = self.qkv
        inputs = []
        for _, heads in self.groups:
            idx = np.asarray(heads)
            scaled = jnp.asarray(q[idx]) * jnp.asarray(self.scale, q.dtype)
            inputs += [pad_tokens(jnp.asarray(x), padded) for x in (scaled, k[idx], v[idx])]
        return tuple(inputs)

    def release(self) -> None:
        """Free the prepared inputs on the device (the bits stay on the host): Splash's fused
        backward keeps a dq per kv block, and at 75K tokens needs nearly all of a v5e's HBM."""
        self._inputs = ()

    def mask(self, p: int, form: str):
        """Pattern p's mask object in `form` (after `prepare`)."""
        if self.full:
            return splash_mask.mask_lib.FullMask((self._padded, self._padded))
        pattern = self.module.attention.patterns[p]
        if form == "data":
            return splash_mask.PackedKeep(pattern.name, self._bits[p])
        plan_pattern = self.plan.patterns[p] if self.plan is not None else None
        keep = splash_mask.kernel_keep(plan_pattern, pattern)
        return ComputedKeep(pattern.name, keep, self.seq, self._bits[p])

    def call(self, config: Config, backward: bool):
        """(jitted fn, its args): every group's Splash call, on prepared inputs."""
        import jax
        import jax.numpy as jnp

        padded = splash_mask.padded_length(
            self.seq, *config.blocks, *(config.backward_blocks or ())
        )
        self.prepare(padded)
        kernels = []
        for p, heads in self.groups:
            shared = self.mask(p, config.mask)
            multi = splash_mask.mask_lib.MultiHeadMask([shared] * len(heads))
            kernels.append(
                splash_mask.make_splash(
                    multi,
                    config.blocks,
                    backward,
                    self.interpret,
                    fused=bool(config.fused),
                    backward_blocks=config.backward_blocks,
                )
            )

        def forward(*inputs):
            return tuple(kernel(*inputs[3 * g : 3 * g + 3]) for g, kernel in enumerate(kernels))

        if not backward:
            return jax.jit(forward), self._inputs
        real_rows = (jnp.arange(padded) < self.seq).astype(jnp.float32)[:, None]

        def loss(*inputs):
            return sum(jnp.sum(o.astype(jnp.float32) * real_rows) for o in forward(*inputs))

        return jax.jit(jax.grad(loss, argnums=tuple(range(len(self._inputs))))), self._inputs

    def assemble(self, outs):
        """[heads, seq, d]: the groups' padded outputs back in head order (outside timing)."""
        import jax.numpy as jnp

        full = [None] * self.heads
        for (_, heads), out in zip(self.groups, outs):
            for i, h in enumerate(heads):
                full[h] = out[i, : self.seq]
        return jnp.stack(full)


def pad_tokens(x, padded: int):
    import jax.numpy as jnp

    extra = padded - x.shape[-2]
    return x if extra == 0 else jnp.pad(x, ((0, 0), (0, extra), (0, 0)))


# ----------------------------------------------------------------------------- the search
def forward_candidates(blocks=None):
    """The forward configs in search order: both forms at the first blocks, then the other
    blocks (`search` keeps only the form that won at the first)."""
    blocks = FORWARD_BLOCKS if blocks is None else blocks
    first = [Config(form, blocks[0]) for form in MASK_FORMS]
    return first, list(blocks[1:])


def backward_candidates(forward: Config, blocks=None) -> list[Config]:
    """The backward configs: the forward's own blocks first, then BACKWARD_BLOCKS, each with
    the fused and the two-kernel backward."""
    blocks = BACKWARD_BLOCKS if blocks is None else blocks
    order = [forward.blocks] + [b for b in blocks if b != forward.blocks]
    return [
        dataclasses.replace(forward, backward_blocks=b, fused=fused)
        for b in order
        for fused in (True, False)
    ]


def search(time_config: Callable, direction: str, forward_winner: Config | None, progress):
    """(winner Config or None, tried list): time_config(config) -> Timing (raises where the
    config does not compile or run)."""
    tried = []

    def attempt(config: Config):
        progress(f"Splash {direction}: {config.label()}")
        try:
            timing = time_config(config)
        except Exception as exc:  # a config that does not compile or run is infeasible
            tried.append(
                {"config": config.to_json(), "label": config.label(), "error": _short(exc)}
            )
            return None
        tried.append({"config": config.to_json(), "label": config.label(), **timing.to_json()})
        return timing

    timed: list[tuple[float, Config]] = []

    def run(config: Config) -> None:
        timing = attempt(config)
        if timing is not None:
            timed.append((timing.median_s, config))

    if direction == "forward":
        first, other_blocks = forward_candidates()
        for config in first:
            run(config)
        if timed:
            form = min(timed, key=lambda t: t[0])[1].mask
            for blocks in other_blocks:
                run(Config(form, blocks))
    else:
        for config in backward_candidates(forward_winner):
            run(config)
    if not timed:
        return None, tried
    return min(timed, key=lambda t: t[0])[1], tried


@dataclasses.dataclass
class PeerCache:
    """The winning config per key, on disk (svgen.core.safe_io: a file that is not the JSON
    object this writes is a miss, said in one line, and rewritten)."""

    cache_dir: pathlib.Path | None

    def _file(self) -> pathlib.Path | None:
        return None if self.cache_dir is None else self.cache_dir / "splash_peer.json"

    def load(self) -> dict:
        path = self._file()
        data = None if path is None else read_json_cache(path, _as_object)
        return data or {}

    def get(self, key: str) -> Config | None:
        entry = self.load().get(key)
        return Config.from_json(entry) if isinstance(entry, dict) else None

    def put(self, key: str, config: Config) -> None:
        path = self._file()
        if path is None:
            return
        data = self.load()
        data[key] = config.to_json()
        write_json_cache(path, data, indent=1)  # a cache that cannot be written: a search next run


def _as_object(value) -> dict:
    if not isinstance(value, dict):
        raise TypeError("not a JSON object")
    return value


def cache_key(target: str, env: dict, spec, assignment, direction: str) -> str:
    """What a winner depends on: the chip and versions, the mask (the spec's digest, and the
    tiling where the mask is rounded to it), the head grouping, the direction."""
    tiling = None
    if spec.tiling.align != "exact":
        t = spec.tiling
        tiling = [t.block_q, t.block_kv, t.cq, t.ckv, t.align]
    text = json.dumps(
        [
            target,
            env,
            spec.digest,
            tiling,
            [int(p) for p in assignment],
            direction,
            FORWARD_BLOCKS,
            BACKWARD_BLOCKS,
        ],
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def best(
    time_config: Callable,
    direction: str,
    key: str,
    cache: PeerCache,
    forward_winner: Config | None,
    progress,
    only: Config | None = None,
) -> dict:
    """{'config', 'timing', 'tried', 'cached'}: the cached winner re-timed, or (none cached, or
    it fails now) the search's winner, cached for the next run. time_config(config) ->
    (Timing, output). only: time that config alone (no search, no cache)."""
    timings: dict = {}
    fastest: list = []  # [median, config, output]: only the fastest output is kept alive

    def timed(config: Config):
        timing, out = time_config(config)
        timings[config] = timing
        if not fastest or timing.median_s < fastest[0]:
            fastest[:] = [timing.median_s, config, out]
        return timing

    def result(config: Config | None, tried: list, cached: bool) -> dict:
        out = fastest[2] if config is not None and fastest[1] == config else None
        timing = timings.get(config)
        return {"config": config, "timing": timing, "output": out, "tried": tried, "cached": cached}

    if only is not None:
        winner, tried = _retime(timed, only, direction, progress, cached=False)
        return result(winner, tried, False)
    cached = cache.get(key)
    tried = []
    if cached is not None and (direction == "forward" or cached.blocks == forward_winner.blocks):
        winner, tried = _retime(timed, cached, direction, progress)
        if winner is not None:
            return result(winner, tried, True)
        fastest.clear()
    winner, searched = search(timed, direction, forward_winner, progress)
    if winner is not None:
        cache.put(key, winner)
    return result(winner, tried + searched, False)


def _retime(timed, config: Config, direction: str, progress, cached: bool = True):
    progress(f"Splash {direction}: {config.label()}{' (the cached winner)' * cached}")
    entry = {"config": config.to_json(), "label": config.label(), "cached": cached}
    try:
        timing = timed(config)
    except Exception as exc:
        return None, [{**entry, "error": _short(exc)}]
    return config, [{**entry, **timing.to_json()}]


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    lines = [line for line in text if line.strip()]
    memory = [line for line in lines if "vmem" in line.lower() or "smem" in line.lower()]
    return (memory or lines or ["(no message)"])[0][:300]
