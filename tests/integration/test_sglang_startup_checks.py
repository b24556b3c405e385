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
    exec(compile(ast.Module(body=[definition], type_ignores=[]), MODULE, "exec"), namespace)  # noqa: S102
    parse = namespace[PARSER]
    for value, expected in (("", None), ("1", True), ("yes", True), ("0", False), ("False", False)):
        monkeypatch.setenv("SGLANG_MARLIN_USE_ATOMIC_ADD", value)
        assert parse() is expected  # type: ignore[operator]
    monkeypatch.setenv("SGLANG_MARLIN_USE_ATOMIC_ADD", "maybe")
    with pytest.raises(ValueError, match='SGLANG_MARLIN_USE_ATOMIC_ADD="maybe" is not a valid boolean'):
        parse()  # type: ignore[operator]
