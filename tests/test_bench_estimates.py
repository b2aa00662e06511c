"""The arithmetic the benchmarks' closing lines rest on: the GRPO step's model work (benchmarks/grpo.py)
and the extrapolation of a scale run to NVIDIA's corpus (benchmarks/scale_estimate.py)."""

import pytest

from benchmarks.grpo import step_work
from benchmarks.scale_estimate import estimate


def test_step_work_counts_each_prompt_once_when_shared_and_group_times_otherwise():
    # prompts 10 + 20 tokens at half a response token's cost, 2 x 4 responses of 5 tokens; sample 1x, train 3x
    assert step_work([10, 20], 4, 5.0, shared=True, prompt_cost=0.5) == pytest.approx((15 + 40) * 4)
    assert step_work([10, 20], 4, 5.0, shared=False, prompt_cost=0.5) == pytest.approx((60 + 40) * 4)


def test_estimate_splits_cpu_by_amdahl_on_two_workers_and_extrapolates_memory_per_row():
    small = {"step": "dedup", "rows": 100, "wall_s": 1.0, "cpu_s": 1.0, "peak_rss_gb": 1.0}
    large = {"step": "dedup", "rows": 1100, "wall_s": 60.0, "cpu_s": 100.0, "peak_rss_gb": 2.0}
    e = estimate(small, large, rows=10_100, work_factor=10, cores=[2, 100])
    # parallel p = 2 (100 - 60) = 80 s, serial 20 s; x10 work
    assert e["serial_h"] == pytest.approx(200 / 3600) and e["parallel_h"] == pytest.approx(800 / 3600)
    assert e["hours"][2] == pytest.approx((20 + 80 / 2) * 10 / 3600)
    assert e["hours"][100] == pytest.approx((20 + 80 / 100) * 10 / 3600)
    # 1 GB per 1000 rows: 2 GB + 9000 rows more
    assert e["gb_per_million_rows"] == pytest.approx(1000) and e["peak_gb"] == pytest.approx(11.0)
    # a step with no parallel part (wall >= CPU) is all serial
    assert estimate(small, {**large, "wall_s": 120.0}, 10_100, 1, [2])["parallel_h"] == 0
