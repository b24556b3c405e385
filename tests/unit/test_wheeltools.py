"""t4patch.fileio.wheeltools: strict RECORD reading, the release checks, streamed hashing, the writer, the cache.

The command-level faults (the same exit code in validate, wheel and port, nothing written) are in
tests/fault/test_hostile_inputs.py; here each function is checked on its own.
"""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile
from pathlib import Path

import pytest

from t4patch.errors import UsageError
from t4patch.fileio import wheeltools
from t4patch.fileio.wheeltools import (
    Expected,
    Member,
    cached_release,
    copied,
    open_release,
    parse_wheel_record,
    record_hash,
    stored_bytes,
    write_wheel_file,
)

DIST = "demo-1.0.dist-info"


def make(path: Path, files: dict[str, bytes], *, name: str = "demo", version: str = "1.0") -> Path:
    dist = f"{name}-{version}.dist-info"
    files = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(), **files}
    rows = [f"{rel},{record_hash(hashlib.sha256(d).digest())},{len(d)}" for rel, d in files.items()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel, data in files.items():
            zf.writestr(rel, data)
        zf.writestr(f"{dist}/RECORD", "\n".join([*rows, f"{dist}/RECORD,,"]) + "\n")
    return path


def test_a_good_wheel_opens_with_every_member_checked(tmp_path: Path) -> None:
    wheel = make(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/a.py": b"a = 1\n"})
    with open_release(wheel, Expected("demo", "1.0")) as opened:
        assert opened.dist_info == DIST and opened.has("demo/a.py") and opened.read("demo/a.py") == b"a = 1\n"
        assert opened.record["demo/a.py"] == hashlib.sha256(b"a = 1\n").hexdigest()


@pytest.mark.parametrize("text, says", [
    ("demo/a.py,sha256=abc\n", "field"),
    ("demo/a.py,md5=abc,3\n", "no sha256"),
    ("demo/a.py,sha256=abc,3\n", "32 bytes"),
    (f"demo/a.py,{record_hash(bytes(32))},three\n", "size"),
    (f"demo/a.py,{record_hash(bytes(32))},3\ndemo/a.py,{record_hash(bytes(32))},3\n", "second time"),
    (f"demo/a.py,{record_hash(bytes(32))},3\n", "does not list"),
])
def test_record_is_read_strictly(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_wheel_record(text, f"{DIST}/RECORD")


def test_a_member_without_a_hash_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    meta = b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{DIST}/METADATA", meta)
        zf.writestr("demo/a.py", b"a")
        zf.writestr(f"{DIST}/RECORD", f"{DIST}/METADATA,{record_hash(hashlib.sha256(meta).digest())},{len(meta)}\n"
                    f"demo/a.py,,\n{DIST}/RECORD,,\n")
    with pytest.raises(UsageError, match="lists without a sha256"):
        open_release(wheel, Expected("demo", "1.0"))


def test_the_expected_release_is_checked_on_name_dist_info_and_metadata(tmp_path: Path) -> None:
    wheel = make(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/a.py": b"a"})
    with pytest.raises(UsageError, match="a wheel of demo 1.0"):
        open_release(wheel, Expected("demo", "2.0"))
    renamed = tmp_path / "demo-2.0-py3-none-any.whl"
    renamed.write_bytes(wheel.read_bytes())
    with pytest.raises(UsageError, match=r"metadata directory demo-1\.0\.dist-info/ in a file named demo-2\.0"):
        open_release(renamed, Expected("demo", "2.0"))


def test_hashing_reads_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of a large member asks for at most CHUNK bytes: memory is bounded by the chunk, not the member
    (RECORD and METADATA, a few KiB, are read whole)."""
    wheel = make(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/big.bin": bytes(3 * 2**20 + 5)})
    monkeypatch.setattr(wheeltools, "CHUNK", 64 * 1024)
    sizes: list[int] = []
    real_open = zipfile.ZipFile.open

    def spying_open(self: zipfile.ZipFile, *args: object, **kwargs: object) -> object:
        handle = real_open(self, *args, **kwargs)  # type: ignore[arg-type]
        real_read = handle.read
        big = handle.name == "demo/big.bin"

        def read(n: int = -1) -> bytes:
            if big:
                sizes.append(n)
            return real_read(n)

        handle.read = read  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(zipfile.ZipFile, "open", spying_open)
    with open_release(wheel, Expected("demo", "1.0")):
        pass
    assert sizes and all(0 < n <= 64 * 1024 for n in sizes), sorted(set(sizes))


def test_copied_members_are_streamed_and_kept_byte_for_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = make(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/big.bin": bytes(range(256)) * 8192})
    monkeypatch.setattr(wheeltools, "CHUNK", 4096)
    out = tmp_path / "out.whl"
    with zipfile.ZipFile(source) as zf, source.open("rb") as raw:
        members = [copied(raw, info) for info in zf.infolist()]
        assert all(m.data is None for m in members)  # nothing held in memory
        write_wheel_file(out, [*members, Member.new("demo/new.py", b"n = 1\n", like=None,
                                                    date_time=(2026, 1, 1, 0, 0, 0))])
    with zipfile.ZipFile(source) as a, zipfile.ZipFile(out) as b, source.open("rb") as ra, out.open("rb") as rb:
        for info in a.infolist():
            assert stored_bytes(rb, b.getinfo(info.filename)) == stored_bytes(ra, info)
        assert b.read("demo/new.py") == b"n = 1\n" and b.testzip() is None


def test_the_written_file_has_the_umask_mode_and_never_follows_a_link(tmp_path: Path) -> None:
    import os

    old = os.umask(0o022)
    try:
        write_wheel_file(tmp_path / "w.whl", [Member.new("a", b"a", like=None, date_time=(2026, 1, 1, 0, 0, 0))])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "w.whl").stat().st_mode) == 0o644
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".t4patch-tmp")]


def test_a_failed_check_leaves_nothing(tmp_path: Path) -> None:
    def refuse(_path: Path) -> None:
        raise RuntimeError("planted")

    with pytest.raises(RuntimeError):
        write_wheel_file(tmp_path / "w.whl", [Member.new("a", b"a", like=None, date_time=(2026, 1, 1, 0, 0, 0))],
                         refuse)
    assert list(tmp_path.iterdir()) == []


def test_the_cache_is_cache_dir_wheels_and_matches_by_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("T4PATCH_WHEEL_CACHE", str(tmp_path))
    make(tmp_path / "demo-1.0-py3-none-any.whl", {})
    (tmp_path / "demo-1.0.1-py3-none-any.whl").write_bytes(b"")
    assert cached_release("Demo", "1.0.0", tmp_path) == tmp_path / "demo-1.0-py3-none-any.whl"
    assert wheeltools.find_release("demo", "1.0") == tmp_path / "demo-1.0-py3-none-any.whl"


def test_stored_bytes_of_a_truncated_archive_is_one_line(tmp_path: Path) -> None:
    wheel = make(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/a.py": b"x" * 5000})
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo("demo/a.py")
    data = wheel.read_bytes()[: info.header_offset + 40]
    with pytest.raises(UsageError, match="truncated|damaged"):
        stored_bytes(io.BytesIO(data), info)
