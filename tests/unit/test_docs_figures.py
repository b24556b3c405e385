"""The figures README and docs/ state about the shipped patch sets and the exit codes, checked against the tool
(issue 23.5): a doc that disagrees with the manifests or with t4patch.errors fails here, not in a user's hands.

- **Diff and file counts.** Every "N diffs" / "N patches" (N a number or a number word) in a paragraph (or list
  item) about one engine (the one whose ``ENGINE==`` specs it names, else the only one it names) is that engine's number of default diffs in every shipped set; an "N files" right after it is
  the default target count, "(N with the optional diff)" and "a Nth file" the count with the optional diffs'
  files. A paragraph quoting the article (it says "article") is the article's figure and is skipped, as is
  "those N diffs" (a reference, not a count); a count in a paragraph that names both engines is an error:
  write which set it is about.
- **Shipped releases.** README's "Shipped now" list names exactly the shipped vLLM and SGLang sets; the
  engine pages' "Applies to" paragraphs name every shipped release of their engine, and each SGLang release is
  paired with the vLLM release its manifest requires ([[requires]]).
- **Transcripts.** docs/maintaining.md's port of the 0.5.21 set to 0.5.20 counts that set's files and diffs.
- **Exit codes.** Every "exit N" / "exits N" is a code t4patch has (an exit_code in t4patch.errors, 0, the
  internal-error 70, the interrupted 130) or the shell's 127; a sentence about ``status --check`` that names a
  failing exit code names NotAppliedError's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from t4patch import errors
from t4patch.cli import INTERNAL_ERROR_EXIT
from t4patch.patching.registry import all_patch_sets

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "engines").glob("*.md"))]
ENGINES = {"vllm": re.compile(r"\bvllm\b", re.I), "sglang": re.compile(r"\bsglang\b", re.I)}
_NUMBERS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
            "sixteen")
_ORDINALS = ("zeroth first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
             "thirteenth fourteenth fifteenth sixteenth")
WORDS = {w: i for i, w in enumerate(_NUMBERS.split(" "))}
ORDINALS = {w: i for i, w in enumerate(_ORDINALS.split(" "))}
NUM = r"(\d+|" + "|".join(WORDS) + r")"
COUNT = re.compile(rf"(?<!those )(?<!these )\b{NUM} (?:default )?(?:diffs|patches)\b(?P<after>.{{0,60}})", re.I | re.S)


def number(text: str) -> int:
    return int(text) if text.isdigit() else WORDS[text.lower()]


def paragraphs(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # commands, not prose
    return [p for p in re.split(r"\n\s*\n|\n(?=- )|\n(?=\|)", text) if p.strip()]  # paragraphs, list items, table rows


def sets_of(engine: str):
    found = [ps for ps in all_patch_sets() if ps.distribution == engine]
    assert found, engine
    return found


def one(values: set[int], what: str) -> int:
    assert len(values) == 1, f"the shipped sets disagree on {what}: {values}; say which release in the docs"
    return values.pop()


def test_diff_and_file_counts_match_the_manifests() -> None:
    checked = 0
    for path in DOCS:
        for para in paragraphs(path):
            if "article" in para.lower():
                continue  # the article's rig, not t4patch's sets
            for match in COUNT.finditer(para):
                specs = {m.lower() for m in re.findall(r"`(vllm|sglang)==", para, re.I)}
                engines = sorted(specs) if len(specs) == 1 else [e for e, rx in ENGINES.items() if rx.search(para)]
                where = f"{path.relative_to(ROOT)}: {match.group(0)[:70]!r}"
                if len(engines) != 1 and path.parent.name == "engines" and path.stem in ENGINES:
                    engines = [path.stem]  # an engine page's counts are about its engine
                assert len(engines) == 1, f"{where}: the paragraph names {engines or 'no engine'}; say which set"
                sets = sets_of(engines[0])
                assert number(match.group(1)) == one({len(ps.patches) for ps in sets}, "diff counts"), where
                after = match.group("after")
                files = re.match(rf"(?:,| on) {NUM} files", after, re.I)
                if files:
                    assert number(files.group(1)) == one({len(ps.targets) for ps in sets}, "file counts"), where
                with_optional = {len(ps.targets) + len(ps.optional_targets) for ps in sets}
                for extra in re.finditer(rf"\({NUM}\s+with\s+the\s+optional\s+diff", para, re.I):
                    assert number(extra.group(1)) == one(set(with_optional), "file counts"), where
                for ordinal in re.finditer(r"\ba (\w+) file\b", para):
                    if ordinal.group(1).lower() in ORDINALS:
                        assert ORDINALS[ordinal.group(1).lower()] == one(set(with_optional), "file counts"), where
                checked += 1
    assert checked >= 6  # README (both engines), sglang.md, vllm.md, index.md, maintaining.md at least


def test_maintaining_port_transcript_counts_the_set_it_ports() -> None:
    """docs/maintaining.md's 0.5.20 transcript ports the 0.5.21 set: its file counts are that set's."""
    text = (ROOT / "docs" / "maintaining.md").read_text(encoding="utf-8")
    block = text[text.index("$ t4patch port sglang==0.5.20\n"):]
    block = block[: block.index("```")]
    ps = next(p for p in sets_of("sglang") if p.version == "0.5.21")
    missing = re.search(r"MISSING in NEW: (.*)", block)
    gone = len(missing.group(1).split(", ")) if missing else 0  # files the older release does not have
    files = len(ps.targets) + len(ps.optional_targets) - gone
    assert f": {files} target file(s) = RECORD" in block
    assert f"{files} file(s) pristine = RECORD" in block and f"; {files} compiled" in block
    assert len(re.findall(r"^  \d{4}-\S+\.diff -> ", block, re.M)) == len(ps.patches) + len(ps.optional_patches)


def _section(text: str, start: str) -> str:
    tail = text[text.index(start):]
    end = re.search(r"\n\n[A-Z]", tail[len(start):])
    return tail[: len(start) + end.start()] if end else tail


def test_readme_shipped_list_is_the_shipped_sets() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"`((?:vllm|sglang)==[\d.]+)`", _section(text, "Shipped now:")))
    shipped = {ps.spec for e in ENGINES for ps in sets_of(e)}
    assert listed == shipped


@pytest.mark.parametrize("engine", list(ENGINES))
def test_engine_pages_name_every_shipped_release_and_its_companion(engine: str) -> None:
    text = (ROOT / "docs" / "engines" / f"{engine}.md").read_text(encoding="utf-8")
    applies = _section(text, "**Applies to:**")
    shipped = {ps.version for ps in sets_of(engine)}
    named = set(re.findall(r"\b(\d+\.\d+\.\d+)\b", applies))
    assert shipped <= named, f"docs/engines/{engine}.md 'Applies to' misses {sorted(shipped - named)}"
    for ps in sets_of(engine):
        for companion in ps.requires:
            # "SGLang 0.5.21 (with vLLM 0.32.0" or "SGLang 0.5.23 with vLLM 0.33.0"
            pair = re.search(rf"\b{re.escape(ps.version)}\W+(?:\(?with )?vLLM ([\d.]+)", applies)
            assert pair, f"{ps.spec}: 'Applies to' does not say which vLLM goes beside it"
            assert pair.group(1) == companion.version, f"{ps.spec} requires {companion.spec}, the page says {pair.group(1)}"


def _codes() -> set[int]:
    found: set[int] = set()
    todo = [errors.T4PatchError]
    while todo:
        cls = todo.pop()
        found.add(cls.exit_code)
        todo.extend(cls.__subclasses__())
    return found | set(errors.EXIT_CODES.values())


def test_every_exit_code_in_the_docs_is_one_t4patch_has() -> None:
    known = _codes() | {0, INTERNAL_ERROR_EXIT, 130, 127}
    seen = 0
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"\bexit(?:s| code| status)? (\d+)\b", text):
            seen += 1
            assert int(match.group(1)) in known, f"{path.relative_to(ROOT)}: {match.group(0)!r} is no exit code"
        for sentence in re.split(r"(?<=[.;])\s", text):
            if "status --check" in sentence:
                for code in re.findall(r"\bexits? (\d+)\b", sentence):
                    assert int(code) in (0, errors.NotAppliedError.exit_code), (
                        f"{path.relative_to(ROOT)}: {sentence[:90]!r}: status --check fails with "
                        f"{errors.NotAppliedError.exit_code}")
    assert seen > 20


def test_the_checker_can_fail() -> None:
    """The count check on a wrong sentence, the way it reads a doc."""
    para = "The SGLang set `sglang==0.5.23` (four diffs, ten files) fixes it."
    match = COUNT.search(para)
    assert match and number(match.group(1)) != len(sets_of("sglang")[0].patches)
