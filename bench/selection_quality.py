"""How well activation-driven block selection keeps attention, next to static masks.

    .venv/bin/python bench/selection_quality.py [--seed S] [--frames F --height H --width W]
        [--heads N] [--block B] [--quick]

On synthetic video-like attention with known structure (below; NOT a real model's
activations), this compares, at matched densities, static masks built from coordinates with
the top-k and top-p selection of svgen.runtime.select (the pooled block scores of
`block_scores` and the ranking of `select_blocks`, the very functions a generated module
calls). Per mask: density (kept pairs / all pairs, averaged over heads), attention-mass
recall (the mean over query rows of the dense probabilities on kept pairs), the relative L2
error of the output,

    || O_mask - O_dense || / || O_dense ||   (Frobenius, over all heads at once),

where O_mask is the softmax restricted to the mask, all in float64, and for the selection
policies the blocks chosen per compute block row (beyond the always-kept ones). Then the
smallest top-p (and top-k) density whose error is at most that of the spec-like band mask
(`specs/wan21_720p_band.yaml`: a band of density 0.35 plus the first frame), and its ratio
to the band's density. Nothing here is timed: kernel cost is bench/kernel_cost.py's and
bench/select_cost.py's business.

Generator (numpy.random.default_rng(seed); draws in exactly this order):
  * Tokens: F frames x H x W, frame-major, token t = f*H*W + h*W + w (the kernel order is the
    user order); u = (f/F, h/H, w/W) its normalized position.
  * A smooth field of c channels, `smooth_field`: draws n ~ U(-1, 1) [c, 6, 3] scaled per axis
    by the cycles over the axis (CYCLES = 0.5 over the frames, 2 over height and width), then
    phases ~ U(0, 2 pi) [c, 6], then amplitudes ~ N(0, 1) [c, 6]; channel i at u is
    sqrt(2/6) * sum_m amp[i, m] cos(2 pi n[i, m] . u + phase[i, m]) (unit variance). Content
    varies slowly over time, faster over space, as a video's does.
  * Per head, in head order: content = smooth_field(d); q0 = content + 0.5 smooth_field(d) +
    0.3 N(0, 1) [N, d]; k0 = content + 0.5 smooth_field(d) + 0.3 N(0, 1) [N, d]; v =
    smooth_field(d) + 0.5 N(0, 1) [N, d]; then q0, k0 are rotated by a 3-D rotary embedding
    (`rotary`: head_dim split as Wan2.1 does, h and w parts 2 * (d // 6) channels each and the
    frame part the rest, first; channel pair j of a part of s channels turns by
    position * 10000^(-2j/s), the position being the token's f, h or w); then the heavy
    hitters: HEAVY_HITTERS = 4 token indices drawn without replacement (rng.choice), a
    direction e ~ N(0, I_d) normalized, a gate g = sigmoid(2 smooth_field(1)) in (0, 1);
    k[hitters] += HEAVY_KEY * e, and every query q += HEAVY_QUERY * g * e (many queries,
    strongly where g is large, align to those few keys); last, q and k are multiplied by GAIN.
  * sm_scale = 1 / sqrt(d); the dense reference is float64: P = softmax(q k^T sm_scale).

Masks (all OR'ed with a first-frame anchor, keys of frame 0):
  * window w: |f_q - f_k| <= w, for w = 0, 1, 2;
  * band b: |i_q - i_k| <= b, b chosen (bisection) so the mask's density is nearest each
    window's, plus the spec-like band (band alone of density 0.35, as the spec's
    `band: {density: 0.35}`);
  * top-k / top-p: compute blocks of B x B tokens; always-kept = the anchor OR the diagonal
    compute block; selectable = every block the always-kept mask does not keep whole; the
    amount k (every value) or p (bisection) whose density is nearest each static mask's.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from svgen import libtpu_env  # noqa: E402

libtpu_env.prepare()  # before JAX starts its backends: libtpu stays quiet on a CPU host

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from svgen.runtime import select as sel  # noqa: E402
from svgen.runtime.tables import KernelShape  # noqa: E402

DEFAULTS = dict(frames=8, height=16, width=24, heads=4, block=128)
QUICK = dict(frames=4, height=8, width=16, heads=2, block=64)
HEAD_DIM = 64
CYCLES = (0.5, 2.0, 2.0)  # (frames, height, width): slow in time, faster in space
WAVES = 6
HEAVY_HITTERS = 4
HEAVY_KEY = 6.0
HEAVY_QUERY = 3.0
GAIN = 1.0
ROPE_BASE = 10000.0
ANCHOR_FRAMES = 1
SPEC_BAND_DENSITY = 0.35  # specs/wan21_720p_band.yaml: band {density: 0.35} + one frame
WINDOWS = (0, 1, 2)
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
        f, h, w = np.meshgrid(
            np.arange(self.frames), np.arange(self.height), np.arange(self.width), indexing="ij"
        )
        return np.stack([f.ravel(), h.ravel(), w.ravel()], axis=1)


@dataclasses.dataclass(frozen=True)
class Head:
    q: np.ndarray  # float64 [N, d]
    k: np.ndarray
    v: np.ndarray
    hitters: np.ndarray  # int [HEAVY_HITTERS]: the heavy-hitter keys


def smooth_field(rng, geometry: Geometry, channels: int) -> np.ndarray:
    """float64 [N, channels] of unit variance: a few random low-frequency plane waves each."""
    extent = np.array([geometry.frames, geometry.height, geometry.width], np.float64)
    u = geometry.positions() / extent
    cycles = rng.uniform(-1.0, 1.0, (channels, WAVES, 3)) * np.array(CYCLES)
    phase = rng.uniform(0.0, 2 * np.pi, (channels, WAVES))
    amp = rng.standard_normal((channels, WAVES))
    angle = 2 * np.pi * np.einsum("na,cma->ncm", u, cycles) + phase
    return np.sqrt(2.0 / WAVES) * np.einsum("ncm,cm->nc", np.cos(angle), amp)


def rotary_sections(d: int) -> list[int]:
    """Channels per axis (f, h, w), Wan2.1's split: h and w 2 * (d // 6) each, f the rest."""
    hw = 2 * (d // 6)
    return [d - 2 * hw, hw, hw]


def rotary(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """x [N, d] with each axis's channel pairs turned by position * ROPE_BASE^(-2j/s)."""
    out, start = np.empty_like(x), 0
    for axis, size in enumerate(rotary_sections(x.shape[1])):
        pairs = size // 2
        theta = ROPE_BASE ** (-2.0 * np.arange(pairs) / size)
        angle = positions[:, axis : axis + 1] * theta[None, :]
        even, odd = x[:, start : start + size : 2], x[:, start + 1 : start + size : 2]
        cos, sin = np.cos(angle), np.sin(angle)
        out[:, start : start + size : 2] = even * cos - odd * sin
        out[:, start + 1 : start + size : 2] = even * sin + odd * cos
        start += size
    return out


def make_head(rng, geometry: Geometry, d: int = HEAD_DIM) -> Head:
    """One head's q, k, v (float64) in the documented draw order."""
    n, positions = geometry.seq_len, geometry.positions()
    content = smooth_field(rng, geometry, d)
    q = content + 0.5 * smooth_field(rng, geometry, d) + 0.3 * rng.standard_normal((n, d))
    k = content + 0.5 * smooth_field(rng, geometry, d) + 0.3 * rng.standard_normal((n, d))
    v = smooth_field(rng, geometry, d) + 0.5 * rng.standard_normal((n, d))
    q, k = rotary(q, positions), rotary(k, positions)
    hitters = rng.choice(n, HEAVY_HITTERS, replace=False)
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    gate = 1.0 / (1.0 + np.exp(-2.0 * smooth_field(rng, geometry, 1)))
    k[hitters] += HEAVY_KEY * direction
    q += HEAVY_QUERY * gate * direction
    return Head(GAIN * q, GAIN * k, v, np.sort(hitters))


def make_heads(seed: int, geometry: Geometry, heads: int) -> list[Head]:
    rng = np.random.default_rng(seed)
    return [make_head(rng, geometry) for _ in range(heads)]


# -- the dense reference and the metrics -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dense:
    """One head's float64 reference: unnormalized weights E = exp(s - max_row s), their row
    sums z (P = E / z), the values and the dense output."""

    weights: np.ndarray  # [N, N]
    row_sums: np.ndarray  # [N]
    v: np.ndarray
    out: np.ndarray


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
    """Density, recall and output error of one bool [N, N] mask per head."""
    density = recall = 0.0
    diff2 = ref2 = 0.0
    for ref, keep in zip(dense, keeps):
        kept = np.where(keep, ref.weights, 0.0)
        mass = kept.sum(axis=1)
        # A row with no kept key outputs 0 (what a kernel writes for an empty row).
        out = (kept @ ref.v) / np.where(mass > 0, mass, 1.0)[:, None]
        density += keep.mean()
        recall += np.mean(mass / ref.row_sums)
        diff2 += np.sum((out - ref.out) ** 2)
        ref2 += np.sum(ref.out**2)
    heads = len(dense)
    return Quality(density / heads, recall / heads, float(np.sqrt(diff2 / ref2)))


# -- static masks ----------------------------------------------------------------------------


def anchor_mask(geometry: Geometry) -> np.ndarray:
    """bool [N, N]: keys of the first ANCHOR_FRAMES frames."""
    keys = np.arange(geometry.seq_len) < ANCHOR_FRAMES * geometry.frame_tokens
    return np.broadcast_to(keys[None, :], (geometry.seq_len, geometry.seq_len))


def window_mask(geometry: Geometry, w: int) -> np.ndarray:
    frame = np.arange(geometry.seq_len) // geometry.frame_tokens
    return (np.abs(frame[:, None] - frame[None, :]) <= w) | anchor_mask(geometry)


def band_mask(geometry: Geometry, b: int, anchor: bool = True) -> np.ndarray:
    i = np.arange(geometry.seq_len)
    band = np.abs(i[:, None] - i[None, :]) <= b
    return band | anchor_mask(geometry) if anchor else band


def band_density(n: int, b: int) -> float:
    """Density of |i - j| <= b alone over n tokens (no anchor), exactly."""
    b = min(b, n - 1)
    return (n + 2 * (b * n - b * (b + 1) // 2)) / n**2


def anchored_band_density(geometry: Geometry, b: int) -> float:
    """Density of band b OR the anchor, exactly: the band's pairs plus the anchor's outside it."""
    n, a = geometry.seq_len, ANCHOR_FRAMES * geometry.frame_tokens
    keys = np.arange(a)
    in_band = np.minimum(n - 1, keys + b) - np.maximum(0, keys - b) + 1  # rows per anchor key
    return band_density(n, b) + float(np.sum(n - in_band)) / n**2


def nearest_width(density_of, target: float, hi: int) -> int:
    """The b in 0..hi whose (nondecreasing) density_of(b) is nearest target."""
    lo = 0
    while lo < hi:  # the least b with density >= target
        mid = (lo + hi) // 2
        if density_of(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    candidates = [b for b in (lo - 1, lo) if b >= 0]
    return min(candidates, key=lambda b: abs(density_of(b) - target))


# -- block selection -------------------------------------------------------------------------


class Selector:
    """The selection side of one input: block scores as svgen computes them, the always-kept
    mask (anchor OR diagonal compute block), the selectable blocks, and each block's real
    pairs the always-kept mask leaves out (so that densities come from block counts)."""

    def __init__(self, geometry: Geometry, heads: list[Head], block: int):
        n = geometry.seq_len
        self.n, self.block = n, block
        self.blocks = -(-n // block)
        blocks_of = np.arange(n) // block
        self.always = anchor_mask(geometry) | (blocks_of[:, None] == blocks_of[None, :])
        padded = self.blocks * block
        pad = np.zeros((padded, padded), bool)
        pad[:n, :n] = True  # real pairs
        always_pad = np.zeros_like(pad)
        always_pad[:n, :n] = self.always
        shape4 = (self.blocks, block, self.blocks, block)
        real = pad.reshape(shape4).sum(axis=(1, 3))
        kept = always_pad.reshape(shape4).sum(axis=(1, 3))
        self.selectable = (kept < real) & (real > 0)  # blocks always does not keep whole
        self.extra = real - kept
        self.always_pairs = int(self.always.sum())
        shape = KernelShape(n, padded, block, block, HEAD_DIM, len(heads), block, block)
        q = jnp.asarray(np.stack([h.q for h in heads]), jnp.float32)
        k = jnp.asarray(np.stack([h.k for h in heads]), jnp.float32)
        scale = 1.0 / np.sqrt(HEAD_DIM)
        self.scores = sel.block_scores(q, k, shape, self.blocks, self.blocks, scale)
        self._select = {
            rule: jax.jit(lambda s, a, p=self.policy(rule): sel.select_blocks(s, self.selectable, p, a))
            for rule in (sel.TOP_K, sel.TOP_P)
        }

    def policy(self, rule: str) -> sel.SelectPolicy:
        return sel.SelectPolicy(rule, 0, 0, self.blocks)

    @property
    def max_k(self) -> int:
        return int(self.selectable.sum(axis=1).max())

    def select(self, rule: str, amount) -> np.ndarray:
        """bool [heads, R, C]: the blocks select_blocks chooses for this amount."""
        dtype = jnp.int32 if rule == sel.TOP_K else jnp.float32
        return np.asarray(self._select[rule](self.scores, jnp.asarray(amount, dtype)))

    def density(self, chosen: np.ndarray) -> float:
        """Mean over heads of kept pairs / all pairs (exact, from block counts)."""
        pairs = self.always_pairs + (chosen * self.extra).sum(axis=(1, 2))
        return float(np.mean(pairs) / self.n**2)

    def blocks_per_row(self, chosen: np.ndarray) -> float:
        return float(chosen.sum(axis=2).mean())

    def keeps(self, chosen: np.ndarray) -> list[np.ndarray]:
        """bool [N, N] per head: always OR a chosen block (keys past seq_len cut off)."""
        n, b = self.n, self.block
        return [self.always | np.kron(c, np.ones((b, b), bool))[:n, :n] for c in chosen]


@dataclasses.dataclass(frozen=True)
class Chosen:
    rule: str
    amount: float
    blocks: np.ndarray  # bool [heads, R, C]
    density: float


def choose(selector: Selector, rule: str, amount) -> Chosen:
    blocks = selector.select(rule, amount)
    return Chosen(rule, amount, blocks, selector.density(blocks))


def top_k_nearest(selector: Selector, target: float) -> Chosen:
    """Density grows with k: try every k, keep the nearest."""
    tries = [choose(selector, sel.TOP_K, k) for k in range(selector.max_k + 1)]
    return min(tries, key=lambda c: abs(c.density - target))


def top_p_nearest(selector: Selector, target: float, steps: int = 30) -> Chosen:
    """Density grows with p (a step function): bisect on p, keep the nearest seen."""
    lo, hi = 0.0, 1.0
    best = min((choose(selector, sel.TOP_P, p) for p in (lo, hi)), key=lambda c: abs(c.density - target))
    for _ in range(steps):
        mid = (lo + hi) / 2
        tried = choose(selector, sel.TOP_P, mid)
        if abs(tried.density - target) < abs(best.density - target):
            best = tried
        if tried.density < target:
            lo = mid
        else:
            hi = mid
    return best


def smallest_reaching(reaches, lo, hi, steps: int, integer: bool):
    """The least amount in [lo, hi] for which reaches(amount) holds, by bisection (reaches
    assumed monotone: false, then true); None when not even hi reaches."""
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


# -- the report ------------------------------------------------------------------------------


def row(mask: str, parameter: str, quality: Quality, blocks: str = "–") -> str:
    return (
        f"| {mask} | {parameter} | {quality.density:.3f} | {quality.recall:.4f} | "
        f"{quality.error:.4f} | {blocks} |"
    )


def selection_row(selector, dense, chosen: Chosen) -> tuple[str, Quality]:
    quality = mask_quality(dense, selector.keeps(chosen.blocks))
    amount = f"k = {chosen.amount}" if chosen.rule == sel.TOP_K else f"p = {chosen.amount:.4g}"
    blocks = f"{selector.blocks_per_row(chosen.blocks):.2f}"
    return row(chosen.rule.replace("_", "-"), amount, quality, blocks), quality


def command_line(args, geometry: Geometry) -> str:
    return (
        f".venv/bin/python bench/selection_quality.py --seed {args.seed} "
        f"--frames {geometry.frames} --height {geometry.height} --width {geometry.width} "
        f"--heads {args.heads} --block {args.block}"
    )


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int)
    parser.add_argument("--height", type=int)
    parser.add_argument("--width", type=int)
    parser.add_argument("--heads", type=int)
    parser.add_argument("--block", type=int, help="compute block (q rows = kv keys)")
    parser.add_argument("--quick", action="store_true", help="a small geometry (smoke test)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    for name, value in base.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def comparison_lines(selector, dense, band: Quality) -> list[str]:
    """The least top-p / top-k density whose error is at most the spec-like band's."""
    lines = []
    searches = [
        (sel.TOP_P, 0.0, 1.0, 14, False),
        (sel.TOP_K, 0, selector.max_k, 8, True),
    ]
    for rule, lo, hi, steps, integer in searches:
        errors = {}

        def reaches(amount, rule=rule, errors=errors):
            blocks = selector.select(rule, amount)
            errors[amount] = (blocks, mask_quality(dense, selector.keeps(blocks)))
            return errors[amount][1].error <= band.error

        amount = smallest_reaching(reaches, lo, hi, steps, integer)
        name = rule.replace("_", "-")
        if amount is None:
            lines.append(f"* {name}: no amount reaches the band's error {band.error:.4f}.")
            continue
        blocks, quality = errors[amount]
        ratio = quality.density / band.density
        verdict = "meets" if ratio <= TARGET_RATIO else "misses"
        shown = f"p = {amount:.4g}" if not integer else f"k = {amount}"
        lines.append(
            f"* {name}: the least amount with error <= the spec-like band's {band.error:.4f} "
            f"(band density {band.density:.3f}) is {shown}: density {quality.density:.3f}, "
            f"error {quality.error:.4f}, recall {quality.recall:.4f}, "
            f"{selector.blocks_per_row(blocks):.2f} blocks/row; density ratio {ratio:.3f} "
            f"({verdict} the target <= {TARGET_RATIO:.3f})."
        )
    return lines


def main(argv=None) -> None:
    args = parse(argv)
    start = time.perf_counter()
    geometry = Geometry(args.frames, args.height, args.width)
    n = geometry.seq_len
    heads = make_heads(args.seed, geometry, args.heads)
    dense = [dense_reference(h) for h in heads]
    selector = Selector(geometry, heads, args.block)
    hitter_mass = np.mean([np.mean(d.weights[:, h.hitters].sum(1) / d.row_sums) for d, h in zip(dense, heads)])

    print("## Selection quality on synthetic video-like attention\n")
    print(
        "Synthetic activations, not a real model's: smooth random q/k/v fields over "
        "(frame, height, width) with a 3-D rotary embedding and a few heavy-hitter keys "
        "(the generator is in bench/selection_quality.py's docstring).\n"
    )
    print(
        f"seed {args.seed}; {geometry.frames} x {geometry.height} x {geometry.width} = {n:,} "
        f"tokens (frame-major), {args.heads} heads, head_dim {HEAD_DIM}; compute blocks "
        f"{args.block} x {args.block} ({selector.blocks} per row, at most {selector.max_k} "
        f"selectable); float64 reference. Mass on the {HEAVY_HITTERS} heavy-hitter keys: "
        f"{hitter_mass:.3f} of each row on average.\n"
    )
    print(f"Reproduce: `{command_line(args, geometry)}`\n")
    print(
        "Static masks and the selection always keep the first-frame anchor (keys of frame 0); "
        "the selection also keeps the diagonal compute block. sel. blocks/row: chosen blocks "
        "per compute block row beyond those.\n"
    )
    print("| mask | parameter | density | recall | out. rel. L2 err | sel. blocks/row |")
    print("|---|---|---:|---:|---:|---:|")

    def static_with_matches(label, parameter, keep):
        quality = mask_quality(dense, [keep] * len(heads))
        print(row(label, parameter, quality), flush=True)
        return quality

    def matched_selection(target):
        for chosen in (top_k_nearest(selector, target), top_p_nearest(selector, target)):
            print(selection_row(selector, dense, chosen)[0], flush=True)

    for w in WINDOWS:
        if w >= geometry.frames:
            continue
        target = static_with_matches("window", f"w = {w}", window_mask(geometry, w)).density
        b = nearest_width(lambda b: anchored_band_density(geometry, b), target, n - 1)
        static_with_matches("band", f"b = {b}", band_mask(geometry, b))
        matched_selection(target)
    b_spec = nearest_width(lambda b: band_density(n, b), SPEC_BAND_DENSITY, n - 1)
    band = static_with_matches("band (spec-like)", f"b = {b_spec}", band_mask(geometry, b_spec))
    matched_selection(band.density)
    print()
    for line in comparison_lines(selector, dense, band):
        print(line)
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
