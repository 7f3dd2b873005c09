"""What a spec names from outside is read as data and reported without surprises: every
broken .npz gets the `blocks` error (an encrypted member, an unknown compression method, a
corrupt deflate stream) and no error quotes a file's bytes; YAML tags are refused where the
spec is read; a data mask given by an absolute path leaves no absolute path in the module;
and the table of a data mask file that changed does not linger beside its module."""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest

from svgen import ir
from svgen.cli import main
from svgen.spec import parse_spec
from svgen.spec import block_data
from svgen.spec.errors import SpecError

SPEC = """\
svgen: 1
name: tiny
geometry: {{frames: 4, height: 8, width: 16}}
attention: {{heads: 1, head_dim: 128, dtype: float32}}
mask: {{blocks: {{file: {file}, block: 64}}}}
tiling: {{block_q: 128, block_kv: 128}}
"""
_N = 512 // 64


def _lower(spec_file) -> None:
    block_data._load.cache_clear()
    ir.lower(parse_spec(spec_file.read_text(), source=str(spec_file)))


def _blocks_error(tmp_path, file: str) -> str:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(file=file))
    with pytest.raises(SpecError) as caught:
        _lower(spec)
    message = str(caught.value)
    assert message.startswith(f"{spec}:5:8: mask.blocks: cannot read {file} as "), message
    return message


def _npz(compression=zipfile.ZIP_STORED) -> bytearray:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        with archive.open("mask.npy", "w") as member:
            np.save(member, np.eye(_N, dtype=np.uint8))
    return bytearray(buffer.getvalue())


def _patched(raw: bytearray, *, flags: int = 0, method: int | None = None) -> bytes:
    """The archive with its one member's flag bits set and its compression method changed,
    in the local header and in the central directory alike."""
    for header, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = raw.find(header)
        old_flags, old_method = struct.unpack_from("<HH", raw, start + at)
        new_method = old_method if method is None else method
        struct.pack_into("<HH", raw, start + at, old_flags | flags, new_method)
    return bytes(raw)


def _corrupt_deflate() -> bytes:
    raw = _npz(zipfile.ZIP_DEFLATED)
    name_length, extra_length = struct.unpack_from("<HH", raw, 26)
    data = 30 + name_length + extra_length
    raw[data : data + 8] = b"\xff" * 8
    return bytes(raw)


@pytest.mark.parametrize(
    "case,words",
    [
        ("encrypted", "a member is encrypted"),
        ("method_99", "compressed with a method zipfile cannot read"),
        ("method_77", "compressed with a method zipfile cannot read"),
        ("corrupt_deflate", "damaged"),
        ("truncated", "not a zip archive"),
        ("text", "not a zip archive"),
    ],
)
def test_every_broken_npz_gets_the_blocks_error(tmp_path, case, words):
    data = {
        "encrypted": lambda: _patched(_npz(), flags=0x1),
        "method_99": lambda: _patched(_npz(), method=99),
        "method_77": lambda: _patched(_npz(), method=77),
        "corrupt_deflate": _corrupt_deflate,
        "truncated": lambda: bytes(_npz()[:60]),
        "text": lambda: b"root:x:0:0:root:/root:/bin/bash\n",
    }[case]()
    (tmp_path / "mask.npz").write_bytes(data)
    message = _blocks_error(tmp_path, "mask.npz")
    assert words in message and "root:x" not in message


def test_errors_never_quote_a_files_bytes(tmp_path):
    for name in ("passwd.npy", "header.npy"):
        secret = b"root:x:0:0:root:/root:/bin/bash\n"
        if name == "header.npy":  # a plausible magic, then someone else's bytes
            secret = b"\x93NUMPY\x01\x00" + secret
        (tmp_path / name).write_bytes(secret)
        message = _blocks_error(tmp_path, name)
        assert "root:x" not in message and "/bin/bash" not in message, message


def test_npz_member_names_in_messages_are_escaped(tmp_path):
    bits = np.eye(_N, dtype=np.uint8)
    np.savez(tmp_path / "two.npz", **{"a\x1b[31mred": bits, "b": bits})
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(file="two.npz"))
    with pytest.raises(SpecError) as caught:
        _lower(spec)
    assert "\x1b" not in str(caught.value) and '"a\\x1b[31mred", b' in str(caught.value)


@pytest.mark.parametrize(
    "value,tag,at",
    [
        ("tiling: !custom {block_q: 128, block_kv: 128}", "'!custom'", "6:9: tiling"),
        ("tiling: {block_q: !!int 128, block_kv: 128}", "'!!int'", "6:19: tiling.block_q"),
        ("tiling: !!python/object:os.system {}", "'!!python/object:os.system'", "6:9: tiling"),
    ],
)
def test_yaml_tags_are_refused_where_the_spec_is_read(value, tag, at):
    text = SPEC.format(file="x.npy").replace("tiling: {block_q: 128, block_kv: 128}", value)
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="s.yaml")
    assert str(caught.value) == (
        f"s.yaml:{at}: YAML tags are not part of a spec (it is plain data): remove {tag}"
    )


def test_an_absolute_data_path_leaves_only_its_name_in_the_module(tmp_path, monkeypatch):
    data = tmp_path / "data" / "bits.npy"
    data.parent.mkdir()
    np.save(data, np.eye(_N, dtype=np.uint8))
    (tmp_path / "tiny.yaml").write_text(SPEC.format(file=str(data)))
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "--quiet", "tiny.yaml"]) == 0
    module = (tmp_path / "generated" / "tiny.py").read_text()
    assert str(tmp_path) not in module and "Data: bits.npy: sha256" in module


def test_the_table_of_a_changed_data_mask_does_not_linger(tmp_path, monkeypatch, capsys):
    data = tmp_path / "bits.npy"
    np.save(data, np.eye(_N, dtype=np.uint8))
    (tmp_path / "tiny.yaml").write_text(SPEC.format(file="bits.npy"))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "generated"
    assert main(["compile", "--quiet", "tiny.yaml"]) == 0
    (first,) = out.glob("tiny_blocks_*.npy")
    (out / "tiny_notes.npy").write_bytes(b"the user's own file")  # not svgen's: left alone
    np.save(data, np.ones((_N, _N), np.uint8))
    block_data._load.cache_clear()
    assert main(["compile", "tiny.yaml"]) == 0
    removed = f"removed generated/{first.name} (no module loads it any more)"
    assert removed in capsys.readouterr().err
    (second,) = out.glob("tiny_blocks_*.npy")
    assert second != first and (out / "tiny_notes.npy").exists()
    assert main(["compile", "--check", "tiny.yaml"]) == 0
    # A table left by an older svgen: --check reports it, compile removes it.
    first.write_bytes(second.read_bytes())
    capsys.readouterr()
    assert main(["compile", "--check", "tiny.yaml"]) == 1
    stale = f"generated/{first.name}: stale (no module loads it any more"
    assert stale in capsys.readouterr().err
    assert main(["compile", "--quiet", "tiny.yaml"]) == 0
    assert not first.exists() and second.exists()
    assert main(["compile", "--check", "--quiet", "tiny.yaml"]) == 0
