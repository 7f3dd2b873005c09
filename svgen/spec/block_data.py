"""Block masks given as data (the `blocks` primitive): the file read, checked and
fingerprinted once.

A calibrated block mask (PAROAttention keeps one per head, found offline) is an array, not a
rule: keep(q, k) = array[p_q // block, p_k // block], p the token's position in the head's
kernel order (its layout's order, in which `token_order="kernel"` takes q, k and v). This module turns the spec's `file`, `block`, `head` and `array`
into that array, or into one message saying what is wrong with the file: missing or
unreadable, not .npy / .npz, too large, of the wrong shape or dtype, or not binary. It reads
a file's size before reading it and the array's header before converting its data, so a
file or an array past the limits is refused before it takes memory (svgen.spec.limits:
MAX_BLOCK_FILE_BYTES, MAX_BLOCK_ENTRIES), and it never unpickles (allow_pickle=False). The digest is the SHA-256 of the file's bytes: the generated
module's header names it, so `svgen compile --check` fails when the file changes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import lzma
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

from svgen.spec.limits import MAX_BLOCK_ENTRIES, MAX_BLOCK_FILE_BYTES
from svgen.spec.quoting import safe_text

# Integer and boolean dtypes only: a float array of 0.0 / 1.0 is most likely a score map
# that was not thresholded, and a threshold is the user's decision, not svgen's.
_KINDS = "biu"


class BlockDataError(ValueError):
    """What is wrong with a block-mask file, in words (the caller adds the spec location)."""


@dataclasses.dataclass(frozen=True, eq=False)
class BlockArray:
    """One block mask read from a file: bits [n, n] (bool, n = ceil(seq_len / block))."""

    bits: np.ndarray
    digest: str  # SHA-256 of the whole file


def blocks_per_side(seq_len: int, block: int) -> int:
    return -(-seq_len // block)


def resolve(file: str, spec_file: str | None) -> Path:
    """The path of `file`: as given when absolute, else relative to the spec's folder (the
    working directory for a spec read from standard input)."""
    path = Path(file)
    if path.is_absolute() or not spec_file or spec_file.startswith("<"):
        return path
    return Path(spec_file).parent / path


def load(
    file: str, block: int, head: int | None, array: str | None, seq_len: int, spec_file: str | None
) -> BlockArray:
    """The checked block mask; BlockDataError with the reason otherwise."""
    path = resolve(file, spec_file)
    try:
        stat = path.stat()
    except OSError as exc:
        raise BlockDataError(f"cannot read {file}: {exc.strerror or exc}") from None
    if not path.is_file():
        raise BlockDataError(f"cannot read {file}: not a regular file")
    return _load(str(path), stat.st_mtime_ns, stat.st_size, file, block, head, array, seq_len)


@functools.lru_cache(maxsize=8)
def _load(path, _mtime_ns, size, file, block, head, array, seq_len) -> BlockArray:
    """Cached per path, modification time and size: one compile lowers each mask more than
    once (patterns, candidates, reports)."""
    if size > MAX_BLOCK_FILE_BYTES:
        raise BlockDataError(
            f"{file} is {size:,} bytes, over the {MAX_BLOCK_FILE_BYTES:,} a block-mask file may "
            "have (MAX_BLOCK_FILE_BYTES)"
        )
    suffix = Path(path).suffix.lower()
    if suffix not in (".npy", ".npz"):
        raise BlockDataError(f"{file} must be a .npy or .npz file (NumPy's formats)")
    try:
        with open(path, "rb") as fp:
            raw = fp.read()
    except OSError as exc:
        raise BlockDataError(f"cannot read {file}: {exc.strerror or exc}") from None
    digest = hashlib.sha256(raw).hexdigest()
    try:
        values = _npy_array(raw, file) if suffix == ".npy" else _npz_array(raw, file, array)
    except BlockDataError:
        raise
    except _UNREADABLE as exc:
        raise BlockDataError(f"cannot read {file} as {suffix}: {_why_unreadable(exc)}") from None
    if suffix == ".npy" and array is not None:
        raise BlockDataError(f"`array` names an array of a .npz file; {file} is a .npy file")
    bits = _checked(values, file, block, head, seq_len)
    return BlockArray(bits, digest)


# What reading a damaged or foreign file raises, from NumPy's header parser and from zipfile
# and the decompressors it calls (an encrypted member: RuntimeError; an unknown compression
# method: NotImplementedError; a corrupt deflate stream: zlib.error).
_UNREADABLE = (
    ValueError,
    OSError,
    EOFError,
    KeyError,
    IndexError,
    OverflowError,
    RuntimeError,
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    struct.error,
)


def _why_unreadable(exc: BaseException) -> str:
    """Why a file could not be read, in svgen's words: never the exception's own text,
    which may quote the file's bytes (a text file's first line)."""
    if isinstance(exc, zipfile.BadZipFile):
        return "not a zip archive (a .npz is one), or a damaged one"
    if isinstance(exc, NotImplementedError):
        return "a member is compressed with a method zipfile cannot read (save with np.savez)"
    if isinstance(exc, RuntimeError) and "encrypted" in str(exc):
        return "a member is encrypted (save with np.savez, without a password)"
    if isinstance(exc, (zlib.error, lzma.LZMAError, EOFError, OSError)):
        return "a member's data is damaged (its compressed stream does not decode)"
    return "not an array in NumPy's .npy format, or a damaged one"


def _npy_array(raw: bytes, file: str) -> np.ndarray:
    fp = io.BytesIO(raw)
    _check_header(fp, file)
    fp.seek(0)
    return np.load(fp, allow_pickle=False)


def _npz_array(raw: bytes, file: str, array: str | None) -> np.ndarray:
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        names = [n[: -len(".npy")] for n in archive.namelist() if n.endswith(".npy")]
        listed = ", ".join(safe_text(n) for n in names[:8]) or "none"  # names are never code
        if array is None:
            if len(names) != 1:
                raise BlockDataError(
                    f"{file} holds {len(names)} arrays ({listed}); name one with `array`"
                )
            array = names[0]
        elif array not in names:
            raise BlockDataError(f"{file} has no array {array!r} (it holds: {listed})")
        with archive.open(array + ".npy") as member:
            data = member.read(MAX_BLOCK_FILE_BYTES + 1)
    if len(data) > MAX_BLOCK_FILE_BYTES:
        raise BlockDataError(
            f"{file}: array {array!r} unpacks to over {MAX_BLOCK_FILE_BYTES:,} bytes "
            "(MAX_BLOCK_FILE_BYTES)"
        )
    return _npy_array(data, file)


def _check_header(fp, file: str) -> None:
    """The array's shape and dtype from its header, refused before its data is converted."""
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
    if dtype.hasobject or dtype.kind not in _KINDS:
        raise BlockDataError(
            f"{file}: the array must be of a boolean or integer dtype holding 0 and 1, got {dtype}"
        )
    entries = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if entries > MAX_BLOCK_ENTRIES:
        raise BlockDataError(
            f"{file}: the array has {entries:,} entries ({' x '.join(map(str, shape))}), over "
            f"the {MAX_BLOCK_ENTRIES:,} a block mask may have (MAX_BLOCK_ENTRIES)"
        )


def _checked(values: np.ndarray, file: str, block: int, head: int | None, seq_len: int):
    n = blocks_per_side(seq_len, block)
    want = f"{n} x {n} (ceil({seq_len:,} tokens / block {block}) per side)"
    got = " x ".join(map(str, values.shape)) or "a scalar"
    if head is None:
        if values.ndim == 3:
            raise BlockDataError(
                f"{file} holds {values.shape[0]} arrays (one per head); give `head` to pick one"
            )
        if values.shape != (n, n):
            raise BlockDataError(f"{file}: the array is {got}, expected {want}")
    else:
        if values.ndim != 3 or values.shape[1:] != (n, n):
            raise BlockDataError(
                f"{file}: with `head` the array must be [heads] x {want}, got {got}"
            )
        if head >= values.shape[0]:
            raise BlockDataError(
                f"{file} holds {values.shape[0]} arrays, so `head` must be below "
                f"{values.shape[0]}, got {head}"
            )
        values = values[head]
    wrong = np.argwhere((values != 0) & (values != 1))
    if wrong.size:
        at = tuple(int(i) for i in wrong[0])
        raise BlockDataError(
            f"{file}: a block mask holds only 0 and 1; {values[at].item()!r} at {list(at)} "
            f"({_entries_other_than_0_and_1(len(wrong))})"
        )
    bits = np.ascontiguousarray(values != 0)
    bits.setflags(write=False)
    return bits


def _entries_other_than_0_and_1(count: int) -> str:
    return "1 entry holds another value" if count == 1 else f"{count:,} entries hold other values"
