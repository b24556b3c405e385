"""vLLM behind the engine interface: its distribution, its attention driver, its Marlin providers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from t4patch.contract import Engine, MarlinProvider, MarlinScope, MarlinSpec, ProviderOption
from t4patch.engines.vllm.marlin import LIBRARY

if TYPE_CHECKING:
    from t4patch.contract import Context, DoctorSection
    from t4patch.environment.target import TargetEnvironment

LIBRARY_OPTION = ProviderOption(
    flag="--vllm-lib",
    dest="vllm_lib",
    metavar="PATH",
    help=f"vLLM's compiled {LIBRARY} (or .so.xz) to load instead of importing vllm",
    is_path=True,
)


def _ops_provider(
    target: TargetEnvironment, options: Mapping[str, str | None], capability: tuple[int, int]
) -> MarlinProvider:
    from t4patch.engines.vllm.marlin_provider import vllm_provider

    return vllm_provider(target, options.get(LIBRARY_OPTION.dest))


def _sm75_provider(
    target: TargetEnvironment, options: Mapping[str, str | None], capability: tuple[int, int]
) -> MarlinProvider:
    from t4patch.engines.vllm.marlin_sm75_provider import sm75_provider

    return sm75_provider(target, options.get(LIBRARY_OPTION.dest), capability=capability)


def _summary(provider_json: dict[str, Any]) -> str:
    from t4patch.engines.vllm.marlin_provider import summary

    return summary(provider_json.get("vllm", {}))


class VllmEngine(Engine):
    name = "vllm"
    label = "vLLM"
    distributions = ("vllm",)
    attention_drivers = {"vllm-unified-attention": "t4patch.engines.vllm.attention:VllmDriver"}
    attention_summary = "vLLM unified_attention: 2D, 3D split-K, reduce_segments"
    marlin = (
        MarlinSpec(
            name="vllm",
            help="vLLM 0.33's ops (or its compiled library)",
            build=_ops_provider,
            summary=_summary,
            options=(LIBRARY_OPTION,),
        ),
        MarlinSpec(
            name="vllm-sm75",
            help="vLLM 0.33's Marlin built from its sdist as compute_75 PTX only, T4 host values emulated "
            "(--vllm-lib names the sdist; default $T4PATCH_VLLM_SDIST or ~/.cache/t4patch/sdists/)",
            build=_sm75_provider,
            summary=_summary,
            options=(LIBRARY_OPTION,),
        ),
    )

    marlin_scope = MarlinScope(numerics_reference="vLLM PR #29901", library="vLLM's library")
    multi_gpu_without_p2p = "--tensor-parallel-size N --disable-custom-all-reduce"

    def doctor(self, ctx: Context) -> DoctorSection | None:
        from t4patch.engines.vllm.readiness import section

        return section(ctx)
