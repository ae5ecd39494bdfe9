"""Pictures of the accounting store (``slurm-gpushare report --plot FILE.png|FILE.html``), drawn with matplotlib.

One figure, three panels, over the same records (the report's period and filters):

1. GPU-hours reserved vs used per user (or per account): two bars per group, the numbers of
   :func:`~slurm_gpushare.accounting.report.usage_report` (used: over records with SM data; a group without
   any has no "used" bar, never a bar of 0);
2. memory efficiency: a histogram of the jobs' peak memory over what they asked for (per device, as the
   ``MEM USED%`` column of ``report --by job``), in 10% bins, stacked with one series per user (or
   account); jobs without a measured peak are left out and counted in the title; above 100% is the last bin;
   the job counts are whole numbers;
3. reserved and used GPU memory over time, per GPU model and mode: at each moment, the sum of the memory
   granted to the records running then (solid) and of their peaks (dashed: an upper bound of what they held);
   the legend has one entry per model and mode (its colour) and one per line style.

Panels 1 and 2 show the :data:`TOP_GROUPS` groups with the most GPU-hours reserved, and the rest as one group
(``16 others``), so that a month of a real site's users stays legible. The title gives the period: the report's
``--since``/``--until``, or where one is not given the first start or the last end of the records.

The figure is built without pyplot (no global state, no display: the Agg canvas), and returned for tests;
:func:`write` saves it as PNG, or as an HTML page embedding the PNG (base64 ``data:`` URL, no script).
"""

from __future__ import annotations

import base64
import html
import io
import math
import time
from collections import defaultdict
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from slurm_gpushare.accounting.report import Filters, _period, job_report, usage_report
from slurm_gpushare.accounting.store import Store
from slurm_gpushare.atomicfile import write_atomic
from slurm_gpushare.errors import InputError

#: The groups the bar chart and the histogram may use.
PLOT_GROUPS = ("user", "account")
#: Output suffixes.
SUFFIXES = (".png", ".html")
#: Figure size in inches and resolution: 1400 x 1500 pixels.
FIGSIZE = (14.0, 15.0)
DPI = 100
_BINS = [i * 10.0 for i in range(11)]
#: Groups shown on their own in the bar chart and the histogram; the others are one group.
TOP_GROUPS = 9


def figure(store: Store, *, by: str = "user", since: int | None = None, until: int | None = None,
           filters: Filters | None = None) -> Figure:
    """The three panels (see the module docstring) of the records in the period that pass ``filters``.

    Raises:
        InputError: ``by`` is not user or account, or an empty period.
    """
    if by not in PLOT_GROUPS:
        raise InputError(f"--plot draws per user or per account, not per {by}", hint="give --by user or --by account")
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax_hours, ax_eff, ax_time = fig.subplots(3, 1)
    usage = usage_report(store, by=by, since=since, until=until, filters=filters)
    top = [str(r[0]) for r in usage.rows[:TOP_GROUPS]] if len(usage.rows) > TOP_GROUPS + 1 else None
    _hours(ax_hours, usage, by, top)
    _efficiency(ax_eff, job_report(store, since=since, until=until, filters=filters), by, top,
                len(usage.rows) - len(top) if top is not None else 0)
    first, last = _over_time(ax_time, store, since, until, filters)
    fmt = "%Y-%m-%d %H:%M"
    lo = since if since is not None else first
    hi = until if until is not None else last
    period = "" if lo is None and hi is None else \
        f", {time.strftime(fmt, time.localtime(lo)) if lo is not None else '-'} to " \
        f"{time.strftime(fmt, time.localtime(hi)) if hi is not None else '-'}"
    fig.suptitle(f"slurm-gpushare: GPU usage{period}")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    return fig


def _others(n: int) -> str:
    return f"{n} others"


def _hours(ax, rep, by: str, top: list[str] | None) -> None:
    names = [str(r[0]) for r in rep.rows]
    reserved = [r[3] for r in rep.rows]
    used = [r[4] for r in rep.rows]
    if top is not None:  # the rest as one group: their sums (used over those with SM data, or no bar)
        rest_used = [u for u in used[len(top):] if u is not None]
        names = [*top, _others(len(names) - len(top))]
        reserved = [*reserved[:len(top)], sum(reserved[len(top):])]
        used = [*used[:len(top)], sum(rest_used) if rest_used else None]
    xs = list(range(len(names)))
    ax.bar([x - 0.2 for x in xs], reserved, width=0.4, label="reserved")
    ax.bar([x + 0.2 for x, u in zip(xs, used, strict=True) if u is not None],
           [u for u in used if u is not None], width=0.4, label="used (SM utilization)")
    ax.set_xticks(xs, names)
    ax.set_xlim(-0.6, max(len(names), 1) - 0.4)
    ax.set_xlabel(by)
    ax.set_ylabel("GPU-hours")
    ax.set_title(f"GPU-hours reserved vs used by {by}")
    ax.legend()
    if not names:
        ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes)


def _efficiency(ax, rep, by: str, top: list[str] | None, others_count: int) -> None:
    col = [c.name for c in rep.columns]
    g, pct = col.index(by), col.index("mem_used_pct")
    per: dict[str, list[float]] = defaultdict(list)
    without = 0
    for row in rep.rows:
        if row[pct] is None:
            without += 1
            continue
        name = str(row[g])
        if top is not None and name not in top:
            name = ""  # the others' group: the bar chart's, named by its count of groups
        per[name].append(min(row[pct], 100.0))
    names = [n for n in top if n in per] if top is not None else sorted(per)
    labels = list(names)
    if "" in per:
        names.append("")
        labels.append(_others(others_count))
    if names:
        ax.hist([per[n] for n in names], bins=_BINS, stacked=True, label=labels)
        ax.legend(title=by, ncol=2 if len(names) > 5 else 1)
    else:
        ax.text(0.5, 0.5, "no job with a measured peak", ha="center", va="center", transform=ax.transAxes)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, 100)
    ax.set_xlabel("peak GPU memory / memory asked (%)")
    ax.set_ylabel("jobs")
    title = "Memory efficiency of jobs"
    if without:
        title += f" ({without} without a measured peak not shown)"
    ax.set_title(title)


def _over_time(ax, store: Store, since: int | None, until: int | None,
               filters: Filters | None) -> tuple[int | None, int | None]:
    """Draw panel 3; returns the first start and the last end of the records drawn (within the period), or
    ``(None, None)`` for none."""
    inner, params = _period(since, until, '"gpu_model", "mode", "start", "end", "mem_granted_mib", "mem_peak_mib"',
                            filters, store.dialect)
    rows = store.query(f"SELECT * FROM ({inner}) AS p", params)
    events: dict[tuple[str, str], list[tuple[int, int, int]]] = defaultdict(list)
    lo = since if since is not None else None
    hi = until if until is not None else None
    for model, mode, start, end, granted, peak, _d in rows:
        s = start if lo is None else max(start, lo)
        e = end if hi is None else min(end, hi)
        events[(model, mode)] += [(s, granted, peak or 0), (max(e, s), -granted, -(peak or 0))]
    t0 = min((ev[0] for evs in events.values() for ev in evs), default=0)
    handles, labels = [], []
    for n, key in enumerate(sorted(events)):
        when, reserved, used = [], [], []
        res = use = 0
        # at one moment, ends before starts: a job that follows another does not count twice
        for t, dr, du in sorted(events[key], key=lambda ev: (ev[0], ev[1] > 0)):
            hour = (t - t0) / 3600.0
            when += [hour, hour]  # a step: the level before the change, then after it
            reserved.append(res / 1024.0)
            used.append(use / 1024.0)
            res += dr
            use += du
            reserved.append(res / 1024.0)
            used.append(use / 1024.0)
        color = f"C{n % 10}"
        handles += ax.plot(when, reserved, color=color, label=f"{key[0]} {key[1]} reserved")
        ax.plot(when, used, color=color, linestyle="--", label=f"{key[0]} {key[1]} used (peak)")
        labels.append(f"{key[0]} {key[1]}")
    if events:
        ax.set_xlabel(f"hours since {time.strftime('%Y-%m-%d %H:%M', time.localtime(t0))}")
        # one entry per colour (model and mode), one per line style
        handles += [Line2D([], [], color="black"), Line2D([], [], color="black", linestyle="--")]
        labels += ["reserved", "used (peak)"]
        ax.legend(handles, labels, ncol=max(1, math.ceil(len(handles) / 8)), fontsize="small")
    else:
        ax.set_xlabel("hours")
        ax.text(0.5, 0.5, "no records", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("GPU memory (GiB)")
    ax.set_title("Reserved and used GPU memory over time, per GPU model and mode")
    if not events:
        return None, None
    return t0, max(ev[0] for evs in events.values() for ev in evs)


def check_suffix(path: str | Path) -> str:
    """The suffix of ``path`` (``.png`` or ``.html``, lower case), checked before anything is drawn.

    Raises:
        InputError: another suffix, or none.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise InputError(f"--plot {p}: cannot write a {suffix or 'suffix-less'} file",
                         hint="name a .png file (the picture) or an .html file (a page embedding it)")
    return suffix


def write(fig: Figure, path: str | Path) -> Path:
    """Save ``fig`` as ``.png`` or as ``.html`` (a page embedding the PNG as a ``data:`` URL); the file is
    replaced whole.

    Raises:
        InputError: another suffix, or the file cannot be written.
    """
    p = Path(path)
    suffix = check_suffix(p)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    png = buf.getvalue()
    page = ""
    title = html.escape(fig.get_suptitle() or "slurm-gpushare report")
    if suffix == ".html":
        page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + title + "</title></head>\n<body>\n"
                f"<h1>{title}</h1>\n<img alt=\"{title}\" src=\"data:image/png;base64,"
                + base64.b64encode(png).decode("ascii") + "\">\n</body></html>\n")
    try:
        return write_atomic(p, png if suffix == ".png" else page)
    except OSError as e:
        raise InputError(f"cannot write --plot {p}: {e.strerror or e}",
                         hint="name a file in a directory you may write") from None
