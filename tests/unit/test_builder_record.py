"""build-record.json read back as untrusted input: every malformed record is one UsageError line naming the file
and the field (never a traceback, never exit 70), through the reader and through `t4patch verify build DIR`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from t4patch import cli
from t4patch.builder.record import BuildRecord, parse_record, read_record
from t4patch.errors import UsageError


def record(tmp: Path, **changes: object) -> dict:
    doc = BuildRecord(t4patch="0.1.0", command="t4patch build llama.cpp", recipe="llama.cpp", recipe_sha256=None,
                      arch="75", cuda=True, features=[], with_tests=False, ptx_only=False, jobs=2, out=str(tmp),
                      build_dir=str(tmp / "build"), log=str(tmp / "build.log"), requested={}, env={}, flags={},
                      tools={}, host={}, started="2026-12-01T20:00:00+00:00", status="ok").to_dict()
    doc.update(changes)
    return doc


def test_a_written_record_reads_back_as_the_same_record(tmp_path):
    doc = record(tmp_path, extension={"cache_key": "k"}, source={"kind": "git", "commit": "abc"})
    back = parse_record(json.loads(json.dumps(doc)))
    assert back.to_dict() == doc and back.ok and back.extension == {"cache_key": "k"}


def test_an_older_record_without_the_later_keys_reads():
    doc = record(Path("/o"))
    for key in ("with_tests", "ptx_only", "features"):
        del doc[key]
    back = parse_record(doc)
    assert (back.with_tests, back.ptx_only, back.features) == (False, False, [])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{broken", "not JSON"),
        ("[1, 2]", "expected a JSON object, found an array"),
        ('{"recipe": "mistral.rs", "arch": "75"}', "expected kind 't4patch-build-record', found None"),
        ("REPLACE:schema=2", "expected schema 1, found 2"),
        ("REPLACE:arch=75", "'arch' is an integer, expected a string"),
        ("REPLACE:jobs=true", "'jobs' is a boolean, expected an integer"),
        ("REPLACE:status=done", "'status' is 'done', expected one of"),
        ("REPLACE:ptx_only=yes", "'ptx_only' is a string, expected a boolean"),
        ("DELETE:build_dir", "'build_dir' is missing"),
        ("REPLACE:features=[1]", "'features' must list strings"),
    ],
)
def test_malformed_records_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "build-record.json"
    if text.startswith("REPLACE:"):
        key, _, raw = text[len("REPLACE:"):].partition("=")
        value = json.loads(raw) if raw[:1] in "[0123456789tf" else raw
        text = json.dumps(record(tmp_path, **{key: value}))
    elif text.startswith("DELETE:"):
        doc = record(tmp_path)
        del doc[text[len("DELETE:"):]]
        text = json.dumps(doc)
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as info:
        read_record(path, hint="pass the files")
    assert str(path) in str(info.value) and "\n" not in str(info.value) and info.value.hint == "pass the files"


@pytest.mark.parametrize("text", ["[1]", '{"kind": "t4patch-build-record", "schema": 1, "recipe": {"a": 1}}',
                                  "null", '{"recipe": "../../etc/passwd", "kind": 3}'])
def test_verify_build_on_a_damaged_record_is_exit_2_and_leaves_it(tmp_path, capsys, text):
    (tmp_path / "build-record.json").write_text(text)
    assert cli.main(["verify", "build", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is not a t4patch build record" in err and "Traceback" not in err
    assert (tmp_path / "build-record.json").read_text() == text


def test_verify_build_on_a_record_naming_no_recipe_is_exit_2(tmp_path, capsys):
    (tmp_path / "build-record.json").write_text(json.dumps(record(tmp_path, recipe="../../x")))
    assert cli.main(["verify", "build", str(tmp_path)]) == 2
    assert "no build recipe named '../../x'" in capsys.readouterr().err
