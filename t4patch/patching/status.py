"""What state each engine's patch set is in, decided by sha256: the model `status`, `doctor` and `verify` share.

Per file: pristine, patched, foreign (neither hash) or missing. Per engine: applied, not-applied, partial,
foreign, not-installed or no-patch-set. The hashes decide; the state record only adds who applied it and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from t4patch.environment.target import InstalledDistribution, TargetEnvironment
from t4patch.errors import T4PatchError
from t4patch.patching.plan import FileStatus, file_statuses
from t4patch.patching.registry import find_patch_set
from t4patch.patching.selection import find_installed, other_installs
from t4patch.patching.state import read_record


@dataclass(frozen=True)
class EngineStatus:
    name: str
    installed: InstalledDistribution | None
    patch_set: str | None
    overall: str  # applied | not-applied | partial | foreign | not-installed | no-patch-set
    files: tuple[FileStatus, ...]
    detail: str

    def to_json(self) -> dict[str, Any]:
        record = read_record(self.installed) if self.installed and self.overall != "not-installed" else None
        return {
            "engine": self.name,
            "installed_version": self.installed.version if self.installed else None,
            "site_packages": str(self.installed.root) if self.installed else None,
            "patch_set": self.patch_set,
            "state": self.overall,
            "detail": self.detail,
            "files": [
                {"path": f.target.path, "state": f.state, "sha256": f.sha256,
                 "pristine_sha256": f.target.pristine_sha256, "patched_sha256": f.target.patched_sha256}
                for f in self.files
            ],
            "record": record.raw if record else None,
        }


def summarise(files: tuple[FileStatus, ...]) -> str:
    states = {f.state for f in files}
    if states == {"patched"}:
        return "applied"
    if states == {"pristine"}:
        return "not-applied"
    if states & {"foreign", "missing"}:
        return "foreign"
    return "partial"


def engine_status(name: str, target: TargetEnvironment) -> EngineStatus:
    dist = find_installed(target, name)
    if dist is None:
        return EngineStatus(name, None, None, "not-installed", (), f"not installed in {target.description}")
    others = other_installs(dist)
    if others:
        return EngineStatus(
            name, dist, None, "foreign", (),
            f"installed more than once in {dist.root} ({', '.join(p.name for p in [dist.dist_info, *others])}): "
            f"remove the stale one or reinstall with {dist.reinstall_command()}",
        )
    try:
        patch_set = find_patch_set(name, dist.version)
    except T4PatchError as exc:
        return EngineStatus(name, dist, None, "no-patch-set", (), exc.message)
    files = file_statuses(patch_set, dist)
    overall = summarise(files)
    detail = {
        "applied": "every file matches its patched sha256",
        "not-applied": "every file matches its pristine (released) sha256",
        "partial": "some files patched, some pristine: run t4patch apply again to finish",
        "foreign": f"a file matches neither hash: reinstall with {dist.reinstall_command()}",
    }[overall]
    return EngineStatus(name, dist, patch_set.spec, overall, files, detail)
