"""On a real GPU, doctor's driver-API facts must agree with what torch reports for the same device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_driver_api_agrees_with_torch():
    from t4patch.cuda.gpu import detect

    report = detect()
    assert "cuda-driver-api" in report.sources, report.problems
    assert len(report.gpus) == torch.cuda.device_count()
    for gpu in report.gpus:
        props = torch.cuda.get_device_properties(gpu.index)
        assert gpu.name == props.name
        assert gpu.cc_tuple == (props.major, props.minor)
        assert gpu.shared_memory_per_block_optin == props.shared_memory_per_block_optin
        assert gpu.multiprocessors == props.multi_processor_count
        assert gpu.memory_total_bytes == props.total_memory
    assert report.driver_version, "NVML should give the driver version"
    assert report.cuda_driver_version
