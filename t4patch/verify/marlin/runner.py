"""One verification run, shared by the CLI (`t4patch verify marlin`) and the GPU pytest entry.

Order matters for clear errors: the shipped data is validated first (no GPU needed), then torch and the GPU
are checked (NoGpuError / MissingDependencyError), then the provider is built (MissingDependencyError,
NotAppliedError), and only then do kernels run.
"""

from __future__ import annotations

import datetime
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from t4patch.contract import EngineTable, MarlinProvider
from t4patch.environment.target import TargetEnvironment
from t4patch.errors import MissingDependencyError, NoGpuError, UsageError
from t4patch.verify.marlin import checks, config, probe, providers, report
from t4patch.verify.marlin.shapes import ShapeTable, load_shape_table

DEFAULT_M = (1, 16, 64, 512)
QUICK_M = (1, 64)
MAX_M = 65536


@dataclass(frozen=True)
class Request:
    provider: str
    target: TargetEnvironment
    engines: EngineTable  # the engine table, handed in by the command (providers, scope, report columns)
    shapes: str = "gemma4-e2b"
    m_values: tuple[int, ...] | None = None  # None: DEFAULT_M, or QUICK_M with quick
    quick: bool = False
    seed: int = 0
    options: Mapping[str, str | None] = field(default_factory=dict)  # the provider's own options, by dest
    speed: bool = True


def parse_m_list(text: str) -> tuple[int, ...]:
    """"1,16,64" -> (1, 16, 64); each m a positive integer, no duplicates."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not (1 <= int(part) <= MAX_M):
            raise UsageError(f"--m {text}: expected comma-separated integers 1..{MAX_M}, found {part!r}", hint="--m 1,16,64,512")
        if int(part) in values:
            raise UsageError(f"--m {text}: {part} is listed twice", hint="--m 1,16,64,512")
        values.append(int(part))
    return tuple(values)


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError(
            f"verify marlin needs torch (a CUDA build) in this interpreter ({sys.executable}), found none",
            hint="run it with the serving environment's Python: t4patch verify marlin --python /path/to/venv/bin/python",
        ) from exc
    return torch


def _gpu(torch: Any) -> dict[str, Any]:
    if not torch.cuda.is_available():
        build = torch.version.cuda or "none (CPU build)"
        raise NoGpuError(
            f"verify marlin runs the engine's kernels on a CUDA GPU; torch {torch.__version__} (CUDA {build}) sees none",
            hint="run it on the GPU host (nvidia-smi must list the GPU), or in CI on a GPU runner",
        )
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    name = torch.cuda.get_device_name(index)
    peak = config.peak_bandwidth(name)
    driver = None
    try:
        from t4patch.cuda.gpu import detect

        driver = detect().driver_version
    except Exception:  # noqa: BLE001 - the driver version is informational
        driver = None
    try:
        from t4patch.verify.marlin.timing import copy_bandwidth_gb_per_s

        copy_rate = round(copy_bandwidth_gb_per_s(), 1)
    except Exception:  # noqa: BLE001 - a ceiling measurement must not stop the checks
        copy_rate = None
    return {
        "index": index,
        "name": name,
        "capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "l2_bytes": getattr(props, "L2_cache_size", 0) or 0,
        "peak_gb_per_s": peak.gb_per_s if peak else None,
        "peak_source": peak.source if peak else "not in hardware/gpu-memory-bandwidth.toml",
        "measured_copy_gb_per_s": copy_rate,  # device-to-device copy, read + write
        "driver": driver,
    }


def import_from(target: TargetEnvironment) -> None:
    """Make the engine modules of a ``--site-packages`` target importable here: its directories first on
    ``sys.path`` (the running interpreter is the target otherwise; ``--python`` re-runs the command there)."""
    if not target.options:
        return
    for root in reversed(target.search_path):
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))


def run(request: Request) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Run every check; return (the JSON payload without schema/command, the failures)."""
    import_from(request.target)  # first: torch and the engine come from the target's directories
    names = providers.provider_names(request.engines)
    if request.provider not in names:
        raise UsageError(f"--provider {request.provider}: expected one of {', '.join(names)}")
    table = load_shape_table(request.shapes)
    tolerances = config.load_tolerances()
    m_values = request.m_values or (QUICK_M if request.quick else DEFAULT_M)
    torch = _torch()
    gpu = _gpu(torch)
    capability = tuple(int(x) for x in gpu["capability"].split("."))
    provider = providers.make_provider(request.provider, request.target, request.options, capability, request.engines)  # type: ignore[arg-type]
    settings = checks.Settings(
        m_values=m_values,
        seed=request.seed,
        group_size=table.group_size,
        tolerances=tolerances,
        speed=request.speed,
        quick=request.quick,
        l2_bytes=gpu["l2_bytes"] or 50 * 1024 * 1024,
        peak_gb_per_s=gpu["peak_gb_per_s"],
        copy_gb_per_s=gpu["measured_copy_gb_per_s"],
    )
    software = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "target": request.target.to_json(),
    }
    return execute(provider, table, tolerances, settings, gpu, software, request.engines)


def execute(
    provider: MarlinProvider,
    table: ShapeTable,
    tolerances: config.Tolerances,
    settings: checks.Settings,
    gpu: dict[str, Any],
    software: dict[str, Any],
    engines: EngineTable,
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The checks themselves, on an already-built provider (unit tests pass an emulated one on the CPU)."""
    import torch

    capability = tuple(int(x) for x in gpu["capability"].split("."))
    failures = checks.Failures([])
    started = datetime.datetime.now(datetime.timezone.utc)
    device = probe.device_for(settings.device)
    act_order = provider.act_order_probe(failures, device) if provider.act_order_probe else None
    switch_off = provider.switch_off_probe(capability, failures) if provider.switch_off_probe else None  # type: ignore[arg-type]
    results = []
    for shape in table.linears:
        results.append(checks.check_shape(provider, shape, settings, failures))
        if settings.device == "cuda":
            torch.cuda.empty_cache()
    # the provider's own checks and scope statement, where its engine has them (typed hooks of the contract)
    extra = provider.extra_checks(results, table, settings, failures) if provider.extra_checks else {}
    if provider.scope is not None:
        proves, does_not = provider.scope(capability, gpu["name"])  # type: ignore[arg-type]
    else:
        proves, does_not = report.scope(capability, gpu["name"], engines, provider.name)  # type: ignore[arg-type]
    payload: dict[str, Any] = {
        "verdict": report.verdict(failures.items),
        "failures": [{"kind": kind, "message": message} for kind, message in failures.items],
        "started_utc": started.isoformat(timespec="seconds"),
        "gpu": gpu,
        "software": software,
        "provider": {"name": provider.name, **provider.info},
        "shapes": {"name": table.name, "model": table.model, "file": str(table.path), "group_size": table.group_size},
        "m": list(settings.m_values),
        "quick": settings.quick,
        "seed": settings.seed,
        "tolerances": tolerances.to_json(),
        "scope": {"proves": proves, "does_not_prove": does_not},
        "act_order": act_order,
        "switch_off_probe": switch_off,
        "results": results,
    }
    payload.update(extra)
    return payload, failures.items
