"""Writes the block masks of bench/specs/blocks/: the same masks as data files and as `expr`
predicates, for `svgen bench` to time the two ways of writing one mask on the chip (issue 45:
a mask given as data runs at the speed of the same mask written as a primitive).

    python bench/make_block_masks.py        # rewrites bench/specs/blocks/*.npz

Each mask is a band of blocks with the first frame's blocks, on Wan 2.1's 720p geometry
(21 x 45 x 80 = 75,600 tokens): keep(q, k) when |i_q // B - i_k // B| <= R or i_k // B < A,
with (B, R, A) = (512, 8, 8) (the blocks of the kernel's 512 x 512 compute blocks: every
compute block is kept whole or not at all) and (128, 35, 29) (four data blocks a compute
block side: the kernel reads the data on every BOUNDARY block). The same rule is the `expr`
of the *_expr.yaml specs beside them. paro_like.npz holds three such bands (12, 24 and 48
blocks of 128 tokens, the first 8 blocks), one per head kind of paro_like.yaml.
Deterministic: the files are compressed with no timestamps that change.
"""

from __future__ import annotations

import io
import pathlib
import zipfile

import numpy as np

SEQ_LEN = 21 * 45 * 80
MASKS = {"band_512": (512, 8, 8), "band_128": (128, 35, 29)}
# PAROAttention-shaped (paro_like.yaml puts each head kind in its own axis order): bands of
# 128-token blocks of three widths with the first 8 blocks, masks that an order gathers into
# blocks, the shape a calibration finds, not a calibration itself.
PARO_LIKE = (128, (12, 24, 48), 8)
FOLDER = pathlib.Path(__file__).resolve().parent / "specs" / "blocks"


def band_of_blocks(block: int, radius: int, anchor: int) -> np.ndarray:
    n = -(-SEQ_LEN // block)
    r = np.arange(n)
    return (np.abs(r[:, None] - r[None, :]) <= radius) | (r[None, :] < anchor)


def npz_bytes(name: str, array: np.ndarray) -> bytes:
    """A one-array .npz with fixed member dates, so that the bytes (and the digest the
    generated module names) do not depend on when it was written."""
    member = io.BytesIO()
    np.save(member, array, allow_pickle=False)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        info = zipfile.ZipInfo(f"{name}.npy", date_time=(2026, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, member.getvalue())
    return out.getvalue()


def main() -> None:
    FOLDER.mkdir(parents=True, exist_ok=True)
    for name, (block, radius, anchor) in MASKS.items():
        bits = band_of_blocks(block, radius, anchor).astype(np.uint8)
        (FOLDER / f"{name}.npz").write_bytes(npz_bytes("mask", bits))
        print(
            f"{name}.npz: {bits.shape[0]} x {bits.shape[1]} blocks of {block}, {bits.mean():.4f} kept"
        )
    block, radii, anchor = PARO_LIKE
    heads = np.stack([band_of_blocks(block, r, anchor) for r in radii]).astype(np.uint8)
    (FOLDER / "paro_like.npz").write_bytes(npz_bytes("masks", heads))
    kept = ", ".join(f"{h.mean():.4f}" for h in heads)
    print(f"paro_like.npz: {' x '.join(map(str, heads.shape))} blocks of {block}, {kept} kept")


if __name__ == "__main__":
    main()
