"""`t4patch list`: the patch sets shipped with this t4patch, their diffs, why each exists and what it tracks
upstream (DEP-3 style: the issue or PR it mirrors or replaces, whether it was forwarded), optional diffs."""

from __future__ import annotations

import argparse
from typing import Any

from t4patch.cli_options import add_json_option
from t4patch.output import emit_json, say
from t4patch.patching.manifest import Patch, PatchSet
from t4patch.patching.registry import all_patch_sets


def configure_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("list", help="list the shipped patch sets and their diffs")
    add_json_option(parser)
    parser.set_defaults(func=run)
    return parser


def _patch_json(p: Patch) -> dict[str, Any]:
    return {
        "file": p.file, "title": p.title, "fixes": p.fixes, "gpus": p.gpus,
        "references": list(p.references), "files": list(p.paths),
        "optional": p.optional,
        "upstream": p.upstream.to_json() if p.upstream else None,
    }


def _set_json(ps: PatchSet) -> dict[str, Any]:
    return {
        "distribution": ps.distribution,
        "version": ps.version,
        "summary": ps.summary,
        "draft": ps.draft,
        "requires": [{"spec": c.spec, "why": c.why, "library": c.library} for c in ps.requires],
        "patches": [_patch_json(p) for p in ps.all_patches],
        "optional": list(ps.option_names),
        "targets": [
            {"path": t.path, "pristine_sha256": t.pristine_sha256, "patched_sha256": t.patched_sha256,
             "optional": t in ps.optional_targets}
            for t in ps.targets + ps.optional_targets
        ],
    }


def _lines(ps: PatchSet) -> list[str]:
    files = len(ps.targets) + len(ps.optional_targets)
    head = f"{ps.spec}  ({len(ps.patches)} diff(s)"
    if ps.optional_patches:
        head += f" + {len(ps.optional_patches)} optional"
    head += f", {files} file(s)){' DRAFT (apply refuses it)' if ps.draft else ''}: {ps.summary}"
    out = [head]
    out.extend(f"  requires {c.spec} beside it" for c in ps.requires)
    for p in ps.all_patches:
        flag = f" [optional {p.optional!r}: off by default, not part of a plain apply]" if p.optional else ""
        out.append(f"  {p.file}{flag}: {p.title}")
        if p.upstream:
            out.append(f"    upstream: {p.upstream.link} ({p.upstream.relation}; forwarded: {p.upstream.forwarded})")
    return out


def run(args: argparse.Namespace) -> int:
    patch_sets = all_patch_sets()
    if args.json:
        emit_json("list", {"patch_sets": [_set_json(ps) for ps in patch_sets]})
        return 0
    for ps in patch_sets:
        for line in _lines(ps):
            say(line)
    return 0
