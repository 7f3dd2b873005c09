"""Files svgen writes and the caches it reads (svgen.core.safe_io): a write is whole or
nothing and follows no planted link, keeps the file's mode, writes through a symlinked
target and refuses a folder or FIFO in the way with one clear error; `tune --apply` keeps a
spec's line endings and byte order mark; a cache file that is truncated, empty, wrongly
shaped, a folder, a FIFO or a link to /dev/zero is a miss said in one line (never a
traceback or a hang), and a cache folder that cannot be made means running without one."""

from __future__ import annotations

import json
import os
import pathlib
import secrets

import pytest

from svgen.cli import main
from svgen.cli.files import write_all
from svgen.core import safe_io
from svgen.core.safe_io import read_json_cache, read_regular, write_atomically, write_json_cache
from svgen.estimate import measure
from svgen.chip import measured_tune
from svgen.estimate.paths import PathCosts
from svgen.spec.errors import SpecError

SPEC = """\
svgen: 1
name: fixed
geometry: {frames: 2, height: 8, width: 16}
attention: {heads: 1, head_dim: 128, dtype: float32}
mask: {band: {width: 1}}
tiling: {block_q: 128, block_kv: 128}
"""


def _listing(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ----------------------------------------------------------------------------- writes
def test_a_link_planted_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".tiny.py.tmp").symlink_to(victim)  # the name svgen used to write through
    names = iter(["planted", "free"])  # the first random name is taken by a link too
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(names))
    (out / ".tiny.py.planted.tmp").symlink_to(victim)
    assert write_all({out / "tiny.py": b"generated\n"}) == [out / "tiny.py"]
    assert victim.read_text() == "keep me"
    assert (out / "tiny.py").read_bytes() == b"generated\n"
    assert not (out / "tiny.py").is_symlink()
    assert _listing(out) == [".tiny.py.planted.tmp", ".tiny.py.tmp", "tiny.py"]


def test_the_target_keeps_its_mode_and_a_new_file_takes_the_umask(tmp_path):
    private = tmp_path / "private.yaml"
    private.write_text("old")
    private.chmod(0o600)
    write_atomically(private, b"new")
    assert private.read_bytes() == b"new" and private.stat().st_mode & 0o777 == 0o600
    umask = os.umask(0o022)
    try:
        write_atomically(tmp_path / "new.py", b"x")
    finally:
        os.umask(umask)
    assert (tmp_path / "new.py").stat().st_mode & 0o777 == 0o644
    assert _listing(tmp_path) == ["new.py", "private.yaml"]


def test_a_symlinked_target_is_written_through(tmp_path):
    real = tmp_path / "real" / "spec.yaml"
    real.parent.mkdir()
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "spec.yaml"
    link.symlink_to(real)
    assert write_atomically(link, b"new") == real
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert real.stat().st_mode & 0o777 == 0o640
    dangling = tmp_path / "dangling.py"
    dangling.symlink_to(tmp_path / "nowhere" / "x.py")
    with pytest.raises(SpecError, match="symbolic link to .* which is missing"):
        write_all({dangling: b"x"})


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_folder_or_fifo_at_the_target_is_one_clear_error(tmp_path, kind):
    target = tmp_path / "tiny.py"
    if kind == "folder":
        target.mkdir()
    else:
        os.mkfifo(target)
    with pytest.raises(SpecError) as caught:
        write_all({target: b"x"})
    words = "is a folder, not a file" if kind == "folder" else "not a regular file"
    assert str(caught.value).startswith(f"{target}: cannot write it: ") and words in str(
        caught.value
    )
    assert _listing(tmp_path) == ["tiny.py"]  # no temporary left


def test_check_reports_a_fifo_in_place_of_a_module_without_waiting(tmp_path, monkeypatch, capsys):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "fixed.yaml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "--quiet", "specs/fixed.yaml"]) == 0
    module = tmp_path / "generated" / "fixed.py"
    module.unlink()
    os.mkfifo(module)
    assert main(["compile", "--check", "specs/fixed.yaml"]) == 1
    assert "not a file svgen wrote" in capsys.readouterr().err
    assert main(["compile", "specs/fixed.yaml"]) == 2  # and compile refuses to replace it
    assert "not a file svgen generated" in capsys.readouterr().err


# ----------------------------------------------------------------------------- tune --apply
class _FakeTune:
    """svgen.estimate.tune.tune without its compiles: 256 x 256 tiles are the first choice."""

    def __call__(self, spec, **kwargs):
        from types import SimpleNamespace

        from svgen.estimate.tune import Candidate

        result = SimpleNamespace(choice=SimpleNamespace(candidate=Candidate(256, 256, 256, 256)))
        result.to_json = lambda: {}
        return result


@pytest.fixture
def fake_tune(monkeypatch):
    from svgen.estimate import tune

    monkeypatch.setattr(tune, "tune", _FakeTune())


def _apply(path) -> int:
    return main(["tune", str(path), "--apply", "--json"])


def test_tune_apply_keeps_mode_line_endings_and_byte_order_mark(tmp_path, fake_tune, capsys):
    spec = tmp_path / "fixed.yaml"
    spec.write_bytes(b"\xef\xbb\xbf" + SPEC.replace("\n", "\r\n").encode())
    spec.chmod(0o600)
    (tmp_path / ".fixed.yaml.tmp").mkdir()  # a folder at the old temporary name: no matter
    assert _apply(spec) == 0
    raw = spec.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") and raw.count(b"\r\n") == raw.count(b"\n") == 6
    assert b"tiling: {block_q: 256, block_kv: 256}\r\n" in raw
    assert spec.stat().st_mode & 0o777 == 0o600
    assert _listing(tmp_path) == [".fixed.yaml.tmp", "fixed.yaml"]


def test_tune_apply_writes_a_symlinked_spec_through(tmp_path, fake_tune, capsys):
    real = tmp_path / "real" / "fixed.yaml"
    real.parent.mkdir()
    real.write_text(SPEC)
    link = tmp_path / "fixed.yaml"
    link.symlink_to(real)
    assert _apply(link) == 0
    assert link.is_symlink() and "block_q: 256" in real.read_text()
    assert f"{link}: tiling " in capsys.readouterr().err


def test_tune_apply_on_a_fifo_is_refused(tmp_path, fake_tune, capsys, monkeypatch):
    from svgen.cli import tune as tune_cli

    spec = tmp_path / "fixed.yaml"
    spec.write_text(SPEC)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    monkeypatch.setattr(tune_cli, "load_spec", lambda path, chip=None: _load(spec, chip))
    assert _apply(fifo) == 2
    assert "not a regular file" in capsys.readouterr().err


def _load(path, chip):
    from svgen.spec import load_spec

    return load_spec(path, chip=chip)


# ----------------------------------------------------------------------------- reads
def test_reads_are_bounded_and_of_regular_files_only(tmp_path):
    (tmp_path / "small").write_bytes(b"12345")
    assert read_regular(tmp_path / "small", 5) == b"12345"
    with pytest.raises(OSError, match="over 4 bytes"):
        read_regular(tmp_path / "small", 4)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="not a regular file"):
        read_regular(tmp_path / "fifo", 100)  # opened non-blocking: no writer, no wait
    (tmp_path / "zero").symlink_to("/dev/zero")
    with pytest.raises(OSError, match="not a regular file"):
        read_regular(tmp_path / "zero", 100)
    with pytest.raises(OSError, match="symbolic link"):
        read_regular(tmp_path / "zero", 100, follow_symlinks=False)


def _bad_cache_files(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """A cache file of every kind that is not one svgen wrote."""
    files = {}
    for name, data in {
        "truncated": b'{"a": [1, 2',
        "empty": b"",
        "binary": b"\xff\xfe\x00",
        "list": b"[1, 2, 3]",
        "null": b"null",
        "deep": b"[" * 100_000 + b"]" * 100_000,
        "large": b" " * 300_001,
    }.items():
        files[name] = folder / f"{name}.json"
        files[name].write_bytes(data)
    files["folder"] = folder / "folder.json"
    files["folder"].mkdir()
    files["fifo"] = folder / "fifo.json"
    os.mkfifo(files["fifo"])
    files["zero"] = folder / "zero.json"
    files["zero"].symlink_to("/dev/zero")
    files["link"] = folder / "link.json"
    files["link"].symlink_to(files["truncated"].with_name("good.json"))
    (folder / "good.json").write_text("{}")
    return files


def test_a_bad_cache_file_is_a_miss_said_in_one_line(tmp_path, capsys):
    def parse(value):
        if not isinstance(value, dict):
            raise TypeError("an object")
        return value

    for name, path in _bad_cache_files(tmp_path).items():
        assert read_json_cache(path, parse, max_bytes=300_000) is None, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"ignoring the cache file {path}: " in err, name
    assert read_json_cache(tmp_path / "good.json", parse) == {}
    assert read_json_cache(tmp_path / "missing.json", parse) is None
    assert read_json_cache(tmp_path / "good.json" / "under_a_file.json", parse) is None
    assert capsys.readouterr().err == ""  # a miss is no news


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path, capsys):
    (tmp_path / "cost").write_text("a file where the folder goes")
    assert write_json_cache(tmp_path / "cost" / "key.json", {"a": 1}) is False
    assert "running without it" in capsys.readouterr().err
    (tmp_path / "key.json").mkdir()
    assert write_json_cache(tmp_path / "key.json", {"a": 1}) is False
    assert "is a folder" in capsys.readouterr().err
    assert write_json_cache(tmp_path / "new" / "key.json", {"a": 1}) is True
    assert json.loads((tmp_path / "new" / "key.json").read_text()) == {"a": 1}


# ----------------------------------------------------------------------------- the cost cache
COSTS = PathCosts(
    bookkeeping=10, full=50, mixed=(20,), block=(((5, 7, 9),),), init=(3,), finalize=4, pipeline=6
)


def _measured(calls: list):
    def measure_once():
        calls.append(1)
        return COSTS

    return measure_once


def test_the_cost_cache_rewrites_a_bad_entry(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SVGEN_CACHE_DIR", str(tmp_path))
    path = tmp_path / "cost" / "key.json"
    calls = []
    bad = {
        "truncated": '{"bookkeeping": 1',
        "list": "[]",
        "missing field": json.dumps({"bookkeeping": 1}),
        "text for a count": json.dumps({**COSTS.to_json(), "full": "50"}),
        "extra field": json.dumps({**COSTS.to_json(), "surprise": 1}),
    }
    for name, text in bad.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        assert measure._cached("key", True, _measured(calls), PathCosts.from_json) == COSTS
        assert "ignoring the cache file" in capsys.readouterr().err, name
        assert PathCosts.from_json(json.loads(path.read_text())) == COSTS  # rewritten
    assert len(calls) == len(bad)
    assert measure._cached("key", True, _measured(calls), PathCosts.from_json) == COSTS
    assert len(calls) == len(bad) and capsys.readouterr().err == ""  # a hit


@pytest.mark.parametrize("in_the_way", ["file", "folder", "fifo", "zero"])
def test_the_cost_cache_never_crashes_or_hangs(tmp_path, monkeypatch, capsys, in_the_way):
    monkeypatch.setenv("SVGEN_CACHE_DIR", str(tmp_path))
    if in_the_way == "file":  # the cache folder itself cannot be made
        (tmp_path / "cost").write_text("x")
    else:
        (tmp_path / "cost").mkdir()
        path = tmp_path / "cost" / "key.json"
        {"folder": path.mkdir, "fifo": lambda: os.mkfifo(path)}.get(
            in_the_way, lambda: path.symlink_to("/dev/zero")
        )()
    calls = []
    assert measure._cached("key", True, _measured(calls), PathCosts.from_json) == COSTS
    assert calls == [1]
    assert "running without it" in capsys.readouterr().err


# ----------------------------------------------------------------------------- --measure cache
def test_the_measured_cache_drops_what_it_did_not_write(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SVGEN_CACHE_DIR", str(tmp_path))
    path = measured_tune._cache_file()
    path.parent.mkdir(parents=True)
    good = {"ms": 1.5, "per_direction": {"forward": 1.5}, "error": None}
    for text in ("[]", "null", '{"a": ', "7"):
        path.write_text(text)
        assert measured_tune._load_cache() == {}
        assert "ignoring the cache file" in capsys.readouterr().err
    entries = {"good": good, "list": [], "text ms": {**good, "ms": "fast"}, "no dict": {"ms": 1}}
    path.write_text(json.dumps(entries))
    assert measured_tune._load_cache() == {"good": good}
    assert "ignoring 3 malformed entries" in capsys.readouterr().err
    measured_tune._store("new", good)
    assert json.loads(path.read_text()) == {"good": good, "new": good}  # rewritten clean
    path.unlink()
    path.mkdir()
    assert measured_tune._load_cache() == {}
    measured_tune._store("new", good)  # cannot be written: tuning runs on
    err = capsys.readouterr().err
    assert "is a folder" in err and "running without it" in err


def test_the_safe_io_module_is_the_ground_floor():
    """Importable from svgen.estimate, svgen.chip and svgen.cli alike: the standard library only."""
    source = pathlib.Path(safe_io.__file__).read_text()
    assert "import svgen" not in source and "from svgen" not in source
