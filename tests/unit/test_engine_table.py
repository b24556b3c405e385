"""commands/engine_table.py and the EngineTable lookups of t4patch.contract.engine."""

from __future__ import annotations

import pytest

from t4patch.commands import engine_table
from t4patch.contract import Engine, EngineTable, MarlinSpec


def test_the_shipped_table_and_its_lookups():
    names = [e.name for e in engine_table.ENGINES]
    assert names[:2] == ["vllm", "sglang"]
    assert engine_table.get("sglang") is engine_table.ENGINES[1] and engine_table.get("nope") is None
    assert engine_table.marlin_specs()[0].name == "vllm"  # the default provider
    found = engine_table.marlin_spec("sglang")
    assert found is not None and found[0].name == "sglang" and found[1].redirect_to == "vllm"
    drivers = engine_table.attention_drivers()
    assert all(":" in where for where in drivers.values()) and tuple(drivers) == engine_table.attention_driver_names()
    assert engine_table.engine_distributions()[:3] == ("vllm", "sglang", "sglang-kernel")
    assert engine_table.example_spec().startswith(engine_table.example_name() + "==")


def test_a_redirects_kernels_come_from_the_engine_it_forwards_to():
    table = engine_table.ENGINES
    assert table.marlin_kernels("sglang") is table.get("vllm").marlin_scope  # type: ignore[union-attr]
    assert table.marlin_kernels(None) is table[0].marlin_scope


def test_duplicate_provider_names_are_refused():
    spec = MarlinSpec(name="p", help="", build=lambda *a: None, summary=str)  # type: ignore[arg-type,return-value]

    class A(Engine):
        name, label, distributions, marlin = "a", "A", ("a",), (spec,)

    class B(Engine):
        name, label, distributions, marlin = "b", "B", ("b",), (spec,)

    with pytest.raises(ValueError, match="Marlin provider name is used twice"):
        EngineTable((A(), B()))
