"""SGLang behind the engine interface: its distributions, attention driver, Marlin redirect provider and
doctor readiness checks (what its patch set needs beside it on Turing)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from t4patch.contract import Engine, MarlinProvider, MarlinScope, MarlinSpec
from t4patch.engines.vllm.engine import LIBRARY_OPTION

if TYPE_CHECKING:
    from t4patch.contract import Context, DoctorSection
    from t4patch.environment.target import TargetEnvironment


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
    # the redirect runs vLLM's kernels: their numerics and library come from the engine `redirect_to` names,
    # through the table; only what a run proves about the redirect itself is SGLang's
    marlin_scope = MarlinScope(
        redirect_clause="for the sglang provider that the patched functions reach vLLM's op and return bitwise "
        "its result",
    )
    doctor_key = "sglang"
    runtime_nvcc = "its JIT kernels compile with nvcc at first use"
    flashinfer_on_turing = "it uses FlashInfer for norms and sampling; serve with --sampling-backend pytorch"
    multi_gpu_without_p2p = "--tp N --disable-custom-all-reduce"

    def doctor(self, ctx: Context) -> DoctorSection | None:
        from t4patch.engines.sglang.doctor import section

        return section(ctx)
