"""Every command the documentation shows must still work with the CLI as it is.

The Markdown under docs/ (and the README) is scanned for shell commands: every line of ```bash / ```sh /
```shell / ```console blocks, the `run:` lines of ```yaml workflow blocks that call t4patch, pip or python,
lines that start with `t4patch` in untagged blocks, and inline code spans that start with `t4patch` or
`pip install`. Each t4patch command is parsed by the real argument parser (``t4patch.cli.build_parser``)
with abbreviations off, so an unknown or misspelt option fails here; a usage synopsis (``[--ref REF | ...]``)
must name only options the command has; an inline mention of a bare command (``t4patch verify marlin``) must
name a command that exists. Commands that need no GPU, network or engine (``--help``, ``--version``, ``list``,
``doctor``, ``validate`` of the shipped sets) are run. ``python -m t4patch.<module>`` (or ``tools.<module>``) must name an importable
module; ``pip install`` lines must not install t4patch from PyPI (it is not there) and must pin engine versions
that have a shipped patch set. Failures name the file and line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
YAML_LANGS = {"yaml", "yml"}
MIN_T4PATCH_COMMANDS = 80  # the docs show well over this many; fewer means the scanner went blind
ENGINE_PAGES = ("vllm", "sglang", "llama.cpp", "mistral.rs", "pytorch-int4", "litert-lm")

# Pages that still point at ../shared (outside the repository), with why they are tolerated for now. Each
# entry must really contain such a pointer, so a fixed page has to leave this list.
SHARED_POINTER_ALLOWED: dict[str, str] = {}


@dataclass
class Command:
    path: str  # relative to the repository
    line: int
    text: str  # the command as written (one simple command)
    kind: str  # "block" (a shell block), "plain" (untagged block) or "inline"
    argv: list[str] = field(default_factory=list)

    def where(self) -> str:
        return f"{self.path}:{self.line}: `{self.text}`"


def markdown_files() -> list[Path]:
    return sorted(DOCS.rglob("*.md")) + [REPO / "README.md"]


# --- extraction ---------------------------------------------------------------------------------------------

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w.+-]*)")
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def shell_snippets(path: Path) -> list[tuple[int, str, str]]:
    """(line, text, kind) for every shell command source in one Markdown file."""
    out: list[tuple[int, str, str]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    lang = ""
    pending: list[tuple[int, str]] = []  # continuation lines of a shell block
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence, lang = match.group(1)[0] * 3, match.group(2).lower()
                continue
            for span in INLINE.findall(line):
                out.append((number, span.replace("\\|", "|"), "inline"))
            continue
        if match and line.strip().startswith(fence) and not match.group(2):
            fence, pending = None, []
            continue
        text = line.strip()
        if lang == "console" or text.startswith("$ "):
            if not text.startswith("$ "):
                continue  # console output
            text = text[2:]
        if lang in YAML_LANGS:
            # a CI workflow: its `run:` shell lines that call t4patch, pip or python
            text = re.sub(r"^(-\s*)?run:\s*\|?\s*", "", text)
            if not (pending or re.match(r"(\S*/)?(t4patch|pip3?|python3?)\s", text)):
                continue
        if lang in SHELL_LANGS | YAML_LANGS:
            if pending or text.endswith("\\"):
                pending.append((number, text[:-1] if text.endswith("\\") else text))
                if text.endswith("\\"):
                    continue
                first = pending[0][0]
                text = " ".join(part for _, part in pending)
                pending = []
                out.append((first, text, "block"))
            else:
                out.append((number, text, "block"))
        elif lang == "" and re.match(r"(\S*/)?t4patch(\s|$)", text):
            out.append((number, text, "plain"))
        elif lang == "" and text.startswith("[") and out and out[-1][2] == "plain" and is_synopsis(out[-1][1]):
            out[-1] = (out[-1][0], f"{out[-1][1]} {text}", "plain")  # a synopsis wrapped onto the next line
    return out


def is_synopsis(text: str) -> bool:
    """A usage line (`t4patch build llama.cpp|mistral.rs [--ref REF | --source DIR]`), not a command."""
    return re.search(r"\s\[", text) is not None or re.search(r"\w\|\w", text) is not None


CONTROL = set(";&|()")
REDIRECT = set("<>")
SHELL_WORDS = {"do", "then", "else", "elif", "if", "while", "until", "!", "time", "exec", "sudo", "env", "{", "}"}


def simple_commands(text: str) -> list[list[str]]:
    """Split one shell line into simple commands (argv lists), dropping redirections and env assignments."""
    text = re.sub(r"\$\([^()]*\)", "1", text)  # $(nproc) and friends
    text = re.sub(r"\$\{(\w+)[^}]*\}|\$(\w+)", lambda m: m.group(1) or m.group(2), text)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: not a shell command (prose in backticks)
        return []
    commands: list[list[str]] = [[]]
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token and set(token) <= CONTROL:
            commands.append([])
            continue
        if token and set(token) <= REDIRECT | {"&"}:
            if commands[-1] and commands[-1][-1].isdigit():
                commands[-1].pop()  # the fd of 2>
            skip_next = True
            continue
        commands[-1].append(token)
    result = []
    for argv in commands:
        while argv and (argv[0] in SHELL_WORDS or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", argv[0])):
            argv = argv[1:]
        if argv:
            result.append(argv)
    return result


def is_python(word: str) -> bool:
    return re.fullmatch(r"python(3(\.\d+)?)?", os.path.basename(word)) is not None


def collect() -> tuple[list[Command], list[Command], list[Command], list[Command]]:
    """(t4patch commands, synopsis lines, `python -m t4patch.X` modules, pip commands)."""
    t4patch, synopses, modules, pips = [], [], [], []
    for path in markdown_files():
        rel = path.relative_to(REPO).as_posix()
        for line, text, kind in shell_snippets(path):
            if kind == "inline" and not re.match(
                r"((\S*/)?t4patch|python3? -m (t4patch|tools)|pip3? (install|download))(\s|$|\.)", text
            ):
                continue
            if kind != "block" and re.match(r"(\S*/)?t4patch\s", text) and is_synopsis(text):
                synopses.append(Command(rel, line, text, kind, text.split()[1:]))
                continue
            for argv in simple_commands(text):
                shown = shlex.join(argv)
                if os.path.basename(argv[0]) == "t4patch":
                    cmd = Command(rel, line, shown, kind, argv[1:])
                elif is_python(argv[0]) and len(argv) > 2 and argv[1] == "-m":
                    if argv[2] == "t4patch":
                        cmd = Command(rel, line, shown, kind, argv[3:])
                    elif argv[2].startswith(("t4patch.", "tools.")):
                        modules.append(Command(rel, line, shown, kind, [argv[2]]))
                        continue
                    elif argv[2] == "pip":
                        pips.append(Command(rel, line, shown, kind, argv[3:]))
                        continue
                    else:
                        continue
                elif re.fullmatch(r"pip3?", os.path.basename(argv[0])):
                    pips.append(Command(rel, line, shown, kind, argv[1:]))
                    continue
                else:
                    continue
                t4patch.append(cmd)
    return t4patch, synopses, modules, pips


# --- the parser ---------------------------------------------------------------------------------------------


def subparsers_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def strict(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Abbreviated options off everywhere: the docs must spell every option in full."""
    parser.allow_abbrev = False
    for sub in subparsers_of(parser).values():
        strict(sub)
    return parser


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    from t4patch.cli import build_parser

    return strict(build_parser())


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[bool, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            lines = err.getvalue().strip().splitlines()
            return exc.code in (0, None), lines[-1] if lines else ""
    return True, ""


def command_path(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The deepest subparser the leading words name, and those words."""
    node, used = parser, []
    for word in words:
        subs = subparsers_of(node)
        if word not in subs:
            break
        node, used = subs[word], used + [word]
    return node, used


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings}


# --- the tests ----------------------------------------------------------------------------------------------


def test_the_scanner_finds_the_documented_commands():
    commands, synopses, modules, pips = collect()
    per_file: dict[str, int] = {}
    for cmd in commands:
        per_file[cmd.path] = per_file.get(cmd.path, 0) + 1
    assert len(commands) >= MIN_T4PATCH_COMMANDS, f"only {len(commands)} t4patch commands found in the docs"
    for page in ENGINE_PAGES:
        rel = f"docs/engines/{page}.md"
        assert (REPO / rel).is_file(), f"{rel} is missing"
        assert per_file.get(rel, 0) >= 1, f"{rel} shows no t4patch command"
    assert per_file.get("docs/troubleshooting.md", 0) >= 15
    assert per_file.get("docs/index.md", 0) >= 3
    assert synopses, "the build.md usage synopsis was not found"
    assert pips, "no pip commands found"


def test_every_t4patch_command_parses(parser):
    commands, _, _, _ = collect()
    failures = []
    for cmd in commands:
        ok, why = parse(parser, cmd.argv)
        if ok:
            continue
        node, used = command_path(parser, cmd.argv)
        if cmd.kind == "inline" and used == cmd.argv and used:
            # a bare mention of a command ("`t4patch verify marlin` exits with ..."): the command must exist
            ok, why = parse(parser, used + ["--help"])
            if ok:
                continue
        failures.append(f"{cmd.where()}: {why or 'does not parse'}")
    assert not failures, "documented t4patch commands the CLI rejects:\n" + "\n".join(failures)


def test_every_synopsis_names_real_options(parser):
    _, synopses, _, _ = collect()
    failures = []
    for cmd in synopses:
        words = []
        for tok in cmd.argv:
            if tok.startswith(("-", "[")) or "|" in tok or tok.isupper():
                break
            words.append(tok)
        node, used = command_path(parser, words)
        if used != words:
            failures.append(f"{cmd.where()}: no command `t4patch {' '.join(words)}`")
            continue
        known = option_strings(node)
        for tok in cmd.argv:
            for option in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", tok):
                if option not in known:
                    failures.append(f"{cmd.where()}: `{option}` is not an option of `t4patch {' '.join(used)}`")
    assert not failures, "documented usage lines with unknown commands or options:\n" + "\n".join(failures)


RUNNABLE_SUBCOMMANDS = {"list", "doctor", "validate"}
TARGETED = {"--python", "--site-packages", "--wheel"}


def runnable(argv: list[str]) -> bool:
    if "--help" in argv or "-h" in argv or argv == ["--version"]:
        return True
    if not argv or argv[0] not in RUNNABLE_SUBCOMMANDS or TARGETED & set(argv):
        return False
    return all(tok.startswith("-") for tok in argv[1:])  # no DIR arguments for validate


def test_cheap_documented_commands_run(parser):
    commands, _, _, _ = collect()
    seen: dict[tuple[str, ...], Command] = {}
    for cmd in commands:
        if runnable(cmd.argv) and parse(parser, cmd.argv)[0]:  # a command that does not parse fails above
            seen.setdefault(tuple(cmd.argv), cmd)
    assert ("list",) in seen and ("doctor",) in seen and ("--help",) in seen, sorted(seen)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    failures = []
    for argv, cmd in sorted(seen.items()):
        proc = subprocess.run(
            [sys.executable, "-m", "t4patch", *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            failures.append(f"{cmd.where()}: exit {proc.returncode}: {' / '.join(tail)}")
    assert not failures, "documented commands that fail when run:\n" + "\n".join(failures)


def test_documented_python_modules_exist():
    _, _, modules, _ = collect()
    failures = []
    for cmd in modules:
        name = cmd.argv[0]
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            failures.append(f"{cmd.where()}: no module {name}")
    assert not failures, "documented `python -m` modules that do not exist:\n" + "\n".join(failures)


PIP_VALUE_OPTIONS = {
    "-r",
    "--requirement",
    "-c",
    "--constraint",
    "-t",
    "--target",
    "-d",
    "--dest",
    "-i",
    "--index-url",
    "--extra-index-url",
    "--python-version",
    "--platform",
    "--root",
    "--prefix",
    "--no-binary",
    "--only-binary",
    "--implementation",
    "--abi",
    "-f",
    "--find-links",
    "--progress-bar",
    "--report",
    "--cache-dir",
    "--src",
}
NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?(==([\w.+-]+))?")


def test_pip_lines_install_what_exists():
    _, _, _, pips = collect()
    failures = []
    for cmd in pips:
        if not cmd.argv or cmd.argv[0] not in ("install", "download"):
            continue
        args, skip = [], False
        for tok in cmd.argv[1:]:
            if skip:
                skip = False
                continue
            if tok in PIP_VALUE_OPTIONS:
                skip = True
                continue
            if tok.startswith("-"):
                continue
            args.append(tok)
        for req in args:
            if "/" in req or req.startswith((".", "~")) or req.endswith((".whl", ".tar.gz", ".zip")):
                continue  # a path: a checkout, a wheel, a directory
            match = NAME.match(req)
            if not match:
                continue
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            if name == "t4patch":
                failures.append(f"{cmd.where()}: t4patch is not on PyPI; install it from a checkout or a built wheel")
            version = match.group(4)
            if name in ("vllm", "sglang") and version and not (REPO / "patches" / name / version).is_dir():
                failures.append(f"{cmd.where()}: no shipped patch set for {name}=={version}")
    assert not failures, "documented pip commands that cannot work as shown:\n" + "\n".join(failures)


def test_docs_do_not_point_outside_the_repository():
    failures, allowed_seen = [], set()
    for path in sorted(DOCS.rglob("*.md")):
        rel = path.relative_to(REPO).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"(?<![\w.-])(\.\./)?shared/(seeds|research|notes|tools|hooks)\b", line):
                if rel in SHARED_POINTER_ALLOWED:
                    allowed_seen.add(rel)
                else:
                    failures.append(f"{rel}:{number}: points at shared/, which is not in the repository")
    assert not failures, "\n".join(failures)
    stale = set(SHARED_POINTER_ALLOWED) - allowed_seen
    assert not stale, f"no longer point at shared/, drop them from SHARED_POINTER_ALLOWED: {sorted(stale)}"


TURING_ERRORS = (
    "out of resource: shared memory, Required: 98304, Hardware limit: 65536",
    "Bfloat16 is only supported on GPUs with compute capability of at least 8.0",
    "FlashAttention only supports Ampere GPUs or newer",
    "Minimum capability: 80. Current capability: 75",
    "no kernel image is available for execution on the device",
    "dtype mismatch in matmul, lhs: F16, rhs: BF16",
    "Unresolved extern function '_Z13dequant_valueI13__nv_bfloat16ET_jS1_S1_'",
    "fattn.cu:110: fatal error",
    "PTX was compiled with an unsupported toolchain",
)


@pytest.mark.parametrize("message", TURING_ERRORS)
def test_troubleshooting_has_the_exact_error_text(message):
    text = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    assert message in text, f"docs/troubleshooting.md lost the exact text {message!r}"


def test_relative_links_in_docs_resolve():
    failures = []
    for path in sorted(DOCS.rglob("*.md")):
        rel = path.relative_to(REPO).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target) or target.startswith("#") or set(target) <= {"."}:
                    continue
                file_part = target.split("#", 1)[0]
                if file_part and not (path.parent / file_part).exists():
                    failures.append(f"{rel}:{number}: link to {target} does not resolve")
    assert not failures, "\n".join(failures)
