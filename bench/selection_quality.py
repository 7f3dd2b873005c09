"""How well activation-driven block selection keeps attention, next to static masks.

    .venv/bin/python bench/selection_quality.py [--seed S] [--frames F --height H --width W]
        [--heads N] [--block B] [--gain G] [--sampled-rows S] [--quick]

On synthetic video-like attention of known structure (below; NOT a real model's
activations) this compares, at matched densities, static masks built from coordinates with
the top-k and top-p selection of svgen.runtime.select: the pooled block scores of
`block_scores` (or, with --sampled-rows S, the sampled rows' attention mass of
`sampled_block_scores`, a spec's `select.sampled_rows: S`) and the choice of
`select_blocks`, the functions a generated module calls.
Per mask:
  * density: kept pairs / all pairs (the mean over heads);
  * recall: the mean over query rows (and heads) of the dense probabilities on kept pairs;
  * output error: || O_mask - O_dense || / || O_dense || (Frobenius, all heads at once),
    O_mask the softmax restricted to the mask (a row with no kept key outputs 0), float64;
  * for the selection policies, the blocks chosen per compute block row (beyond the
    always-kept ones), the mean over heads and block rows.
Then the least top-p (and top-k) density whose output error is at most that of the
spec-like band (`specs/wan21_720p_band.yaml`: a band of density 0.35 plus the first frame),
and its ratio to the band's density (the goal: at most 2/3). Nothing is timed here: kernel
cost is measured apart (bench/kernel_cost.py, bench/select_cost.py).

Generator: one numpy.random.default_rng(seed); the draws in exactly this order.
  * Tokens: F frames x H x W, frame-major: token t = f*H*W + h*W + w, so the kernel order is
    the user order; u = (f/F, h/H, w/W) is a token's normalized position.
  * smooth_field(c channels, cycles (c_f, c_h, c_w)): draws n ~ U(-1, 1) of shape [c, 6, 3],
    scaled per axis by the cycles, then phases ~ U(0, 2 pi) [c, 6], then amplitudes
    ~ N(0, 1) [c, 6]; channel i at u is sqrt(2/6) sum_m amp[i,m] cos(2 pi n[i,m] . u +
    phase[i,m]): unit variance, at most c_a cycles over axis a.
  * Heads in order; head i is spatial when i is even, temporal when odd (HEAD_KINDS: the
    cycles of its fields, (3, 2, 2) spatial: content changing from frame to frame, smooth
    across a frame; (0.25, 6, 6) temporal: still over time, detailed across a frame). Per
    head, all fields with the head's cycles:
      content = smooth_field(d);
      q = content + 0.5 smooth_field(d) + 0.3 N(0, 1) [N, d];
      k = content + 0.5 smooth_field(d) + 0.3 N(0, 1) [N, d];
      v = smooth_field(d) + 0.5 N(0, 1) [N, d];
      q, k rotated by a 3-D rotary embedding (`rotary`): head_dim split as Wan2.1 does, the
        frame part first with d - 4 (d // 6) channels, then h and w with 2 (d // 6) each;
        channel pair (2j, 2j+1) of a part of s channels turns by pos * 10000^(-2j/s), pos
        the token's f, h or w;
      heavy hitters: 4 keys drawn without replacement (rng.choice(N, 4)), a direction
        e ~ N(0, I_d) normalized, a gate g = sigmoid(2 smooth_field(1)); k[hitters] += 8 e
        and every query q += 5 g e (many queries align to those few keys, most where g is
        large);
      q and k multiplied by the gain (--gain, default 1: unit-variance fields as they are).
  * d = 64; sm_scale = 1 / sqrt(d); dense reference P = softmax(q k^T sm_scale) in float64.

Masks, each OR'ed with the first-frame anchor (keys of frame 0):
  * window w: |f_q - f_k| <= w for w = 0, 1, 2;
  * band b: |i_q - i_k| <= b, b the width whose density is nearest each window's; and the
    spec-like band, b the width whose band alone is nearest density 0.35 (the spec's
    `band: {density: 0.35}`);
  * top-k / top-p: compute blocks of B x B tokens (default 128); always kept: the anchor OR
    the diagonal compute block; selectable: every block the always-kept mask does not keep
    whole; the amount (every k; p by bisection) whose density is nearest each static mask's.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from svgen.runtime import libtpu_env  # noqa: E402

libtpu_env.prepare()  # before JAX starts its backends: libtpu stays quiet on a CPU host

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from svgen.runtime import select as sel  # noqa: E402
from svgen.core.tables import KernelShape  # noqa: E402

DEFAULTS = dict(frames=8, height=16, width=24, heads=4, block=128)
QUICK = dict(frames=4, height=8, width=16, heads=2, block=64)
HEAD_DIM = 64
HEAD_KINDS = {"spatial": (3.0, 2.0, 2.0), "temporal": (0.25, 6.0, 6.0)}  # cycles (f, h, w)
WAVES = 6  # plane waves per channel of a smooth field
QUERY_NOISE, WHITE_NOISE, VALUE_NOISE = 0.5, 0.3, 0.5
HEAVY_HITTERS, HEAVY_KEY, HEAVY_QUERY = 4, 8.0, 5.0
ROPE_BASE = 10000.0
ANCHOR_FRAMES = 1
WINDOWS = (0, 1, 2)
SPEC_BAND_DENSITY = 0.35  # specs/wan21_720p_band.yaml: band {density: 0.35} + one frame
TARGET_RATIO = 2 / 3


# -- the generator ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Geometry:
    frames: int
    height: int
    width: int

    @property
    def seq_len(self) -> int:
        return self.frames * self.height * self.width

    @property
    def frame_tokens(self) -> int:
        return self.height * self.width

    def positions(self) -> np.ndarray:
        """int [N, 3]: (f, h, w) of each token, frame-major."""
        axes = np.arange(self.frames), np.arange(self.height), np.arange(self.width)
        return np.stack([a.ravel() for a in np.meshgrid(*axes, indexing="ij")], axis=1)


@dataclasses.dataclass(frozen=True)
class Head:
    kind: str
    q: np.ndarray  # float64 [N, d]
    k: np.ndarray
    v: np.ndarray
    hitters: np.ndarray  # int [HEAVY_HITTERS]: the heavy-hitter keys, sorted


def head_kind(index: int) -> str:
    return "spatial" if index % 2 == 0 else "temporal"


def smooth_field(rng, geometry: Geometry, channels: int, cycles) -> np.ndarray:
    """float64 [N, channels] of unit variance: WAVES random plane waves per channel, of at
    most cycles[a] cycles over axis a."""
    extent = np.array([geometry.frames, geometry.height, geometry.width], np.float64)
    u = geometry.positions() / extent
    waves = rng.uniform(-1.0, 1.0, (channels, WAVES, 3)) * np.asarray(cycles, np.float64)
    phase = rng.uniform(0.0, 2 * np.pi, (channels, WAVES))
    amp = rng.standard_normal((channels, WAVES))
    angle = 2 * np.pi * np.einsum("na,cma->ncm", u, waves) + phase
    return np.sqrt(2.0 / WAVES) * np.einsum("ncm,cm->nc", np.cos(angle), amp)


def rotary_sections(d: int) -> list[int]:
    """Channels per axis (f, h, w), as Wan2.1 splits them: h and w 2 (d // 6) each."""
    hw = 2 * (d // 6)
    return [d - 2 * hw, hw, hw]


def rotary(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """x [N, d] with each axis part's channel pairs turned by pos * ROPE_BASE^(-2j/s)."""
    out, start = np.empty_like(x), 0
    for axis, size in enumerate(rotary_sections(x.shape[1])):
        theta = ROPE_BASE ** (-2.0 * np.arange(size // 2) / size)
        angle = positions[:, axis : axis + 1] * theta[None, :]
        cos, sin = np.cos(angle), np.sin(angle)
        even, odd = x[:, start : start + size : 2], x[:, start + 1 : start + size : 2]
        out[:, start : start + size : 2] = even * cos - odd * sin
        out[:, start + 1 : start + size : 2] = even * sin + odd * cos
        start += size
    return out


def make_head(rng, geometry: Geometry, kind: str, gain: float, d: int = HEAD_DIM) -> Head:
    """One head's q, k, v (float64), drawing in the docstring's order."""
    n, positions = geometry.seq_len, geometry.positions()

    def field(channels):
        return smooth_field(rng, geometry, channels, HEAD_KINDS[kind])

    # q and k share the content (a token's query finds keys of similar content) and differ
    # by a smooth part of their own and a little white noise.
    content = field(d)
    q = content + QUERY_NOISE * field(d) + WHITE_NOISE * rng.standard_normal((n, d))
    k = content + QUERY_NOISE * field(d) + WHITE_NOISE * rng.standard_normal((n, d))
    v = field(d) + VALUE_NOISE * rng.standard_normal((n, d))
    q, k = rotary(q, positions), rotary(k, positions)
    # Heavy hitters after the rotary embedding: their pull is the same at every distance.
    hitters = rng.choice(n, HEAVY_HITTERS, replace=False)
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    gate = 1.0 / (1.0 + np.exp(-2.0 * field(1)))
    k[hitters] += HEAVY_KEY * direction
    q += HEAVY_QUERY * gate * direction
    return Head(kind, gain * q, gain * k, v, np.sort(hitters))


def make_heads(seed: int, geometry: Geometry, heads: int, gain: float = 1.0) -> list[Head]:
    rng = np.random.default_rng(seed)
    return [make_head(rng, geometry, head_kind(i), gain) for i in range(heads)]


# -- the dense reference and the metrics -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dense:
    """One head's float64 reference: the unnormalized weights E = exp(s - max_row s), their
    row sums z (P = E / z), the values and the dense output."""

    weights: np.ndarray  # [N, N]
    row_sums: np.ndarray  # [N]
    v: np.ndarray
    out: np.ndarray

    def probabilities(self) -> np.ndarray:
        return self.weights / self.row_sums[:, None]


def dense_reference(head: Head) -> Dense:
    logits = (head.q @ head.k.T) / np.sqrt(head.q.shape[1])
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    row_sums = weights.sum(axis=1)
    return Dense(weights, row_sums, head.v, (weights @ head.v) / row_sums[:, None])


@dataclasses.dataclass(frozen=True)
class Quality:
    density: float
    recall: float
    error: float


def mask_quality(dense: list[Dense], keeps: list[np.ndarray]) -> Quality:
    """Density, recall and output error of a bool [N, N] mask per head."""
    density = recall = diff2 = ref2 = 0.0
    for ref, keep in zip(dense, keeps):
        kept = np.where(keep, ref.weights, 0.0)
        mass = kept.sum(axis=1)
        out = (kept @ ref.v) / np.where(mass > 0, mass, 1.0)[:, None]  # empty row: 0
        density += keep.mean()
        recall += np.mean(mass / ref.row_sums)
        diff2 += np.sum((out - ref.out) ** 2)
        ref2 += np.sum(ref.out**2)
    heads = len(dense)
    return Quality(density / heads, recall / heads, float(np.sqrt(diff2 / ref2)))


def structure_rows(geometry: Geometry, heads: list[Head], dense: list[Dense]) -> list[str]:
    """Per head: where the dense mass lies (the structure the generator plants)."""
    t = np.arange(geometry.seq_len)
    frame, place = t // geometry.frame_tokens, t % geometry.frame_tokens
    same_frame = frame[:, None] == frame[None, :]
    same_place = (place[:, None] == place[None, :]) & ~same_frame
    rows = []
    for i, (head, ref) in enumerate(zip(heads, dense)):
        p = ref.probabilities()
        entropy = -np.sum(p * np.log(np.where(p > 0, p, 1.0)), axis=1)
        rows.append(
            f"| {i} | {head.kind} | {np.mean(np.sum(p * same_frame, 1)):.3f} | "
            f"{np.mean(np.sum(p * same_place, 1)):.3f} | "
            f"{np.mean(p[:, head.hitters].sum(1)):.3f} | {np.mean(np.exp(entropy)):.0f} |"
        )
    return rows


# -- static masks ----------------------------------------------------------------------------


def anchor_mask(geometry: Geometry) -> np.ndarray:
    """bool [N, N]: the keys of the first ANCHOR_FRAMES frames."""
    keys = np.arange(geometry.seq_len) < ANCHOR_FRAMES * geometry.frame_tokens
    return np.broadcast_to(keys[None, :], (geometry.seq_len, geometry.seq_len))


def window_mask(geometry: Geometry, w: int) -> np.ndarray:
    frame = np.arange(geometry.seq_len) // geometry.frame_tokens
    return (np.abs(frame[:, None] - frame[None, :]) <= w) | anchor_mask(geometry)


def band_mask(geometry: Geometry, b: int) -> np.ndarray:
    i = np.arange(geometry.seq_len)
    return (np.abs(i[:, None] - i[None, :]) <= b) | anchor_mask(geometry)


def band_density(n: int, b: int) -> float:
    """Density of |i - j| <= b alone over n tokens, exactly."""
    b = min(b, n - 1)
    return (n + 2 * (b * n - b * (b + 1) // 2)) / n**2


def anchored_band_density(geometry: Geometry, b: int) -> float:
    """Density of band b OR the anchor, exactly: the band's pairs and the anchor's outside."""
    n, a = geometry.seq_len, ANCHOR_FRAMES * geometry.frame_tokens
    keys = np.arange(a)
    in_band = np.minimum(n - 1, keys + b) - np.maximum(0, keys - b) + 1  # rows per anchor key
    return band_density(n, b) + float(np.sum(n - in_band)) / n**2


def nearest_width(density_of, target: float, hi: int) -> int:
    """The b in 0..hi whose density_of(b) (nondecreasing) is nearest target."""
    lo = 0
    while lo < hi:  # bisect for the least b reaching target
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if density_of(mid) >= target else (mid + 1, hi)
    return min((b for b in (lo - 1, lo) if b >= 0), key=lambda b: abs(density_of(b) - target))


# -- block selection -------------------------------------------------------------------------


class Selector:
    """The selection side of one input: block scores as svgen computes them, the always-kept
    mask (anchor OR diagonal compute block), the selectable blocks, and per block the real
    pairs the always-kept mask leaves out (densities then come from block counts)."""

    def __init__(self, geometry: Geometry, heads: list[Head], block: int, sampled_rows: int = 0):
        n = geometry.seq_len
        self.n, self.block = n, block
        self.blocks = -(-n // block)
        block_of = np.arange(n) // block
        self.always = anchor_mask(geometry) | (block_of[:, None] == block_of[None, :])
        real = self._pairs_per_block(np.ones((n, n), bool))
        kept = self._pairs_per_block(self.always)
        self.selectable = kept < real  # real pairs the always-kept mask leaves out
        self.extra = real - kept
        self.always_pairs = int(self.always.sum())
        padded = self.blocks * block
        shape = KernelShape(n, padded, block, block, HEAD_DIM, len(heads), block, block)
        q = jnp.asarray(np.stack([h.q for h in heads]), jnp.float32)
        k = jnp.asarray(np.stack([h.k for h in heads]), jnp.float32)
        scale = HEAD_DIM**-0.5
        if sampled_rows:
            self.scores = sel.sampled_block_scores(
                q, k, shape, self.blocks, self.blocks, scale, sampled_rows
            )
        else:
            self.scores = sel.block_scores(q, k, shape, self.blocks, self.blocks, scale)
        # One compile per rule; the amount is traced, as in a generated module's call.
        self._select = {rule: jax.jit(self._selection(rule)) for rule in (sel.TOP_K, sel.TOP_P)}

    def _pairs_per_block(self, keep: np.ndarray) -> np.ndarray:
        """int [R, C]: kept pairs per compute block of a bool [N, N] mask."""
        size = self.blocks * self.block
        padded = np.zeros((size, size), bool)
        padded[: self.n, : self.n] = keep
        return padded.reshape(self.blocks, self.block, self.blocks, self.block).sum(axis=(1, 3))

    def _selection(self, rule: str):
        policy = sel.SelectPolicy(rule, 0, 0, self.blocks)  # no min, no max: the rule alone
        return lambda scores, amount: sel.select_blocks(scores, self.selectable, policy, amount)

    @property
    def max_k(self) -> int:
        return int(self.selectable.sum(axis=1).max())

    def select(self, rule: str, amount) -> np.ndarray:
        """bool [heads, R, C]: the blocks select_blocks chooses for this amount."""
        dtype = jnp.int32 if rule == sel.TOP_K else jnp.float32
        return np.asarray(self._select[rule](self.scores, jnp.asarray(amount, dtype)))

    def density(self, chosen: np.ndarray) -> float:
        """The mean over heads of kept pairs / all pairs (exact, from block counts)."""
        pairs = self.always_pairs + (chosen * self.extra).sum(axis=(1, 2))
        return float(np.mean(pairs) / self.n**2)

    def keeps(self, chosen: np.ndarray) -> list[np.ndarray]:
        """bool [N, N] per head: always-kept OR in a chosen block (keys past N cut off)."""
        n, b = self.n, self.block
        return [self.always | np.kron(c, np.ones((b, b), bool))[:n, :n] for c in chosen]


@dataclasses.dataclass(frozen=True)
class Chosen:
    rule: str
    amount: float
    blocks: np.ndarray  # bool [heads, R, C]
    density: float

    @property
    def blocks_per_row(self) -> float:
        return float(self.blocks.sum(axis=2).mean())

    def describe(self) -> str:
        return f"k = {self.amount}" if self.rule == sel.TOP_K else f"p = {self.amount:.4g}"


def choose(selector: Selector, rule: str, amount) -> Chosen:
    blocks = selector.select(rule, amount)
    return Chosen(rule, amount, blocks, selector.density(blocks))


def top_k_nearest(selector: Selector, target: float) -> Chosen:
    """The k whose density is nearest target (every k: there are few)."""
    tries = [choose(selector, sel.TOP_K, k) for k in range(selector.max_k + 1)]
    return min(tries, key=lambda c: abs(c.density - target))


def top_p_nearest(selector: Selector, target: float, steps: int = 30) -> Chosen:
    """The p whose density is nearest target: density is a nondecreasing step function of
    p, so bisect and keep the nearest seen."""
    lo, hi = 0.0, 1.0
    best = min(
        (choose(selector, sel.TOP_P, p) for p in (lo, hi)), key=lambda c: abs(c.density - target)
    )
    for _ in range(steps):
        tried = choose(selector, sel.TOP_P, (lo + hi) / 2)
        best = min(best, tried, key=lambda c: abs(c.density - target))
        lo, hi = (tried.amount, hi) if tried.density < target else (lo, tried.amount)
    return best


def smallest_reaching(reaches, lo, hi, steps: int, integer: bool):
    """The least amount in [lo, hi] for which reaches(amount) holds, by bisection (reaches
    taken as monotone: false, then true); None when not even hi reaches."""
    if reaches(lo):
        return lo
    if not reaches(hi):
        return None
    for _ in range(steps):  # reaches(lo) is false, reaches(hi) true
        if integer and hi - lo <= 1:
            break
        mid = (lo + hi) // 2 if integer else (lo + hi) / 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return hi


def least_density_at_error(selector, dense, rule: str, error: float):
    """(Chosen, Quality) of the least amount whose output error is at most `error`, or None.
    Error falls (not strictly) as the amount grows: bisect on p, or on k."""
    seen = {}

    def reaches(amount):
        chosen = choose(selector, rule, amount)
        seen[amount] = chosen, mask_quality(dense, selector.keeps(chosen.blocks))
        return seen[amount][1].error <= error

    if rule == sel.TOP_P:
        amount = smallest_reaching(reaches, 0.0, 1.0, steps=14, integer=False)
    else:
        amount = smallest_reaching(reaches, 0, selector.max_k, steps=8, integer=True)
    return None if amount is None else seen[amount]


# -- the report ------------------------------------------------------------------------------

COLUMNS = ["mask", "parameter", "density", "recall", "out. rel. L2 err", "sel. blocks/row"]


def table_row(mask: str, parameter: str, quality: Quality, blocks: str = "-") -> str:
    return (
        f"| {mask} | {parameter} | {quality.density:.3f} | {quality.recall:.4f} | "
        f"{quality.error:.4f} | {blocks} |"
    )


def rule_name(rule: str) -> str:
    return rule.replace("_", "-")


def comparison_line(selector, dense, rule: str, band: Quality) -> str:
    found = least_density_at_error(selector, dense, rule, band.error)
    if found is None:
        return f"* {rule_name(rule)}: no amount reaches the band's error {band.error:.4f}."
    chosen, quality = found
    ratio = quality.density / band.density
    verdict = "meets" if ratio <= TARGET_RATIO else "misses"
    return (
        f"* {rule_name(rule)}: the least amount with output error <= the spec-like band's "
        f"{band.error:.4f} is {chosen.describe()}: density {quality.density:.3f} (error "
        f"{quality.error:.4f}, recall {quality.recall:.4f}, {chosen.blocks_per_row:.2f} "
        f"blocks/row), {ratio:.3f} x the band's density {band.density:.3f} ({verdict} the "
        f"goal <= {TARGET_RATIO:.3f})."
    )


def command_line(args) -> str:
    return (
        f".venv/bin/python bench/selection_quality.py --seed {args.seed} --frames {args.frames} "
        f"--height {args.height} --width {args.width} --heads {args.heads} --block {args.block} "
        f"--gain {args.gain:g}"
        + (f" --sampled-rows {args.sampled_rows}" if args.sampled_rows else "")
    )


def parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, help=f"default {DEFAULTS['frames']}")
    parser.add_argument("--height", type=int, help=f"default {DEFAULTS['height']}")
    parser.add_argument("--width", type=int, help=f"default {DEFAULTS['width']}")
    parser.add_argument("--heads", type=int, help=f"default {DEFAULTS['heads']}")
    parser.add_argument("--block", type=int, help="compute block, q rows = keys (default 128)")
    parser.add_argument("--gain", type=float, default=1.0, help="scale of q and k")
    parser.add_argument(
        "--sampled-rows",
        type=int,
        default=0,
        help="score blocks by this many sampled query rows per block row (0: mean pooling)",
    )
    parser.add_argument(
        "--quick", action="store_true", help=f"smoke test: defaults {QUICK} instead"
    )
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:  # given values win over --quick's
            setattr(args, name, value)
    return args


def print_header(args, geometry: Geometry, selector: Selector, heads, dense) -> None:
    print("## Selection quality on synthetic video-like attention\n")
    print(
        "**Synthetic activations, not a real model's**: smooth random q/k/v fields over "
        "(frame, height, width), a 3-D rotary embedding and a few heavy-hitter keys; the "
        "generator is in the docstring of bench/selection_quality.py.\n"
    )
    print(
        f"seed {args.seed}; {geometry.frames} x {geometry.height} x {geometry.width} = "
        f"{geometry.seq_len:,} tokens, frame-major; {len(heads)} heads, head_dim {HEAD_DIM}, "
        f"gain {args.gain:g}; scores: "
        f"{f'{args.sampled_rows} sampled rows per block row' if args.sampled_rows else 'mean pooling'}; "
        f"compute blocks {args.block} x {args.block} ({selector.blocks} "
        f"per row, at most {selector.max_k} selectable); float64 reference.\n"
    )
    print(f"Reproduce: `{command_line(args)}`\n")
    print("Where the dense attention mass lies (means over query rows):\n")
    print("| head | kind | own frame | same place, other frames | heavy hitters | eff. keys |")
    print("|---:|---|---:|---:|---:|---:|")
    for line in structure_rows(geometry, heads, dense):
        print(line)
    print(
        "\nEvery mask keeps the first-frame anchor (keys of frame 0); the selection keeps the "
        "diagonal compute block too, and sel. blocks/row counts the blocks it chose per "
        "compute block row beyond those.\n"
    )


def main(argv=None) -> None:
    start = time.perf_counter()
    args = parse(argv)
    geometry = Geometry(args.frames, args.height, args.width)
    n = geometry.seq_len
    heads = make_heads(args.seed, geometry, args.heads, args.gain)
    dense = [dense_reference(h) for h in heads]
    selector = Selector(geometry, heads, args.block, args.sampled_rows)
    print_header(args, geometry, selector, heads, dense)
    print("| " + " | ".join(COLUMNS) + " |")
    print("|---|---|---:|---:|---:|---:|")

    def static(mask: str, parameter: str, keep: np.ndarray) -> Quality:
        quality = mask_quality(dense, [keep] * len(heads))
        print(table_row(mask, parameter, quality), flush=True)
        return quality

    def selections_at(density: float) -> None:
        for chosen in (top_k_nearest(selector, density), top_p_nearest(selector, density)):
            quality = mask_quality(dense, selector.keeps(chosen.blocks))
            blocks = f"{chosen.blocks_per_row:.2f}"
            print(table_row(rule_name(chosen.rule), chosen.describe(), quality, blocks), flush=True)

    for w in WINDOWS:
        if w >= geometry.frames:
            continue
        density = static("window", f"w = {w}", window_mask(geometry, w)).density
        b = nearest_width(lambda b: anchored_band_density(geometry, b), density, n - 1)
        static("band", f"b = {b}", band_mask(geometry, b))
        selections_at(density)
    b = nearest_width(lambda b: band_density(n, b), SPEC_BAND_DENSITY, n - 1)
    band = static(f"band {SPEC_BAND_DENSITY} (spec-like)", f"b = {b}", band_mask(geometry, b))
    selections_at(band.density)
    print()
    for rule in (sel.TOP_P, sel.TOP_K):
        print(comparison_line(selector, dense, rule, band), flush=True)
    print(f"\nwall time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
