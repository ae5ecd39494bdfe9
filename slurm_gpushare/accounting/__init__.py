"""Per-job GPU usage accounting: the record, the node's spool, the SQLite store.

Flow (see docs/accounting.md):

1. while a job runs, the node monitor samples NVML and keeps each job's peak memory and SM
   utilization per GPU (:class:`~slurm_gpushare.accounting.record.UsageTracker`);
2. the Epilog builds one :class:`~slurm_gpushare.accounting.record.UsageRecord` per job and GPU
   (:func:`~slurm_gpushare.node.records.records_for_job`) and appends them to the node's
   spool (:class:`~slurm_gpushare.accounting.spool.Spool`): one fsynced JSON line each, so nothing
   is lost when no database is reachable;
3. ``slurm-gpushare accounting ingest`` loads spool files into the embedded SQLite store
   (:class:`~slurm_gpushare.accounting.store.Store`), idempotently;
4. ``slurm-gpushare report`` (:mod:`slurm_gpushare.accounting.report`) aggregates the store.

Importing this package does nothing (no file is opened, no database touched).
"""

from slurm_gpushare.accounting.record import (
    RECORD_VERSION,
    RecordError,
    Usage,
    UsageRecord,
    UsageTracker,
    exit_from_env,
    merge_summary,
    summary_segment,
)
from slurm_gpushare.accounting.spool import DEFAULT_SPOOL_DIR, Spool, spool_files
from slurm_gpushare.accounting.store import DEFAULT_DB, IngestResult, Skipped, Store, StoreError

__all__ = [
    "DEFAULT_DB",
    "DEFAULT_SPOOL_DIR",
    "RECORD_VERSION",
    "IngestResult",
    "RecordError",
    "Skipped",
    "Spool",
    "Store",
    "StoreError",
    "Usage",
    "UsageRecord",
    "UsageTracker",
    "exit_from_env",
    "merge_summary",
    "spool_files",
    "summary_segment",
]
