"""Which Slurm release the product talks to, read from Slurm itself, never guessed.

Two sources, both written by Slurm: the version line of a client (``sinfo -V``: ``slurm 24.11.5``,
``slurm-wlm 22.05.8`` on Debian) and the ``meta`` block of every ``--json`` output (sinfo(1), squeue(1),
scontrol(1)): ``meta.Slurm.version`` with numbers on 22.05 (openapi/v0.0.38), ``meta.slurm.version`` with
strings from 23.02 on (data_parser v0.0.39 and later; 24.11: v0.0.42, 26.05: v0.0.45, measured). The
adapters of :mod:`slurm_gpushare.slurm` pick a shape from the release of the output they hold.

A release newer than the newest known (:data:`NEWEST`) is read with the newest known shapes; where a
field is not there, the adapter raises an error naming the release and the field (:func:`missing`),
never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_gpushare.errors import SlurmError


@dataclass(frozen=True, order=True)
class Release:
    """A Slurm release ``YY.MM`` (``22.05``): ordered, so ``release >= JSON_TOP_LEVEL_SINFO`` reads."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major:02d}.{self.minor:02d}"

    @classmethod
    def parse(cls, text: str) -> Release:
        """``22.05``, ``24.11.5``, ``slurm 24.11.5``, ``slurm-wlm 22.05.8`` -> the release.

        Raises:
            SlurmError: no ``YY.MM`` version in ``text``.
        """
        m = re.search(r"\b(\d{2})\.(\d{1,2})(?:\.\d+)?\b", text)
        if not m:
            raise SlurmError(f"no Slurm version in {text.strip()[:80]!r}", hint="expected e.g. 'slurm 24.11.5'")
        return cls(int(m.group(1)), int(m.group(2)))


#: The releases this product is tested on (docs/compatibility.md).
SUPPORTED = (Release(22, 5), Release(24, 11), Release(26, 5))
OLDEST, NEWEST = SUPPORTED[0], SUPPORTED[-1]
#: From this release on: ``sinfo --json`` lists ``sinfo`` entries (no ``nodes``), JSON ``meta.slurm``,
#: numbers as ``{"set", "infinite", "number"}`` objects, and srun takes the job's GRES after the
#: job_submit rewrite from the allocation (no cli_filter hop needed).
DATA_PARSER = Release(23, 2)
#: From this release on TRES strings are written ``gres/gpu:1`` (before: ``gres:gpu:1``).
TRES_SLASH = Release(23, 11)
#: From this release on ``scontrol show job ID --json`` gives one job (before: no ``--json``).
SCONTROL_JSON = Release(23, 2)
#: From this release on slurmd refuses (node state INVAL) GRES ``Cores=`` that split a socket
#: (``_check_core_range_matches_sock`` in src/interfaces/gres.c, first in slurm-24-11-0-1; absent
#: at slurm-24-05-8-1; measured on 24.11.5; 22.05 accepted the same file).
CORES_WHOLE_SOCKETS = Release(24, 11)
#: From this release on GRES ``Cores=`` must be one whole socket or every core of the node (the same
#: function, first so in slurm-25-11-0-1: "Don't allow gres to have affinity to multiple sockets").
CORES_ONE_SOCKET = Release(25, 11)
#: From this release on slurmctld picks a job's GPUs least linked first: ``_compare_gres_by_links`` in
#: src/plugins/select/cons_tres/gres_select_filter.c sorts the candidates by their summed ``Links=`` to the
#: GPUs already picked in ascending order (commit de37ab428a "Sort links instead of using double for
#: loop", first in slurm-24-05-0-1; the same at slurm-26-05-3-1 and on master in 2026-08), where its
#: comment and 22.05 take the most linked. Measured: two A100s of the 8x A100 bridge node came out as
#: the unbridged 0,1 on 24.11.5 and 26.05.5, the bridged 0,2 on 22.05.8, from the same ``Links=``.
LINKS_LEAST_FIRST = Release(24, 5)
#: From this release on ``sacctmgr modify job set AdminComment=`` stores the text as given: before, sacctmgr
#: lowercased it, quoted or not (``strip_quotes(..., make_lower=1)`` in src/sacctmgr/job_functions.c at
#: slurm-22-05-8-1; commit 933bf55510 "sacctmgr - do not force AdminComment/Comment/SystemComment to
#: lower-case", Slurm bug 14338, first in slurm-23-02-0-1; measured on 22.05.8).
SACCTMGR_KEEPS_CASE = Release(23, 2)
#: From this release on a ``MultipleFiles=`` GPU record stays one GRES next to shards (before, the
#: shard list split it into one GRES per file: fixed in 23.02.7, "gpu/nvml - Do not split GRES with
#: MultipleFiles in _build_sharing_list"; measured on 22.05.8). gres.conf(5) has ``MultipleFiles``
#: from 22.05.
MULTIPLE_FILES = Release(23, 11)
#: From this release on ``scontrol reconfigure`` takes a changed count of ``File=`` GRES: it restarts
#: slurmctld. 22.05 refuses (measured on the dev cluster: slurmctld logs "Attempt to change gres/gpu Count
#: on node NODE from 10 to 16 invalid with File configuration" and keeps the old GRES).
RECONFIGURE_RESTARTS = Release(23, 11)
#: From this release on slurmd compares every flag bit of a gres.conf line with the line before it of the same
#: GRES name (``all_sharing`` is none), not only the env flags and ``no_gpu_env`` (``_parse_gres_config``,
#: src/common/gres.c at slurm-22-05-8-1, src/interfaces/gres.c at slurm-24-11-5-1).
GRES_FLAGS_EVERY_BIT = Release(23, 2)
#: From this release on slurmd again compares only the ``Flags=`` lines with an env flag or ``no_gpu_env``
#: (src/interfaces/gres.c at slurm-26-05-3-1); 23.02 to 25.11 compare every one.
GRES_FLAGS_ENV_ONLY = Release(26, 5)


def of_meta(doc: object, source: str) -> Release:
    """The release that wrote a ``--json`` document, from its ``meta`` block.

    Raises:
        SlurmError: no ``meta`` version (not Slurm's JSON, or a shape no known release writes).
    """
    meta = doc.get("meta") if isinstance(doc, Mapping) else None
    if isinstance(meta, Mapping):
        for key in ("slurm", "Slurm"):
            block = meta.get(key)
            version = block.get("version") if isinstance(block, Mapping) else None
            if isinstance(version, Mapping):
                try:
                    return Release(int(version["major"]), int(version["minor"]))
                except (KeyError, TypeError, ValueError):
                    pass
    raise SlurmError(f"{source} has no meta.slurm.version: not the JSON of a known Slurm release",
                     source=source, hint=f"supported: {', '.join(map(str, SUPPORTED))}")


def missing(release: Release, source: str, field: str) -> SlurmError:
    """The error of an adapter that does not find ``field`` in ``source`` written by ``release``."""
    newer = release > NEWEST
    return SlurmError(f"{source} of Slurm {release} has no {field}" +
                      (f" (Slurm {release} is newer than {NEWEST}, the newest release this version knows)"
                       if newer else ""), source=source,
                      hint="upgrade slurm-gpushare" if newer else "is this Slurm's own output?")


