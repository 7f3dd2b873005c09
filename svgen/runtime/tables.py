"""Loading step tables that a generated module keeps in a .npy file beside itself."""

from __future__ import annotations

import hashlib
import pathlib

import numpy as np


def load_runs(path: pathlib.Path, *, sha256: str) -> np.ndarray:
    """The (q_block, kv_start, length, kind) runs in `path`, checked against the module's hash."""
    data = pathlib.Path(path).read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise RuntimeError(
            f"{path} does not match the module that loads it (sha256 {actual}, expected "
            f"{sha256}); regenerate with `svgen compile`"
        )
    return np.load(path, allow_pickle=False)
