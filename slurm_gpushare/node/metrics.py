"""The node monitor's Prometheus metrics: a ``prometheus_client`` collector of a
:class:`~slurm_gpushare.node.monitor.Monitor`'s last sample, and :func:`serve`, which samples and serves them.

Metrics (Prometheus text format, :func:`prometheus_client.start_http_server`), all gauges unless said:

=================================================  ================================================
``gpushare_job_gpu_memory_used_bytes``              memory the job's processes hold on the device now
``gpushare_job_gpu_memory_peak_bytes``              highest sampled so far
``gpushare_job_gpu_memory_reserved_bytes``          the job's share: MPS limit, MIG profile, whole GPU
``gpushare_job_gpu_memory_requested_bytes``         what ``gpushare:mem=`` asked (absent when nothing)
``gpushare_job_gpu_sm_utilization_ratio``           SM utilization now, 0-1 (absent when no data)
``gpushare_job_gpu_processes``                      the job's processes on the device
``gpushare_job_gpu_over_limit``                     1 while the job holds more than its share
``gpushare_gpu_memory_used_bytes``, ``..._total_bytes``, ``gpushare_gpu_utilization_ratio``
``gpushare_gpu_unattributed_memory_bytes``          memory of processes of no job on this node
``gpushare_mig_device_info``                        1 per MIG device of the node's GPUs (the MIG layout)
``gpushare_monitor_samples_total`` (counter), ``gpushare_monitor_errors_total`` (counter, ``kind``),
``gpushare_monitor_last_sample_timestamp_seconds``, ``gpushare_monitor_sample_duration_seconds``
``gpushare_monitor_attributed_processes`` (``by``: ``cgroup``, ``slurm``), ``..._refused_attributions_total``
and ``..._slurm_calls_total`` (counters, ``command``: ``listpids``, ``squeue``, ``job``)
=================================================  ================================================

Every fact has one label, named as NVIDIA's dcgm-exporter names it where it has one (:data:`DCGM_LABELS`,
docs/monitoring.md): ``gpu`` (NVML index; the parent GPU's for a MIG device), ``UUID`` (the GPU's, the
parent's for MIG), ``modelName`` (NVML's name), ``pci_bus_id``, ``device`` (``nvidia<minor>``),
``GPU_I_PROFILE`` and ``GPU_I_ID`` (MIG devices only), ``Hostname`` (the Slurm node name), and on job series
``hpc_job`` (the Slurm job id, as dcgm-exporter's HPC job mapping names it). Job series also carry the
product's own ``user, account, partition, mode`` (``mig``, ``mps``, ``gpu``) and ``share`` (MIG profile,
``shard:N``). The monitor's own series carry ``Hostname`` and their ``kind``, ``by``, ``command``, ``action``
or ``outcome``.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_gpushare.atomicfile import write_atomic
from slurm_gpushare.errors import InputError
from slurm_gpushare.node.config import ENFORCE_ACTIONS, parse_listen
from slurm_gpushare.node.gpulimit import OUTCOMES as LIMIT_OUTCOMES

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from slurm_gpushare.node.monitor import Monitor

MIB = 1 << 20
#: Labels of a device, named, ordered and filled as NVIDIA's dcgm-exporter does (its GPU metrics template), so
#: that a site's panels built on DCGM_FI_* series select and join the monitor's series (docs/monitoring.md).
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "Hostname")
#: The job's labels after :data:`DCGM_LABELS` on job series: ``hpc_job`` as dcgm-exporter's HPC job mapping
#: names the job, then the product's own.
JOB_LABELS = ("hpc_job", "user", "account", "partition", "mode", "share")


class MonitorCollector:
    """The metrics of ``monitor``'s last sample, read under its lock (register it in a ``CollectorRegistry``)."""

    def __init__(self, monitor: Monitor):
        self.monitor = monitor

    def collect(self) -> list:
        """Prometheus metric families of the last sample (a ``prometheus_client`` collector's ``collect``)."""
        with self.monitor.lock:
            return list(self._families())

    def _dcgm_labels(self, index: int, mig_uuid: str | None) -> list[str]:
        """The values of :data:`DCGM_LABELS` for GPU ``index`` (-1: unknown) or its MIG device ``mig_uuid``:
        ``UUID`` the (parent) GPU's, ``GPU_I_*`` empty off MIG (Prometheus stores an empty label as no label, as
        dcgm-exporter leaves them out), ``Hostname`` the Slurm node name."""
        m = self.monitor
        gpu = next((g for g in m.machine.gpus if g.index == index), None)
        profile = gi = ""
        if mig_uuid is not None:
            gi_id = next((g_i for (i, g_i), u in m._mig_uuids.items() if i == index and u == mig_uuid), None)
            inst = next((m for m in (gpu.mig_instances if gpu else ()) if m.gi_id == gi_id), None)
            profile = inst.profile if inst else ""
            gi = "" if gi_id is None else str(gi_id)
        if gpu is None:
            return [str(index), "", "", "", "", profile, gi, m.node]
        return [str(index), m._gpu_uuids.get(index, gpu.uuid), gpu.pci_bus_id, f"nvidia{gpu.minor}", gpu.name,
                profile, gi, m.node]

    def _families(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self.monitor

        job_labels = [*DCGM_LABELS, *JOB_LABELS]
        fams = {
            "used": GaugeMetricFamily("gpushare_job_gpu_memory_used_bytes",
                                      "GPU memory the job's processes hold on the device now", labels=job_labels),
            "peak": GaugeMetricFamily("gpushare_job_gpu_memory_peak_bytes",
                                      "Highest GPU memory the job's processes held on the device so far",
                                      labels=job_labels),
            "reserved": GaugeMetricFamily("gpushare_job_gpu_memory_reserved_bytes",
                                          "The job's memory share on the device (MPS limit, MIG profile or whole GPU)",
                                          labels=job_labels),
            "requested": GaugeMetricFamily("gpushare_job_gpu_memory_requested_bytes",
                                           "Memory the job asked for per device (gpushare:mem=)", labels=job_labels),
            "sm": GaugeMetricFamily("gpushare_job_gpu_sm_utilization_ratio",
                                    "SM utilization of the job on the device now, 0-1 (absent: no data)",
                                    labels=job_labels),
            "procs": GaugeMetricFamily("gpushare_job_gpu_processes", "The job's processes on the device",
                                       labels=job_labels),
            "over": GaugeMetricFamily("gpushare_job_gpu_over_limit",
                                      "1 while the job's processes together hold more than its share of the device",
                                      labels=job_labels),
        }
        by_key = {(d.job_id, d.key): d for d in m.snapshot.devices}
        for job_id, job in sorted(m._jobs.items()):
            usage = m.tracker.usage(job_id)
            keys = {d.key for d in m.snapshot.devices if d.job_id == job_id}
            keys |= set(job.devices)
            for key in sorted(keys, key=str):
                rec = job.devices.get(key)
                d = by_key.get((job_id, key))
                index = rec.gpu_index if rec else (d.gpu_index if d else -1)
                labels = [*self._dcgm_labels(index, key if isinstance(key, str) else None), job_id, job.info.user,
                          job.info.account, job.info.partition, rec.mode if rec else "none",
                          rec.share if rec else ""]
                u = usage.get(key)
                if d is not None:
                    fams["used"].add_metric(labels, d.used_mib * MIB)
                    fams["procs"].add_metric(labels, d.processes)
                    if d.sm_percent is not None:
                        fams["sm"].add_metric(labels, round(d.sm_percent / 100, 4))
                if u is not None and u.peak_mib is not None:
                    fams["peak"].add_metric(labels, u.peak_mib * MIB)
                fams["reserved"].add_metric(labels, (rec.mem_granted_mib if rec else 0) * MIB)
                if rec is not None and rec.mem_asked_mib is not None:
                    fams["requested"].add_metric(labels, rec.mem_asked_mib * MIB)
                fams["over"].add_metric(labels, 1 if key in job.over else 0)
        yield from fams.values()

        gpu_labels = list(DCGM_LABELS)
        used = GaugeMetricFamily("gpushare_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=gpu_labels)
        total = GaugeMetricFamily("gpushare_gpu_memory_total_bytes", "GPU memory (NVML)", labels=gpu_labels)
        util = GaugeMetricFamily("gpushare_gpu_utilization_ratio",
                                 "GPU utilization, 0-1 (nvmlDeviceGetUtilizationRates; absent on MIG GPUs)",
                                 labels=gpu_labels)
        stray = GaugeMetricFamily("gpushare_gpu_unattributed_memory_bytes",
                                  "GPU memory of processes that belong to no job running on this node",
                                  labels=gpu_labels)
        stray_n = GaugeMetricFamily("gpushare_gpu_unattributed_processes",
                                    "Processes on the GPU that belong to no job running on this node",
                                    labels=gpu_labels)
        for g in m.snapshot.gpus:
            labels = self._dcgm_labels(g.index, None)
            total.add_metric(labels, g.total_mib * MIB)
            if g.used_mib is not None:
                used.add_metric(labels, g.used_mib * MIB)
            if g.utilization_percent is not None:
                util.add_metric(labels, g.utilization_percent / 100)
            stray.add_metric(labels, g.unattributed_mib * MIB)
            stray_n.add_metric(labels, g.unattributed_processes)
        mig = GaugeMetricFamily("gpushare_mig_device_info",
                                "1 for each MIG device of the node's GPUs (NVML's GPU instances when the monitor "
                                "started, profiles from the machine description): "
                                "the MIG layout, beside which job series with mode=\"mig\" show what is in use",
                                labels=gpu_labels)
        for (index, _gi_id), mig_uuid in sorted(m._mig_uuids.items()):
            mig.add_metric(self._dcgm_labels(index, mig_uuid), 1)
        yield from (used, total, util, stray, stray_n, mig)

        samples = CounterMetricFamily("gpushare_monitor_samples", "Samples taken", labels=["Hostname"])
        samples.add_metric([m.node], m.samples_total)
        errors = CounterMetricFamily("gpushare_monitor_errors", "Failed NVML calls, Slurm commands, usage files",
                                     labels=["Hostname", "kind"])
        for kind in ("nvml", "slurm", "job", "usage-file", "textfile", "admin-comment", "internal"):
            errors.add_metric([m.node, kind], m.errors_total.get(kind, 0))
        episodes = CounterMetricFamily("gpushare_monitor_over_limit_episodes",
                                       "Times a job's processes began to hold more than its share of a device",
                                       labels=["Hostname"])
        episodes.add_metric([m.node], m.over_limit_total)
        last = GaugeMetricFamily("gpushare_monitor_last_sample_timestamp_seconds", "When the last sample was taken",
                                 labels=["Hostname"])
        last.add_metric([m.node], m.snapshot.time)
        took = GaugeMetricFamily("gpushare_monitor_sample_duration_seconds", "How long the last sample took",
                                 labels=["Hostname"])
        took.add_metric([m.node], round(m.snapshot.duration_s, 6))
        refused = CounterMetricFamily("gpushare_monitor_refused_attributions",
                                      "GPU processes not charged to the job whose cgroup or pid list holds them: "
                                      "the job's user is not the process's owner", labels=["Hostname"])
        refused.add_metric([m.node], m.refused_total)
        attributed = GaugeMetricFamily("gpushare_monitor_attributed_processes",
                                       "GPU processes of the last sample charged to a job, by what placed them "
                                       "(cgroup: a job cgroup; slurm: scontrol listpids)", labels=["Hostname", "by"])
        for by in ("cgroup", "slurm"):
            attributed.add_metric([m.node, by], m.attributed.get(by, 0))
        calls = CounterMetricFamily("gpushare_monitor_slurm_calls",
                                    "Slurm commands the monitor ran (listpids: scontrol listpids; squeue; job: one "
                                    "job's record)", labels=["Hostname", "command"])
        for command in ("listpids", "squeue", "job"):
            calls.add_metric([m.node, command], m.calls_total.get(command, 0))
        enforced = CounterMetricFamily("gpushare_monitor_enforcements",
                                       "Actions taken on MPS share jobs whose processes held more than their share "
                                       "for enforce_grace samples (node.toml enforce)", labels=["Hostname", "action"])
        for action in ENFORCE_ACTIONS:
            enforced.add_metric([m.node, action], m.enforced_total.get(action, 0))
        limits = CounterMetricFamily("gpushare_monitor_gpu_memory_limits",
                                     "The driver's memory limit on share jobs' cgroups (node.toml gpu_memory_limit): "
                                     "set, unsupported by the driver, or failed", labels=["Hostname", "outcome"])
        for outcome in LIMIT_OUTCOMES:
            limits.add_metric([m.node, outcome], m.limits_total.get(outcome, 0))
        yield from (samples, errors, episodes, last, took, refused, attributed, calls, enforced, limits)


def monitor_registry(monitor: Monitor) -> CollectorRegistry:
    """A ``prometheus_client`` registry holding ``monitor``'s collector (for the HTTP server and the textfile)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    return registry


def metrics_text(monitor: Monitor) -> str:
    """The metrics of ``monitor``'s last sample in Prometheus text format (what ``/metrics`` serves)."""
    from prometheus_client import generate_latest

    return generate_latest(monitor_registry(monitor)).decode()


# --- serving ----------------------------------------------------------------------------------------------


def serve(monitor: Monitor, *, interval_s: float, listen: str | None, textfile: str | None,
          once: bool = False, stop: Callable[[], bool] = lambda: False) -> None:
    """Run the monitor: sample every ``interval_s`` seconds, serve ``/metrics`` on ``listen`` (None: no
    HTTP), write ``textfile`` (None: none) after each sample (atomically, as node_exporter's textfile
    collector wants). ``once``: one sample, write the textfile, return.

    Raises:
        InputError: a bad listen address, or the port is taken.
    """
    from prometheus_client import generate_latest, start_http_server

    registry = monitor_registry(monitor)
    server = None
    if listen and not once:
        host, port = parse_listen(listen)
        try:
            server = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            hint = ("choose another port with --listen or monitor_listen in node.toml" if e.errno == errno.EADDRINUSE
                    else "give an address of this host (or :PORT for all) with --listen or monitor_listen")
            raise InputError(f"cannot listen on {host}:{port}: {e.strerror or e}", hint=hint) from None
    try:
        while True:
            started = time.monotonic()
            try:
                monitor.sample()
                monitor.push_summaries(force=once)
            except Exception as e:  # a daemon: one bad sample must not end the monitoring
                monitor.note_error("internal", f"sample failed: {type(e).__name__}: {e}")
            if textfile:
                try:
                    Path(textfile).parent.mkdir(parents=True, exist_ok=True)
                    # cheap to lose (the next sample rewrites it): no fsync
                    write_atomic(textfile, generate_latest(registry), fsync=False)
                except OSError as e:
                    monitor.note_error("textfile", f"cannot write {textfile}: {e}")
            if once or stop():
                return
            end = started + interval_s
            while (left := end - time.monotonic()) > 0:
                if stop():
                    return
                time.sleep(min(0.2, left))
    finally:
        if server is not None:
            server[0].shutdown()
            server[0].server_close()

