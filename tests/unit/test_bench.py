from __future__ import annotations

from core.node.bench import cached_benchmark, device_key


def test_device_benchmark_is_measured_once_and_cached(tmp_path):
    cache = tmp_path / "bench.json"
    steps = []
    first = cached_benchmark(
        cache, quick=True, progress=lambda what, done, total: steps.append(what)
    )
    assert first["matmul_tflops_fp32"] > 0
    assert first["memory_total_gb"] > 0
    assert steps[0] == "matmul fp32"
    again = cached_benchmark(cache, quick=True, progress=lambda *a: steps.append("again"))
    assert again == first
    assert "again" not in steps  # from the cache
    assert {k: first[k] for k in device_key()} == device_key()
