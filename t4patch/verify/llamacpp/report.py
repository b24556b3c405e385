"""Verdict, evidence class and the two renderings (text, JSON schema 1) of `t4patch verify llama.cpp`."""

from __future__ import annotations

from typing import Any

from t4patch import evidence
from t4patch.cuda.arch import TURING_CAPABILITY
from t4patch.errors import VerificationError
from t4patch.output import table

COMMAND = "verify llama.cpp"


def evidence_class(build: dict[str, Any], gpu_capability: str | None, backend: str) -> str:
    """Which of the report classes the run belongs to (t4patch.evidence's words), from what was built and where it
    ran. A CPU-backend run makes no sm_75 claim at all, and says so; an unreadable GPU is "unknown"."""
    archs = str(build.get("CMAKE_CUDA_ARCHITECTURES", "")).replace(";", ",")
    if not backend.upper().startswith("CUDA"):
        return f"llama.cpp test-backend-ops on the {backend} backend (no GPU code ran)"
    if gpu_capability is None:
        return "unknown: no GPU capability could be read"
    capability = evidence.parse_capability(gpu_capability)
    if capability == TURING_CAPABILITY:
        return evidence.measured_on_t4(capability, board="T4-class GPU")
    if archs == "75-virtual":
        return (evidence.ptx_jit(capability, host_emulated=False) + " (ggml dispatches by the highest compiled "
                "architecture); host-side choices that read the device's own compute capability were NOT emulated")
    return f"{evidence.ran_on(capability)} with the build's own architectures ({archs or 'unknown'}): not the Turing code paths"


def scope(evidence: str) -> list[str]:
    """What such a run cannot prove (always reported)."""
    if "no GPU code ran" in evidence:
        return ["anything about a GPU: this run checks llama.cpp's CPU backend against itself and t4patch's harness"]
    out = [
        "T4 timing: nothing here is a T4 speed figure",
        "hardware rounding differences between Turing and this GPU executing the same PTX",
        "the selected cases only: test-backend-ops' fixed shapes filtered to the types and layouts Gemma 4 E2B uses, not the model end to end",
    ]
    if "PTX JIT" in evidence:
        out.insert(0, "kernel choices ggml-cuda makes from the device's real compute capability (e.g. the flash-attention vector "
                      "kernel for cc >= 8.9, fattn.cu ggml_cuda_get_best_fattn_kernel) follow this GPU, not a T4; only code gated by "
                      "ggml_cuda_highest_compiled_arch takes the Turing branch")
    return out


def build_payload(ops: Any, op_json: list[dict[str, Any]], build: dict[str, Any], capability: str | None,
                  gpu: str | None, backend: str, binary: str) -> dict[str, Any]:
    """The report (JSON schema 1's payload) of one run, or of one re-derived from its ``--log`` file."""
    evidence = evidence_class(build, capability, backend)
    payload: dict[str, Any] = {
        "binary": binary,
        "backend": backend,
        "gpu": gpu,
        "build": build,
        "op_list": {"file": str(ops.path), "name": ops.name, "model": ops.model, "llama_cpp": ops.llama_cpp},
        "evidence_class": evidence,
        "does_not_prove": scope(evidence),
        "totals": {key: sum(o[key] for o in op_json) for key in ("cases", "ok", "fail", "crashed", "not_supported", "skipped")},
        "ops": op_json,
    }
    payload["verdict"] = verdict(op_json)
    return payload


def failures(results: list[dict[str, Any]]) -> list[str]:
    out = []
    for op in results:
        out += [f"{op['name']}: {p}" for p in op["problems"]]
        out += [f"{op['name']}: {f['op']}({f['params']}): {f['status'].upper()} {f.get('detail', '')}".rstrip() for f in op["failures"]]
    return out


def verdict(results: list[dict[str, Any]]) -> str:
    return "pass" if not failures(results) else "fail"


def raise_for(payload: dict[str, Any]) -> None:
    found = failures(payload["ops"])
    if found:
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        raise VerificationError(f"llama.cpp test-backend-ops on {payload['backend']}: {found[0]}{more}", hint="rerun with --json for llama.cpp's own output of every failure")


def render_text(payload: dict[str, Any]) -> str:
    build = payload["build"]
    lines = [
        f"t4patch verify llama.cpp: {payload['binary']} on {payload['backend']} ({payload['gpu'] or 'no GPU read'})",
        f"llama.cpp {build.get('llama_commit', '?')}; CMAKE_CUDA_ARCHITECTURES={build.get('CMAKE_CUDA_ARCHITECTURES', '-')}; op list {payload['op_list']['name']} ({payload['op_list']['llama_cpp']})",
        f"evidence: {payload['evidence_class']}",
        "",
    ]
    rows = []
    for op in payload["ops"]:
        rows.append([op["name"], op["cases"], op["ok"], op["fail"] + op["crashed"], op["not_supported"], len(op["e2b_not_supported"]),
                     op["skipped"], f"{op['seconds']:.0f}", "FAIL" if op["problems"] or op["failures"] else "ok"])
    lines.append(table(["op", "cases", "ok", "fail", "not supp.", "n.s. at E2B", "skipped", "s", "status"], rows))
    for op in payload["ops"]:
        if op["e2b_not_supported"]:
            lines += ["", f"{op['name']}: {len(op['e2b_not_supported'])} not supported at Gemma 4 E2B shapes, e.g. {op['e2b_not_supported'][0]}",
                      f"  what llama.cpp does then: {op['on_not_supported']}"]
    found = failures(payload["ops"])
    lines += ["", "does not prove: " + "; ".join(payload["does_not_prove"]), ""]
    lines.append(f"verdict: FAIL ({len(found)})" if found else "verdict: pass")
    lines += [f"  {f}" for f in found[:40]]
    return "\n".join(lines)
