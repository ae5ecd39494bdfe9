"""``report --plot``: the figure's panels (axes labelled, one series per user), the PNG's size, the HTML page
embedding it, the filters, and the refusals."""

from __future__ import annotations

import base64
import io
import re
import time
from dataclasses import replace

import matplotlib.image
import pytest
from click.testing import CliRunner

from slurm_gpushare.accounting import plot
from slurm_gpushare.accounting.report import Filters, usage_report
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.cli import main
from slurm_gpushare.errors import InputError
from tests.accounting.test_record import record
from tests.accounting.test_report import T0, fixture

WIDTH, HEIGHT = int(plot.FIGSIZE[0] * plot.DPI), int(plot.FIGSIZE[1] * plot.DPI)


@pytest.fixture
def store():
    with Store() as st:
        # a third user, so that the series are not just two
        st.add([*fixture(), record(job_id="9", user="carol", account="physics", mem_asked_mib=8192,
                                   mem_granted_mib=8192, mem_peak_mib=7000, mode="mps", share="shard:8",
                                   start=T0 + 1800, end=T0 + 5400)])
        yield st


def _legend(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def test_figure_has_three_labelled_panels_with_one_series_per_user(store):
    fig = plot.figure(store)
    hours, eff, over_time = fig.axes
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), ax
    assert hours.get_title() == "GPU-hours reserved vs used by user"
    assert [t.get_text() for t in hours.get_xticklabels()] == ["alice", "bob", "carol"]  # most reserved first
    assert _legend(hours) == ["reserved", "used (SM utilization)"]
    # bob's jobs have no SM data: his "used" bar is missing, not 0
    reserved, used = hours.containers
    assert len(reserved) == 3 and len(used) == 2
    # the histogram: one stacked series per user with a measured peak (job 4 has none: counted in the title)
    assert eff.get_xlabel() == "peak GPU memory / memory asked (%)" and eff.get_ylabel() == "jobs"
    assert _legend(eff) == ["alice", "bob", "carol"]
    assert len(eff.containers) == 3
    assert "(1 without a measured peak not shown)" in eff.get_title()
    # the jobs of each user: alice 1 and 2, bob 3 (4 has no peak), carol 9
    assert [sum(p.get_height() for p in c) for c in eff.containers] == [2, 1, 1]
    # memory over time: reserved and used per model and mode
    assert over_time.get_ylabel() == "GPU memory (GiB)"
    # one legend entry per model and mode (its colour), one per line style (issue 31 item 6)
    assert _legend(over_time) == ["a100 gpu", "a100 mps", "h100 gpu", "h100 mig", "reserved", "used (peak)"]
    # a100 gpu: job 2's two whole GPUs, 160 GiB reserved at once
    assert max(over_time.lines[0].get_ydata()) == 160.0
    assert max(over_time.lines[1].get_ydata()) == 30.0  # their peaks, 20 + 10 GiB


def test_by_account_and_filters(store):
    fig = plot.figure(store, by="account", filters=Filters(users=("alice", "carol")))
    hours, eff, _ = fig.axes
    assert hours.get_title() == "GPU-hours reserved vs used by account"
    assert [t.get_text() for t in hours.get_xticklabels()] == ["physics"]
    assert _legend(eff) == ["physics"]
    with pytest.raises(InputError, match="per user or per account"):
        plot.figure(store, by="model")


def test_png_has_the_figure_size(store, tmp_path):
    path = plot.write(plot.figure(store), tmp_path / "usage.png")
    img = matplotlib.image.imread(path)
    assert img.shape[:2] == (HEIGHT, WIDTH)


def test_html_embeds_the_png_without_scripts(store, tmp_path):
    path = plot.write(plot.figure(store), tmp_path / "usage.html")
    page = path.read_text()
    assert "<script" not in page
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    img = matplotlib.image.imread(io.BytesIO(base64.b64decode(m.group(1))), format="png")
    assert img.shape[:2] == (HEIGHT, WIDTH)


def test_other_suffixes_and_unwritable_places_are_refused(store, tmp_path):
    fig = plot.figure(store)
    with pytest.raises(InputError, match=r"cannot write a \.pdf file"):
        plot.write(fig, tmp_path / "usage.pdf")
    with pytest.raises(InputError, match="cannot write --plot"):
        plot.write(fig, tmp_path / "missing" / "usage.png")


def test_an_empty_store_still_draws(tmp_path):
    with Store() as st:
        fig = plot.figure(st)
    assert [t.get_text() for ax in fig.axes for t in ax.texts] == ["no records", "no job with a measured peak",
                                                                    "no records"]


def test_report_plot_command(tmp_path):
    db = tmp_path / "acct.db"
    with Store(db) as st:
        st.add(fixture())
    out = CliRunner().invoke(main, ["report", "--db", str(db), "--plot", str(tmp_path / "u.png"), "--user", "bob"])
    assert out.exit_code == 0, out.output
    assert out.output == f"wrote {tmp_path / 'u.png'}\n"
    assert matplotlib.image.imread(tmp_path / "u.png").shape[:2] == (HEIGHT, WIDTH)
    for bad, msg in ((["--by", "model"], "per user or per account"), (["--waste"], "without --waste"),
                     (["--format", "csv"], "drop --format")):
        out = CliRunner().invoke(main, ["report", "--db", str(db), "--plot", str(tmp_path / "u.png"), *bad])
        assert out.exit_code == 2 and msg in out.output, out.output


def test_memory_over_time_is_a_step_per_model_and_mode_on_one_time_axis(store):
    over_time = plot.figure(store).axes[2]
    lines = {ln.get_label(): ln for ln in over_time.lines}
    mig = lines["h100 mig reserved"]
    # job 3 (the MIG slice of 9984 MiB) runs from hour 1 to hour 4 of the first record's start
    assert list(mig.get_xdata()) == [1.0, 1.0, 4.0, 4.0]
    assert list(mig.get_ydata()) == [0.0, 9984 / 1024, 9984 / 1024, 0.0]
    # the a100 MPS shares: alice's job 1 (hours 0-2) and carol's job 9 (0.5-1.5) overlap: 10 + 8 GiB
    assert max(lines["a100 mps reserved"].get_ydata()) == 18.0


def test_report_refuses_empty_names_and_a_plot_suffix_before_drawing(tmp_path, monkeypatch):
    """``--plot ''`` printed the table as if no --plot were given, ``--user ''`` reported no records as if a
    user of no name had none, and ``--plot usage.svg`` drew the whole figure before saying .svg is not written."""
    db = tmp_path / "acct.db"
    with Store(db) as st:
        st.add(fixture())

    def no_drawing(*a, **kw):
        raise AssertionError("the figure was drawn for a file that cannot be written")

    monkeypatch.setattr(plot, "figure", no_drawing)
    for args, msg in ((["--plot", ""], "--plot ''"), (["--user", ""], "--user ''"), (["--account", ""], "--account ''"),
                      (["--plot", str(tmp_path / "usage.svg")], "cannot write a .svg file")):
        out = CliRunner().invoke(main, ["report", "--db", str(db), *args])
        assert out.exit_code == 2 and msg in out.output, (args, out.output)


def test_without_matplotlib_plot_names_the_extra_and_the_table_still_prints(tmp_path, monkeypatch):
    """matplotlib is the ``plot`` extra: an installation without it refuses --plot before reading the records,
    naming what to install, and prints the table as before."""
    import sys

    db = tmp_path / "acct.db"
    with Store(db) as st:
        st.add(fixture())
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # import matplotlib... raises ModuleNotFoundError
    import slurm_gpushare.accounting

    monkeypatch.delitem(sys.modules, "slurm_gpushare.accounting.plot")
    monkeypatch.delattr(slurm_gpushare.accounting, "plot")  # or 'from ... import plot' finds the module loaded
    out = CliRunner().invoke(main, ["report", "--db", str(db), "--plot", str(tmp_path / "u.png")])
    assert out.exit_code == 2 and "lacks" in out.output and "slurm-gpushare[plot]" in out.output, out.output
    assert not (tmp_path / "u.png").exists()
    out = CliRunner().invoke(main, ["report", "--db", str(db)])
    assert out.exit_code == 0 and "TOTAL" in out.output, out.output


def _crowd(n_users: int) -> list:
    """``n_users`` users, user ``uK`` with K+1 jobs of one hour each (so the larger K, the more GPU-hours)."""
    out = []
    for k in range(n_users):
        for j in range(k + 1):
            out.append(record(job_id=f"{k}{j:02d}", user=f"u{k:02d}", account=f"a{k % 3}", mem_asked_mib=8192,
                              mem_granted_mib=8192, mem_peak_mib=4096, start=T0 + 60 * j, end=T0 + 60 * j + 3600))
    return out


def test_a_month_of_many_users_stays_readable():
    """Issue 31 item 6: with 25 users the bars and the histogram show the 9 with the most GPU-hours and one
    group of the others (never 25 overlapping labels); the histogram counts jobs in whole numbers; the memory
    panel's legend has one entry per GPU model and mode and one per line style."""
    with Store() as st:
        st.add(_crowd(25))
        fig = plot.figure(st)
        rows = usage_report(st, by="user").rows
    hours, eff, over_time = fig.axes
    labels = [t.get_text() for t in hours.get_xticklabels()]
    assert labels == [f"u{k:02d}" for k in range(24, 15, -1)] + ["16 others"]
    reserved = hours.containers[0]
    assert reserved[-1].get_height() == pytest.approx(sum(r[3] for r in rows[9:]))  # the others' GPU-hours
    assert _legend(eff) == [f"u{k:02d}" for k in range(24, 15, -1)] + ["16 others"]
    assert sum(p.get_height() for c in eff.containers for p in c) == sum(k + 1 for k in range(25))  # every job
    ticks = eff.yaxis.get_major_locator().tick_values(0, 7)
    assert all(float(t).is_integer() for t in ticks)
    assert _legend(over_time) == ["a100 mps", "reserved", "used (peak)"]


def test_the_title_names_the_period_the_records_span():
    """Issue 31 item 6: without --since/--until the title gives the first start and the last end of the records
    (it said "to -"); with one bound given, that bound and the records' other end."""
    with Store() as st:
        st.add(_crowd(2))
        fmt = "%Y-%m-%d %H:%M"
        first, last = time.strftime(fmt, time.localtime(T0)), time.strftime(fmt, time.localtime(T0 + 60 + 3600))
        assert plot.figure(st)._suptitle.get_text() == f"slurm-gpushare: GPU usage, {first} to {last}"
        since = time.strftime(fmt, time.localtime(T0 + 1800))
        assert plot.figure(st, since=T0 + 1800)._suptitle.get_text() == \
            f"slurm-gpushare: GPU usage, {since} to {last}"
        assert " to -" not in plot.figure(st, since=T0 + 1800)._suptitle.get_text()


def test_the_title_keeps_a_given_bound_when_no_record_matches():
    """A ``--since`` without records in the period still shows in the title, the unknown end as ``-``."""
    fmt = "%Y-%m-%d %H:%M"
    with Store() as st:
        st.add(_crowd(2))
        since = T0 + 100 * 3600
        assert plot.figure(st, since=since)._suptitle.get_text() == \
            f"slurm-gpushare: GPU usage, {time.strftime(fmt, time.localtime(since))} to -"


def test_both_panels_count_the_same_others():
    """The histogram's "others" group is the bar chart's: every group after the top ones, with or without a
    measured peak (10 of 25 users have none here)."""
    with Store() as st:
        st.add([r if int(r.user[1:]) >= 10 else replace(r, mem_peak_mib=None) for r in _crowd(25)])
        hours, eff, _ = plot.figure(st).axes
    assert [t.get_text() for t in hours.get_xticklabels()][-1] == "16 others"
    assert _legend(eff)[-1] == "16 others"
