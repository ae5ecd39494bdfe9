"""benchmarks/packing's pure half (slurm_gpushare_dev.packing): the trace, the requests, the metrics."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_gpushare.errors import InputError
from slurm_gpushare_dev import packing
from slurm_gpushare_dev.packing import JobRecord, Run, TraceJob

GPU = 81920


def test_a_seed_gives_the_same_trace_and_another_seed_another():
    assert packing.generate_trace(50, seed=7) == packing.generate_trace(50, seed=7)
    assert packing.generate_trace(50, seed=7) != packing.generate_trace(50, seed=8)


def test_the_generated_peaks_follow_the_published_shares():
    jobs = packing.generate_trace(4000, seed=3, gpu_mem_mib=GPU)
    frac = [j.peak_mib / GPU for j in jobs]
    at_most_25 = sum(f <= 0.25 for f in frac) / len(frac)
    at_most_50 = sum(f <= 0.50 for f in frac) / len(frac)
    assert abs(at_most_25 - 0.50) < 0.03, at_most_25   # NERSC: about half at most 25%
    assert abs(at_most_50 - 0.55) < 0.03, at_most_50   # 55% of 80 GB jobs at or below 50%
    assert all(0 < j.peak_mib <= GPU for j in jobs)


def test_the_generated_trace_has_multi_gpu_jobs_lognormal_run_times_and_limits_above_them():
    jobs = packing.generate_trace(4000, seed=3)
    multi = sum(j.gpus > 1 for j in jobs) / len(jobs)
    assert abs(multi - packing.MULTI_GPU_SHARE) < 0.03
    assert {j.gpus for j in jobs} == {1, 2, 4, 8}
    logs = sorted(math.log(j.duration_s) for j in jobs)
    median = math.exp(logs[len(logs) // 2])
    assert 0.85 * packing.DURATION_MEDIAN_S < median < 1.15 * packing.DURATION_MEDIAN_S
    assert all(j.limit_s >= j.duration_s for j in jobs)
    submits = [j.submit_s for j in jobs]
    assert submits == sorted(submits) and submits[0] == 0


def test_a_bad_trace_size_is_refused():
    with pytest.raises(InputError, match="must be positive"):
        packing.generate_trace(0)


def test_each_variant_asks_what_its_users_write():
    small = TraceJob(0, 0, 60, 120, 1, 10000)
    big = TraceJob(1, 0, 60, 120, 1, 70000)
    multi = TraceJob(2, 0, 60, 120, 4, 30000)
    assert [packing.gres_request(small, v, GPU) for v in packing.VARIANTS] == \
        ["gpu:1", "shard:1", "gpushare:mem=12000M"]
    assert [packing.gres_request(big, v, GPU) for v in packing.VARIANTS] == \
        ["gpu:1", "shard:4", f"gpushare:mem={GPU}M"]      # the headroom never asks more than the GPU
    assert [packing.gres_request(multi, v, GPU) for v in packing.VARIANTS] == \
        ["gpu:4", "gpu:4", "gpushare:mem=36000M:4"]
    with pytest.raises(InputError, match="unknown variant"):
        packing.gres_request(small, "mig", GPU)


def test_the_reserved_memory_is_read_from_the_grant():
    assert packing.reserved_mib("gres:shard:10", GPU, 1024) == 10240
    assert packing.reserved_mib("gres/gpu:a100:2", GPU, 1024) == 2 * GPU
    assert packing.reserved_mib("gres:gpu:1", GPU, 1024) == GPU
    assert packing.reserved_mib("gres:shard:3", GPU, GPU // 4) == 3 * GPU // 4
    assert packing.reserved_mib("N/A", GPU, 1024) == 0


def _run() -> Run:
    # two GPUs, time scale 60 (one real second = one trace minute); hand-made schedule:
    #   job  released started ended  grant          waits (s)
    #   0    0        0       10     1 GPU          0
    #   1    0        2       12     half a GPU     2
    #   2    1        5       20     1 GPU          4
    #   3    2        10      18     half a GPU     8
    #   4    2        None    None   (never ran)    -
    def j(i, gpus=1, peak=GPU // 4):
        return TraceJob(i, 0, 60, 120, gpus, peak)
    recs = [JobRecord(j(0), 0, 0, 10, GPU, 0), JobRecord(j(1), 0, 2, 12, GPU // 2, 0),
            JobRecord(j(2), 1, 5, 20, GPU, 0), JobRecord(j(3), 2, 10, 18, GPU // 2, 2),
            JobRecord(j(4), 2, None, None, 0, None)]
    return Run("gpushare", recs, total_gpus=2, gpu_mem_mib=GPU, time_scale=60.0)


def test_the_metrics_of_a_hand_made_schedule():
    s = packing.summarize(_run())
    assert s["makespan_h"] == pytest.approx(20 * 60 / 3600)          # first release 0, last end 20
    assert s["wait_mean_min"] == pytest.approx((0 + 2 + 4 + 8) / 4)  # real s x 60 = trace s = minutes x 60
    # p95 of [0, 2, 4, 8] by linear interpolation: 4 + 0.85 x (8 - 4)
    assert s["wait_p95_min"] == pytest.approx(7.4)
    assert (s["done"], s["lost_oom"], s["lost_failed"]) == (3, 1, 1)
    reserved_gpu_s = (10 * 1 + 10 * 0.5 + 15 * 1 + 8 * 0.5) * 60
    assert s["reserved_gpu_h"] == pytest.approx(reserved_gpu_s / 3600)
    assert s["used_gpu_h"] == pytest.approx((10 + 10 + 15 + 8) * 0.25 * 60 / 3600)
    assert s["packing"] == pytest.approx(reserved_gpu_s / (2 * 20 * 60))
    assert s["jobs_per_gpu_hour"] == pytest.approx(3 / (2 * 20 * 60 / 3600))


def test_the_percentile_interpolates_and_is_nan_when_empty():
    assert packing.pct([0, 10], 0.5) == 5
    assert packing.pct([3], 0.95) == 3
    assert math.isnan(packing.pct([], 0.5))


def test_the_timeline_counts_reserved_memory_and_waiting_jobs():
    ts, res, queue = packing.timeline(_run(), step=1.0)
    assert ts[0] == 0 and ts[-1] == pytest.approx(20 * 60 / 3600)
    # at t=3: jobs 0 and 1 run (1.5 of 2 GPUs), jobs 2, 3, 4 wait
    assert res[3] == pytest.approx(0.75) and queue[3] == 3
    # at t=19: job 2 alone; job 4 still waits (it never ran)
    assert res[19] == pytest.approx(0.5) and queue[19] == 1


def test_the_table_gives_ratios_to_the_first_variant():
    base = packing.summarize(_run())
    half = dict(base, makespan_h=base["makespan_h"] / 2)
    lines = packing.ratio_table({"exclusive": base, "gpushare": half})
    row = next(line for line in lines if line.startswith("makespan"))
    assert row.rstrip().endswith("0.50x")


def test_a_site_export_is_read_with_sacct_names(tmp_path):
    f = tmp_path / "jobs.csv"
    f.write_text("JobID,Submit,Elapsed,Timelimit,AllocTRES,TRESUsageInMax\n"
                 "11,2024-03-01T10:00:00,00:30:00,01:00:00,\"cpu=4,gres/gpu=2\",gres/gpumem=20G\n"
                 "12,2024-03-01T10:05:00,1-00:00:00,,\"cpu=4\",\n"
                 "13,2024-03-01T10:10:00,90,,gres/gpu=1,gres/gpumem=100G\n")
    jobs = packing.read_trace_csv(f, gpu_mem_mib=GPU)
    assert [(j.submit_s, j.duration_s, j.limit_s, j.gpus, j.peak_mib) for j in jobs] == [
        (0.0, 1800.0, 3600.0, 2, 10240), (600.0, 90.0, 180.0, 1, GPU)]   # no GPUs: skipped; capped at the GPU


def test_a_site_export_with_plain_columns_and_its_errors(tmp_path):
    f = tmp_path / "jobs.csv"
    f.write_text("submit,elapsed,gpus,peakmem\n0,600,1,12G\n")
    assert packing.read_trace_csv(f)[0].peak_mib == 12288
    f.write_text("Submit|Elapsed|AllocTRES|PeakMem\n0|10:00|cpu=2,gres/gpu=1|4G\n")   # sacct -P
    assert [(j.duration_s, j.gpus, j.peak_mib) for j in packing.read_trace_csv(f)] == [(600.0, 1, 4096)]
    f.write_text("submit,elapsed,gpus\n0,600,1\n")
    with pytest.raises(InputError, match="missing column.*PeakMem"):
        packing.read_trace_csv(f)
    f.write_text("submit,elapsed,gpus,peakmem\n0,ten minutes,1,12G\n")
    with pytest.raises(InputError, match="line 2.*not a duration"):
        packing.read_trace_csv(f)


def test_the_plot_is_a_png_with_one_column_per_variant(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib import image

    runs = [Run(v, _run().records, 2, GPU) for v in packing.VARIANTS]
    path = tmp_path / "p.png"
    packing.plot(runs, path, title="test")
    img = image.imread(path)
    assert img.shape[1] > img.shape[0] > 200   # wide: three columns side by side


def test_the_makespan_bound_is_the_tail_or_the_work_left_after_a_submit():
    def j(i, submit, duration, gpus=1, peak=GPU):
        return TraceJob(i, submit, duration, 2 * duration, gpus, peak)
    # the tail: a long job submitted late
    assert packing.makespan_bound_s([j(0, 0, 10), j(1, 100, 1000)], "exclusive", 8, GPU) == 1100
    # the work: four whole-GPU jobs at once on 2 GPUs; as gpushare quarters (x 1.2 headroom) the tail decides
    four = [j(i, 0, 100, peak=GPU // 4) for i in range(4)]
    assert packing.makespan_bound_s(four, "exclusive", 2, GPU) == 200
    assert packing.makespan_bound_s(four, "gpushare", 2, GPU) == 100
    assert packing.makespan_bound_s(four, "fixed", 2, GPU) == 100   # 2 quarters each: 1 GPU's worth x 100 s
    # the work left after a later submit counts from that submit: 50 + 3 x 100 on one GPU, not 10 + 300
    late = [j(0, 0, 10), j(1, 50, 100), j(2, 50, 100), j(3, 50, 100)]
    assert packing.makespan_bound_s(late, "exclusive", 1, GPU) == 350
    assert math.isnan(packing.makespan_bound_s([], "gpushare", 1, GPU))
    with pytest.raises(InputError, match="unknown variant"):
        packing.makespan_bound_s(late, "mig", 1, GPU)


def _list_schedule(trace, total_gpus):
    """Whole-GPU jobs started in submit order as soon as enough GPUs are free: a real schedule's makespan."""
    free_at = [0.0] * total_gpus
    ends = []
    for job in sorted(trace, key=lambda j: j.submit_s):
        free_at.sort()
        start = max(job.submit_s, free_at[job.gpus - 1])
        for k in range(job.gpus):
            free_at[k] = start + job.duration_s
        ends.append(start + job.duration_s)
    return max(ends) - min(j.submit_s for j in trace)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(1, 400), st.sampled_from([1, 1, 2, 4])),
                min_size=1, max_size=30), st.sampled_from([4, 8]))
def test_no_schedule_beats_the_makespan_bound(jobs, total_gpus):
    trace = [TraceJob(i, float(s), float(d), 2.0 * d, g, GPU) for i, (s, d, g) in enumerate(jobs)]
    bound = packing.makespan_bound_s(trace, "exclusive", total_gpus, GPU)
    assert bound <= _list_schedule(trace, total_gpus) + 1e-9
    # and the bound is tight for a lone job, or jobs that all fit at once
    if sum(g for _, _, g in jobs) <= total_gpus:
        assert bound == pytest.approx(_list_schedule(trace, total_gpus))


def test_the_table_has_the_least_possible_makespan_row():
    s = packing.summarize(_run())
    assert s["makespan_bound_h"] == pytest.approx(
        packing.makespan_bound_s([r.job for r in _run().records], "gpushare", 2, GPU) / 3600)
    assert any(line.startswith("  least possible") for line in packing.ratio_table({"gpushare": s}))
