"""Files svgen writes and reads on its own: written whole or not at all, without following
a link someone else placed, and read back without trusting them.

Writes (`write_atomically`): every file svgen writes (generated modules and tables, the
spec `tune --apply` rewrites, the caches) goes through a temporary file beside its target,
made with O_CREAT | O_EXCL | O_NOFOLLOW under a random name, so that nothing already at that
name (a symlink another user put in a shared output folder) is ever opened; the data is
fsync'd, then renamed onto the target. The target keeps its permission bits (a 0600 spec
stays 0600), and a symlinked target is written through to the file it points to (the
link stays a link). A folder, FIFO or device at the target is an OSError saying so.

Reads (`read_regular`, `read_json_cache`): regular files only, opened with O_NONBLOCK (a
FIFO never hangs), and bounded in size (a link to /dev/zero is refused, never read until
memory runs out). A cache is a convenience: `read_json_cache` treats a file that is not one
it wrote (truncated, empty, wrongly shaped, a folder) as a miss and says so in one line, and
`write_json_cache` runs on without a cache where its folder cannot be made.

Python's standard library only: generated code, the compiler, the command line and the
performance tools all stand on it.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import secrets
import stat
import sys
from typing import Callable, TypeVar

#: The most bytes a cache file may hold: the largest svgen writes is far below it.
MAX_CACHE_BYTES = 16 * 2**20

_T = TypeVar("_T")
_TEMPORARY_TRIES = 16


def write_atomically(path: str | os.PathLike, data: bytes) -> pathlib.Path:
    """Replace the file at `path` with `data`, whole, or leave it as it was; the path
    written (the link's target where `path` is a symlink). The target's folder must exist.
    OSError (its strerror says what is wrong) when the target is a folder or another
    non-regular file, a symlink to nothing, or cannot be written."""
    target = writable_target(pathlib.Path(path))
    mode = _mode_of(target)
    fd, temporary = _exclusive_temporary(target, 0o600 if mode is not None else 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    except BaseException:
        _remove(temporary)
        raise
    _sync_folder(target.parent)
    return target


def writable_target(path: pathlib.Path) -> pathlib.Path:
    """The file a write to `path` replaces: `path`, or the file its symlink points to
    (written through, so a symlinked spec changes where it lives). OSError when that is a
    folder or not a regular file, or when the link points to nothing."""
    target = pathlib.Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        info = os.stat(target)
    except FileNotFoundError:
        if target != path:
            raise _error(errno.ENOENT, f"{path} is a symbolic link to {target}, which is missing")
        return target
    if stat.S_ISDIR(info.st_mode):
        raise _error(errno.EISDIR, f"{target} is a folder, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise _error(errno.EINVAL, f"{target} is not a regular file (a FIFO, device or socket)")
    return target


def read_regular(path: str | os.PathLike, max_bytes: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them. OSError when it
    is missing, a folder, a FIFO, a device or a socket (never waited on: opened
    non-blocking), larger than `max_bytes`, or (unless `follow_symlinks`) a symlink."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise _error(errno.ELOOP, f"{path} is a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise _error(errno.EISDIR, f"{path} is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise _error(errno.EINVAL, f"{path} is not a regular file (a FIFO, device or socket)")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _error(errno.EFBIG, f"{path} is over {max_bytes:,} bytes")
    return data


def read_json_cache(
    path: str | os.PathLike,
    parse: Callable[[object], _T] = lambda value: value,
    max_bytes: int = MAX_CACHE_BYTES,
) -> _T | None:
    """What the cache file at `path` holds, through `parse` (which checks the JSON's shape
    and raises KeyError, TypeError, ValueError, IndexError or AttributeError where it is not
    what the cache writes); None for a miss. A missing file (or folder) is a miss; so is any other file
    (unreadable, not a regular file, a symlink, over `max_bytes`, not JSON, the wrong
    shape), with one line on stderr saying it is ignored (the next write replaces it)."""
    try:
        data = read_regular(path, max_bytes, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return _ignored(path, exc.strerror or str(exc))
    try:
        return parse(json.loads(data.decode("utf-8")))
    except UnicodeDecodeError:
        return _ignored(path, "not UTF-8 text")
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            return _ignored(path, f"not JSON ({exc.msg})")
        return _ignored(path, "not what svgen writes there")
    except (KeyError, TypeError, IndexError, AttributeError, RecursionError):
        return _ignored(path, "not what svgen writes there")


def write_json_cache(path: str | os.PathLike, value: object, indent: int | None = None) -> bool:
    """Store `value` as JSON at `path` (its folders made as needed); False, with one line on
    stderr, where that cannot be done (a file where a folder should be, no permission, a
    full disk): svgen then runs on without the cache."""
    path = pathlib.Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(value, indent=indent, sort_keys=True).encode())
    except OSError as exc:
        print(
            f"svgen: cannot write the cache file {path} ({exc.strerror or exc}); "
            "running without it",
            file=sys.stderr,
        )
        return False
    return True


def _ignored(path, why: str) -> None:
    print(f"svgen: ignoring the cache file {path}: {why}; it will be rewritten", file=sys.stderr)
    return None


def _mode_of(target: pathlib.Path) -> int | None:
    """The permission bits of the existing target (None: there is none yet, and the new file
    takes the usual 0666 less the umask)."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode) & 0o777
    except FileNotFoundError:
        return None


def _exclusive_temporary(target: pathlib.Path, mode: int) -> tuple[int, pathlib.Path]:
    """A new file beside `target` under a random name, opened for writing. O_EXCL and
    O_NOFOLLOW: whatever already is at that name (a symlink planted there) makes the open
    fail, and another name is tried; nothing is ever written through it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_TEMPORARY_TRIES):
        temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(temporary, flags, mode), temporary
        except FileExistsError:
            continue
    raise _error(errno.EEXIST, f"no free temporary name beside {target}")


def _sync_folder(folder: pathlib.Path) -> None:
    """Make the rename itself durable where the system allows it (best effort)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: pathlib.Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _error(code: int, message: str) -> OSError:
    """An OSError whose strerror is the whole message (callers print exc.strerror)."""
    return OSError(code, message)
