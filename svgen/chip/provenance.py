"""Where a measurement ran: the versions it depends on besides the kernel, the checkout's
commit and a digest of svgen's own source (every JSON of `svgen bench` and the bench scripts
records them; `svgen report` reads them back)."""

from __future__ import annotations

import hashlib
import pathlib


def versions() -> dict:
    """What a measurement depends on besides the kernel: jax, jaxlib, libtpu, the device."""
    from importlib.metadata import PackageNotFoundError, version

    import jax

    out = {"jax": jax.__version__}
    for package in ("jaxlib", "libtpu", "libtpu-nightly"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    device = jax.devices()[0]
    out["device_kind"] = device.device_kind
    out["platform"] = device.platform
    return out


def commit() -> str | None:
    """The svgen checkout's commit (with '+' when the tree has changes), or None."""
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        run = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return run.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "")


def source_digest(root: pathlib.Path | None = None) -> str:
    """sha256 (first 16 hex digits) of svgen's own source: its Python modules and templates.
    It names the code that ran where `commit` cannot: a copy of the tree whose git metadata
    is stale or absent (a TPU host sent the working tree, say) reports an older commit."""
    root = root or pathlib.Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    files = sorted([*root.glob("svgen/**/*.py"), *root.glob("templates/**/*")])
    for path in files:
        if path.is_file():
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
