"""SGLang 0.5.23's patch set checks SGLANG_MARLIN_USE_ATOMIC_ADD when SGLang starts, not at the first GEMM.

The patched ``marlin_utils.py`` is imported while SGLang registers its quantization methods (at start-up); its
module body now calls the switch's parser, which refuses a value that is not a boolean. The test applies the
shipped set to the real wheel's files and runs the patched parser from those bytes (the rest of the module
needs SGLang's runtime), and checks that the module body really calls it.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Optional

import pytest

from t4patch.cli import main
from tests.helpers import install_wheel_to, wheel_path

pytestmark = pytest.mark.integration

MODULE = "sglang/srt/layers/quantization/marlin_utils.py"
PARSER = "_t4patch_atomic_add_env"


def test_atomic_add_switch_is_validated_at_import(tmp_path: Path, monkeypatch):
    site = install_wheel_to(tmp_path / "sglang", wheel_path("sglang", "0.5.23"))
    assert main(["apply", "sglang==0.5.23", "--site-packages", str(site)]) == 0
    tree = ast.parse((site / MODULE).read_text(encoding="utf-8"))
    names = [getattr(node, "name", None) for node in tree.body]
    assert PARSER in names
    calls = [
        index for index, node in enumerate(tree.body)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == PARSER
    ]
    assert calls and calls[0] > names.index(PARSER), "the module body must call the parser at import"
    definition = tree.body[names.index(PARSER)]
    namespace: dict[str, object] = {"os": os, "Optional": Optional}
    exec(compile(ast.Module(body=[definition], type_ignores=[]), MODULE, "exec"), namespace)
    parse = namespace[PARSER]
    for value, expected in (("", None), ("1", True), ("yes", True), ("0", False), ("False", False)):
        monkeypatch.setenv("SGLANG_MARLIN_USE_ATOMIC_ADD", value)
        assert parse() is expected  # type: ignore[operator]
    monkeypatch.setenv("SGLANG_MARLIN_USE_ATOMIC_ADD", "maybe")
    with pytest.raises(ValueError, match='SGLANG_MARLIN_USE_ATOMIC_ADD="maybe" is not a valid boolean'):
        parse()  # type: ignore[operator]


MOE_REPACKS = {
    "sglang/kernels/ops/quantization/awq_marlin_repack.py": "awq_marlin_moe_repack",
    "sglang/srt/hardware_backend/gpu/quantization/gptq_kernels.py": "gptq_marlin_moe_repack",
}
REFUSAL_MODULE = "sglang/kernels/ops/moe/moe_wna16_marlin.py"
REFUSAL = "_t4patch_refuse_moe_marlin"


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_moe_marlin_is_refused_while_the_weights_load(tmp_path: Path):
    site = install_wheel_to(tmp_path / "sglang", wheel_path("sglang", "0.5.23"))
    assert main(["apply", "sglang==0.5.23", "--site-packages", str(site)]) == 0
    for rel, name in MOE_REPACKS.items():
        body = _function(ast.parse((site / rel).read_text(encoding="utf-8")), name).body
        first_call = next(s for s in body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call))
        assert getattr(first_call.value.func, "id", None) == REFUSAL, f"{rel}: {name} must refuse first"
        assert body.index(first_call) < next(i for i, s in enumerate(body) if isinstance(s, ast.For)), name
    tree = ast.parse((site / REFUSAL_MODULE).read_text(encoding="utf-8"))
    gemm = _function(tree, "moe_wna16_marlin_gemm")
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == REFUSAL for n in ast.walk(gemm))
    for below, via in ((True, False), (False, True), (False, False)):
        namespace: dict[str, object] = {
            "_t4patch_below_sm80": lambda index, below=below: below,
            "_t4patch_marlin_via_vllm": lambda index, via=via: via,
        }
        exec(compile(ast.Module(body=[_function(tree, REFUSAL)], type_ignores=[]), REFUSAL_MODULE, "exec"),
             namespace)
        refuse = namespace[REFUSAL]
        if below or via:
            with pytest.raises(NotImplementedError, match="MoE Marlin kernel .* is empty below compute capability 8.0"):
                refuse(0)  # type: ignore[operator]
        else:
            refuse(0)  # type: ignore[operator]  # cc >= 8.0 without the switch: stock behaviour
