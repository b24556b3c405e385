"""The documented SGLang serve command follows what a T4 needs (issue 23.6b), checked against the real wheels.

SGLang 0.5.21-0.5.23 sample through FlashInfer whenever FlashInfer is importable (the default of
``--sampling-backend``, arg_groups/overrides.py ``_sampling_backend_default``), and FlashInfer's sm_75 support is
reported broken (flashinfer#3620); ``pytorch`` is one of the built-in choices (arg_groups/choices.py). So the
serve command in docs/engines/sglang.md must pass ``--sampling-backend pytorch``, and it must pick the attention
backend 0004 fixes (``--attention-backend triton``) and fp16 (``--dtype float16``). Read from each shipped
release's files, not assumed.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from t4patch.patching.registry import all_patch_sets
from tests.helpers import extracted_wheel, wheel_path

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RELEASES = [ps.version for ps in all_patch_sets() if ps.distribution == "sglang"]


def serve_command() -> list[str]:
    text = (ROOT / "docs" / "engines" / "sglang.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(python -m sglang\.launch_server.*?)```", text, re.S)
    assert block, "docs/engines/sglang.md has no launch_server block"
    return shlex.split(block.group(1).replace("\\\n", " "))


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


@pytest.mark.parametrize("version", RELEASES)
def test_the_documented_serve_command_keeps_a_t4_off_flashinfer_sampling(version: str) -> None:
    tree = extracted_wheel(wheel_path("sglang", version))
    choices = ast.parse((tree / "sglang/srt/arg_groups/choices.py").read_text(encoding="utf-8"))
    # 0.5.22+: BUILT_IN_SAMPLING_BACKENDS = frozenset({...}); 0.5.21: SAMPLING_BACKEND_CHOICES = {...}
    built_in = next(n for n in choices.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") in ("BUILT_IN_SAMPLING_BACKENDS", "SAMPLING_BACKEND_CHOICES")
                    and any(isinstance(c, ast.Constant) and c.value == "flashinfer" for c in ast.walk(n.value)))
    backends = {c.value for c in ast.walk(built_in.value) if isinstance(c, ast.Constant)}
    assert "pytorch" in backends
    overrides = (tree / "sglang/srt/arg_groups/overrides.py").read_text(encoding="utf-8")
    assert '"flashinfer" if get_platform().has_flashinfer else "pytorch"' in overrides, (
        f"sglang {version}: the sampling default changed; re-read it before keeping the flag's reason")
    argv = serve_command()
    assert option(argv, "--sampling-backend") == "pytorch"
    assert option(argv, "--attention-backend") == "triton"
    assert option(argv, "--dtype") == "float16"
