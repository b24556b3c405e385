"""One Arch type from the GPU table, one parser for user input, used by every command that takes --arch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from t4patch.cuda.arch import arch_for_capability, load_archs, parse_arch, parse_build_target
from t4patch.errors import DataFileError, UsageError

KNOWN = "sm_70, sm_75, sm_80, sm_86, sm_89, sm_90"


@pytest.mark.parametrize("text", ["75", "sm_75", "sm75", "7.5", "compute_75", " SM_75 "])
def test_every_spelling_names_the_table_entry(text: str) -> None:
    arch = parse_arch(text)
    assert arch is load_archs()["sm_75"] or arch == load_archs()["sm_75"]
    assert (arch.name, arch.capability, arch.digits, arch.dotted, arch.pair, arch.sass, arch.ptx) == (
        "sm_75", 75, "75", "7.5", (7, 5), "sm_75", "compute_75")
    assert arch.shared_limit == 65536 and "T4" in arch.gpus
    assert parse_build_target(text) == arch


@pytest.mark.parametrize("text", ["61", "sm_61", "120", "turing", "7", "7.5.1", "", "sm75x", "cpu"])
def test_unknown_input_is_one_line_listing_the_known_archs(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_arch(text)
    message = str(info.value)
    assert info.value.exit_code == 2 and "\n" not in message
    assert f"expected one of {KNOWN} (also written 75 or 7.5)" in message and "or cpu" not in message


def test_cpu_only_where_a_cpu_build_is_allowed() -> None:
    assert parse_build_target("cpu") is None and parse_build_target(" CPU ") is None
    with pytest.raises(UsageError, match=f"expected one of {KNOWN} or cpu"):
        parse_build_target("sm_61")


def test_capability_lookup() -> None:
    assert arch_for_capability(7, 5) == parse_arch("75")
    assert arch_for_capability(6, 1) is None


def test_the_same_error_from_every_command(cli) -> None:  # type: ignore[no-untyped-def]
    """build, verify build and verify attention read --arch through the one parser."""
    errors = []
    for argv in (["build", "llama.cpp", "--arch", "sm_61", "--dry-run"],
                 ["verify", "build", ".", "--arch", "sm_61"],
                 ["verify", "attention", "--arch", "sm_61"]):
        result = cli(*argv)
        assert result.code == 2, (argv, result.err)
        errors.append(next(line for line in result.err.splitlines() if "sm_61" in line))
    assert all(f"expected one of {KNOWN}" in e for e in errors), errors


ARCH_OK = """\
schema = 1
[arch.sm_75]
capability = [7, 5]
warp_size = 32
shared_memory_per_block_optin = 65536
gpus = "T4"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "archs.toml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("text, problem", [
    (ARCH_OK + "shared_memory = 1\n", "arch.sm_75.shared_memory: unknown key"),
    (ARCH_OK + "[extra]\n", "extra: unknown key"),
    (ARCH_OK.replace("warp_size = 32\n", ""), "arch.sm_75.warp_size: missing required key"),
    (ARCH_OK.replace('"T4"', "4"), "arch.sm_75.gpus: expected a non-empty string"),
    (ARCH_OK.replace("65536", "1024"), "expected an integer >= 49152"),
    (ARCH_OK.replace("[7, 5]", '["7", "5"]'), "arch.sm_75.capability[1]: expected an integer"),
])
def test_the_gpu_table_is_read_strictly(tmp_path: Path, text: str, problem: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(DataFileError) as info:
        load_archs(path)
    assert problem in str(info.value) and str(path) in str(info.value)
    assert info.value.exit_code == 16


def test_a_table_entry_is_all_it_takes_for_a_new_arch(tmp_path: Path) -> None:
    path = _write(tmp_path, ARCH_OK + ARCH_OK.split("\n", 1)[1].replace("sm_75", "sm_12").replace("[7, 5]", "[1, 2]"))
    archs = load_archs(path)
    assert parse_arch("1.2", archs=archs).name == "sm_12"
    assert set(archs) == {"sm_75", "sm_12"}
