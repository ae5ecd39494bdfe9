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

Importing this package does nothing (no file is opened, no database touched) and loads none of its
modules: the names below are loaded on first use, so a node hook that writes the spool never loads the
store (SQLite and the ingest's process pool: about 40 ms of every GPU job's Prolog and Epilog).
"""

import importlib

#: The names this package gives, and the module each comes from (loaded on first use: PEP 562).
_NAMES = {
    **dict.fromkeys(("RECORD_VERSION", "RecordError", "Usage", "UsageRecord", "UsageTracker", "exit_from_env",
                     "merge_summary", "summary_segment"), "record"),
    **dict.fromkeys(("DEFAULT_SPOOL_DIR", "Spool", "spool_files"), "spool"),
    **dict.fromkeys(("DEFAULT_DB", "IngestResult", "Skipped", "Store", "StoreError"), "store"),
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
