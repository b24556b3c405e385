"""Every shipped patch set (every engine, every release), proven on the real released wheel of its engine.

The wheel is downloaded once (``pip download --no-deps``, cached) and its Python files and metadata are
extracted once into the cache (``tests.helpers.extracted_wheel``; a vLLM wheel is ~330 MB, its ``.py`` files a
few MB), each checked against the wheel's RECORD; each test gets a hard-linked copy as its site-packages.
Proof: apply works on the pristine files, status says patched and the files hash to the manifest, re-apply
is a no-op, the patched modules byte-compile, revert gives back every RECORD sha256, and ``validate --wheel``
proves the set against the wheel itself (pristine = RECORD, exact apply, patched hash, exact revert).
"""

from __future__ import annotations

import json
import py_compile
from pathlib import Path

import pytest

from t4patch.environment.target import resolve_target
from t4patch.fileio.hashing import sha256_file
from t4patch.patching.registry import all_patch_sets
from tests.helpers import (
    companions_standin,
    extracted_wheel,
    install_wheel_to,
    site_from_extracted,
    wheel_path,
)

pytestmark = pytest.mark.integration

PATCH_SETS = all_patch_sets()


def record_mismatches(site: Path, spec_name: str) -> list[str]:
    dist = resolve_target(site_packages=str(site)).find(spec_name)
    assert dist is not None
    bad = []
    for rel, digest in dist.record().items():
        if digest is None or rel.startswith("../") or not (site / rel).exists():
            continue  # RECORD itself, console scripts outside site-packages, files not extracted (.so)
        if sha256_file(site / rel) != digest:
            bad.append(rel)
    return bad


def test_every_engine_ships_its_three_latest_releases():
    by_engine: dict[str, list[str]] = {}
    for ps in PATCH_SETS:
        by_engine.setdefault(ps.distribution, []).append(ps.version)
    # Triton: the two releases the shipped engine sets run on (3.7.1 under torch 2.13, 3.8.0 under torch 2.14)
    assert by_engine == {"sglang": ["0.5.21", "0.5.22", "0.5.23"], "triton": ["3.7.1", "3.8.0"],
                         "vllm": ["0.31.0", "0.32.0", "0.33.0"]}


@pytest.fixture(scope="module", params=PATCH_SETS, ids=[ps.spec for ps in PATCH_SETS])
def installed(request, tmp_path_factory):
    ps = request.param
    tree = extracted_wheel(wheel_path(ps.distribution, ps.version))
    site = site_from_extracted(tree, tmp_path_factory.mktemp(ps.distribution) / "site",
                               [t.path for t in ps.targets + ps.optional_targets])
    return ps, companions_standin(site, ps)  # status --check requires the set's companions


def test_apply_status_reapply_revert_on_real_wheel(installed, cli, tmp_path, monkeypatch):
    ps, site = installed
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    target = ["--site-packages", str(site)]
    assert record_mismatches(site, ps.distribution) == [], "the fresh install must match its RECORD"

    before = json.loads(cli("status", ps.distribution, "--json", *target).out)["engines"][0]
    assert before["state"] == "not-applied" and before["installed_version"] == ps.version

    dry = cli("apply", ps.spec, "--dry-run", *target)
    assert dry.code == 0 and dry.out.count("+++ b/") == len(ps.targets)
    assert record_mismatches(site, ps.distribution) == []

    applied = cli("apply", ps.spec, *target)
    assert applied.code == 0, applied.err
    after = json.loads(cli("status", ps.distribution, "--json", "--check", *target).out)["engines"][0]
    assert after["state"] == "applied"
    for target_file in ps.targets:
        assert sha256_file(site / target_file.path) == target_file.patched_sha256
        py_compile.compile(str(site / target_file.path), cfile=str(tmp_path / "out.pyc"), doraise=True)
    assert sorted(record_mismatches(site, ps.distribution)) == sorted(t.path for t in ps.targets)
    assert all(sha256_file(site / t.path) == t.pristine_sha256 for t in ps.optional_targets), "optional: off"

    again = cli("apply", ps.distribution, *target)
    assert again.code == 0 and "already applied" in again.out

    reverted = cli("revert", ps.distribution, *target)
    assert reverted.code == 0, reverted.err
    assert record_mismatches(site, ps.distribution) == [], "revert must give back every RECORD sha256"
    assert cli("status", ps.distribution, "--check", *target).code == 9


def test_optional_diffs_are_proven_on_the_wheel_too(installed):
    ps, _ = installed
    if not ps.option_names:
        pytest.skip(f"{ps.spec} has no optional diffs")
    from t4patch.patching.wheelproof import prove_against_wheel

    everything = ps.with_options(ps.option_names)
    proofs = prove_against_wheel(everything, wheel_path(ps.distribution, ps.version))
    assert {p.path for p in proofs} == {t.path for t in ps.targets + ps.optional_targets}
    for target in ps.optional_targets:
        assert any(p.path == target.path and p.patched_sha256 == target.patched_sha256 for p in proofs)


def test_validate_against_the_wheel(installed, cli):
    ps, _ = installed
    result = cli("validate", str(ps.directory), "--wheel", str(wheel_path(ps.distribution, ps.version)))
    assert result.code == 0, result.err
    assert result.out.count("reverts exactly") == len(ps.targets)


def test_doctor_finds_sm75_marlin_in_the_real_vllm_library(tmp_path, cli, monkeypatch):
    """SGLang with vLLM beside it: doctor reads vLLM's compiled library and finds sm_75 Marlin kernels."""
    monkeypatch.delenv("T4PATCH_PATCHES", raising=False)
    site = install_wheel_to(tmp_path / "site", wheel_path("sglang", "0.5.23"))
    install_wheel_to(site, wheel_path("vllm", "0.33.0"))
    doc = json.loads(cli("doctor", "--json", "--site-packages", str(site)).out)
    sglang = doc["sglang"]
    assert sglang["vllm_version"] == "0.33.0"
    # 322 Marlin GEMM and 8 repack kernels with sm_75 SASS in vllm 0.33.0 (counted 2026-11-29); needs zstd
    assert sglang["sm75_marlin_kernels"] == 322 and sglang["sm75_repack_kernels"] == 8, doc["advice"]
