"""SGLang behind the engine interface: its distributions, attention driver, Marlin redirect provider and
doctor readiness checks (what its patch set needs beside it on Turing)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from t4patch.engines.base import DoctorSection, Engine, MarlinScope, MarlinSpec
from t4patch.engines.vllm.engine import LIBRARY_OPTION, VllmEngine

if TYPE_CHECKING:
    from t4patch.environment.target import TargetEnvironment
    from t4patch.readiness.model import Check, Context
    from t4patch.verify.marlin.providers import MarlinProvider


def _redirect_provider(
    target: TargetEnvironment, options: Mapping[str, str | None], capability: tuple[int, int]
) -> MarlinProvider:
    from t4patch.engines.sglang.marlin_provider import sglang_provider

    return sglang_provider(target, options.get(LIBRARY_OPTION.dest), capability=capability)


def _summary(provider_json: dict[str, Any]) -> str:
    from t4patch.engines.sglang.marlin_provider import summary

    return summary(provider_json)


class SglangEngine(Engine):
    name = "sglang"
    label = "SGLang"
    distributions = ("sglang", "sglang-kernel")
    attention_drivers = {"sglang-triton-attention": "t4patch.engines.sglang.attention:SglangDriver"}
    attention_summary = "SGLang extend and grouped decode"
    marlin = (
        MarlinSpec(
            name="sglang",
            help="the patched SGLang functions (the redirect)",
            build=_redirect_provider,
            summary=_summary,
            # the redirect forwards to vLLM's compiled Marlin, so the same library option applies
            options=(LIBRARY_OPTION,),
            redirect_to="vllm",
        ),
    )
    doctor_key = "sglang"
    runtime_nvcc = "its JIT kernels compile with nvcc at first use"
    flashinfer_on_turing = "it uses FlashInfer for norms and sampling; serve with --sampling-backend pytorch"
    multi_gpu_without_p2p = "--tp N --disable-custom-all-reduce"

    def doctor_checks(self, ctx: Context) -> list[Check]:
        from t4patch.engines.sglang.readiness import checks

        return checks(ctx)

    def marlin_scope(self) -> MarlinScope:
        kernels = VllmEngine().marlin_scope()  # the redirect runs vLLM's kernels
        return MarlinScope(
            numerics_reference=kernels.numerics_reference,
            library=kernels.library,
            redirect_clause="for the sglang provider that the patched functions reach vLLM's op and return bitwise "
            "its result",
        )

    def doctor(self, target: TargetEnvironment) -> DoctorSection | None:
        from t4patch.engines.sglang.doctor import section

        return section(target)
