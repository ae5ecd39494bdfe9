"""What each Slurm release accepts in gres.conf, where releases differ (pure).

Every fact names its source in SchedMD's Slurm source tree (``src/common/gres.c`` at
``slurm-22-05-8-1``, ``src/interfaces/gres.c`` from 23.02 on) or gres.conf(5) at that tag; the
release a value first appears in is the first ``YY.MM`` tag whose source has it.

* ``AutoDetect=`` (``_handle_autodetect_flags``): ``nvml``, ``rsmi``, ``oneapi``, ``off`` in 22.05;
  ``nrt`` from 23.11; ``nvidia`` from 24.11; ``full`` from 26.05. Slurm matches the value as a
  substring (``xstrcasestr``) and logs "unknown autodetect flag" for anything else, leaving
  autodetection unset.
* ``Flags=`` items (``gres_flags_parse``): ``CountOnly``, ``nvidia_gpu_env``, ``amd_gpu_env``,
  ``intel_gpu_env``, ``opencl_env``, ``one_sharing``, ``all_sharing``, ``no_gpu_env`` in 22.05;
  ``explicit`` from 23.02; ``env_uuid`` from 26.05. Items are found as substrings of the whole value,
  so an unknown item is ignored without a word.
* ``Cores=`` against the node's sockets (``_check_core_range_matches_sock``, absent up to 24.05,
  added in 24.11.0, tightened in 25.11.0; no flag or parameter turns it off): see
  :func:`cores_problem`. slurmd's registration then fails with EINVAL and slurmctld sets the node
  INVAL with the message as its reason.
* ``Links=`` (``_compare_gres_by_links``, from 24.05): the scheduler sorts candidate GPUs by their
  summed links to the GPUs a job already holds in ascending order, so it takes the least linked
  first; :func:`links_for_release` writes the values reversed for those releases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from slurm_gpushare.slurm.hostlist import format_ranges
from slurm_gpushare.slurm.release import CORES_ONE_SOCKET, CORES_WHOLE_SOCKETS, LINKS_LEAST_FIRST, Release

#: ``AutoDetect=`` values and the release each first appears in.
AUTODETECT_SINCE = {"nvml": Release(22, 5), "rsmi": Release(22, 5), "oneapi": Release(22, 5),
                    "off": Release(22, 5), "nrt": Release(23, 11), "nvidia": Release(24, 11),
                    "full": Release(26, 5)}
#: ``AutoDetect=`` values that need slurmd built with a vendor library (``HAVE_NVML``, ``HAVE_RSMI``,
#: ``HAVE_ONEAPI``): the plugin it loads, the library and what slurmd logs when it was built without it
#: and falls back to gpu/generic, detecting nothing (``_get_gpu_type`` in src/common/gpu.c at
#: slurm-22-05-8-1, src/interfaces/gpu.c at slurm-24-11-5-1 and slurm-26-05-3-1). Measured: Debian 12's
#: slurm-wlm 22.05.8 ships gpu_generic.so only; the 24.11.5 and 26.05.5 packages have no gpu_nvml.so nor
#: gpu_rsmi.so (``AutoDetect=nvidia``, 24.11 on, needs no vendor library at build time).
AUTODETECT_BUILD_OPTION = {
    "nvml": ("gpu_nvml.so", "NVML", "We were configured to autodetect nvml functionality, but we weren't able to "
             "find that lib when Slurm was configured."),
    "rsmi": ("gpu_rsmi.so", "ROCm SMI", "Configured with rsmi, but rsmi isn't enabled during the build."),
    "oneapi": ("gpu_oneapi.so", "oneAPI", "Configured with oneAPI, but oneAPI isn't enabled during the build."),
}
#: ``Flags=`` items (lower case) and the release each first appears in.
FLAGS_SINCE = {"countonly": Release(22, 5), "nvidia_gpu_env": Release(22, 5), "amd_gpu_env": Release(22, 5),
               "intel_gpu_env": Release(22, 5), "opencl_env": Release(22, 5), "one_sharing": Release(22, 5),
               "all_sharing": Release(22, 5), "no_gpu_env": Release(22, 5), "explicit": Release(23, 2),
               "env_uuid": Release(26, 5)}
#: The ``Flags=`` items that set job environment variables (``GRES_CONF_ENV_SET``): ``no_gpu_env``
#: beside any of them is fatal to slurmd on every release.
ENV_FLAGS = ("nvidia_gpu_env", "amd_gpu_env", "intel_gpu_env", "opencl_env")


def autodetect_values(release: Release) -> tuple[str, ...]:
    """The ``AutoDetect=`` values ``release`` knows, in the order of :data:`AUTODETECT_SINCE`."""
    return tuple(v for v, since in AUTODETECT_SINCE.items() if since <= release)


def flag_values(release: Release) -> tuple[str, ...]:
    """The ``Flags=`` items (lower case) ``release`` knows."""
    return tuple(v for v, since in FLAGS_SINCE.items() if since <= release)


@dataclass(frozen=True)
class CoresProblem:
    """Why a release's slurmd refuses a ``Cores=`` value.

    Attributes:
        socket: the first socket (0-based) slurmd's check stops at, the one its message names: from
            25.11 that is the first socket the value touches when it touches several, even a whole one
            (``Cores=0-47`` of 2 x 32 cores: socket 0); see :attr:`split` and :attr:`spans` for what is wrong.
        first, last: that socket's core ids (inclusive).
        rule: the rule in words, for messages.
        fix: the ``Cores=`` value that release accepts for the same GPU (the sockets touched, or
            every core of the node where one socket is not enough).
        split: ``(socket, first core, last core)`` of each socket the value covers in part.
        touched: the sockets the value has cores of.
        spans: the value touches several sockets where the release takes at most one (25.11 on).
    """

    socket: int
    first: int
    last: int
    rule: str
    fix: tuple[int, ...]
    split: tuple[tuple[int, int, int], ...] = ()
    touched: tuple[int, ...] = ()
    spans: bool = False

    def describe(self) -> str:
        """What is wrong in words: ``spans sockets 0-1 and splits socket 1 (cores 32-63)``."""
        parts = [f"spans sockets {format_ranges(self.touched)}"] if self.spans else []
        if self.split:
            parts.append("splits " + " and ".join(f"socket {s} (cores {a}-{b})" for s, a, b in self.split))
        return " and ".join(parts)

    def slurmd_message(self, cores: Iterable[int], node: str, gres: str = "gpu") -> str:
        """The reason slurmd gives (``_check_core_range_matches_sock``), for messages and docs."""
        return (f"gres/{gres} GRES core specification {format_ranges(sorted(set(cores)))} for node {node} "
                f"doesn't match socket boundaries. (Socket {self.socket} is cores {self.first}-{self.last})")


def cores_problem(cores: Iterable[int], sockets: int, cores_per_socket: int,
                  release: Release) -> CoresProblem | None:
    """Whether ``release``'s slurmd refuses ``Cores=cores`` on a node of ``sockets`` x ``cores_per_socket``.

    The rules (``_check_core_range_matches_sock`` in src/interfaces/gres.c; the sockets and cores per
    socket are those slurmd registers: slurm.conf's with ``SlurmdParameters=config_overrides``, else
    the hardware's):

    * up to 24.05: no check;
    * 24.11 to 25.05 (:data:`~slurm_gpushare.slurm.release.CORES_WHOLE_SOCKETS`): every socket has
      all of its cores in ``Cores=`` or none (``slurm-24-11-5-1``);
    * from 25.11 (:data:`~slurm_gpushare.slurm.release.CORES_ONE_SOCKET`): ``Cores=`` is every core of
      the node (no socket affinity) or exactly one whole socket: commit "Don't allow gres to have
      affinity to multiple sockets" and "Allow all cores to be set" (``slurm-26-05-3-1``).

    Ids at or beyond ``sockets * cores_per_socket`` are left to the core-count lint ("invalid GRES
    core specification" comes first in slurmd) and ignored here.

    Returns:
        None when the release accepts the value, else the first socket where it fails and the fix.
    """
    total = sockets * cores_per_socket
    ids = {c for c in cores if 0 <= c < total}
    if release < CORES_WHOLE_SOCKETS or not ids or cores_per_socket <= 0:
        return None
    one_socket = release >= CORES_ONE_SOCKET
    if one_socket and len(ids) == total:
        return None
    touched = sorted({c // cores_per_socket for c in ids})
    split = tuple((s, s * cores_per_socket, (s + 1) * cores_per_socket - 1) for s in touched
                  if sum(1 for c in ids if c // cores_per_socket == s) < cores_per_socket)
    for s in range(sockets):
        first = s * cores_per_socket
        n = sum(1 for c in ids if first <= c < first + cores_per_socket)
        if n == 0:
            continue
        if n == cores_per_socket and (not one_socket or n == len(ids)):
            continue
        if one_socket:
            rule = (f"Slurm {release} takes Cores= of exactly one whole socket or of every core "
                    "(no socket affinity)")
            fix = tuple(range(total)) if len(touched) > 1 else _sockets(touched, cores_per_socket)
        else:
            rule = f"Slurm {release} takes Cores= only as whole sockets"
            fix = _sockets(touched, cores_per_socket)
        return CoresProblem(s, first, first + cores_per_socket - 1, rule, fix, split=split, touched=tuple(touched),
                            spans=one_socket and len(touched) > 1)
    return None


def _sockets(sockets: Iterable[int], cores_per_socket: int) -> tuple[int, ...]:
    return tuple(c for s in sockets for c in range(s * cores_per_socket, (s + 1) * cores_per_socket))


def cores_for_release(cores: tuple[int, ...], sockets: int, cores_per_socket: int,
                      release: Release) -> tuple[int, ...]:
    """``cores`` as ``release`` accepts them: unchanged where :func:`cores_problem` finds nothing, else
    widened to the whole sockets they touch (24.11), or to one socket or every core (25.11 on)."""
    problem = cores_problem(cores, sockets, cores_per_socket, release)
    return cores if problem is None else problem.fix


def links_for_release(links: list[list[int]], release: Release) -> list[list[int]]:
    """The ``Links=`` matrix to write for ``release``, so that its scheduler prefers the best-linked GPUs.

    Up to 24.02 Slurm takes, for each further GPU of a job, the free one with the most links to the
    GPUs already taken: the matrix (``-1`` on the diagonal, higher = better connected; see
    :func:`slurm_gpushare.topology.hops.slurm_links`) is written as it is. From
    :data:`~slurm_gpushare.slurm.release.LINKS_LEAST_FIRST` (24.05) it takes the one with the fewest
    (an ascending sort), so every value ``v >= 0`` is written as ``top - v`` (``top``: the largest value
    of the matrix): the order of every pair is reversed, and so is the order of the sums Slurm compares.
    A matrix without any link (all 0) stays as it is.

    Args:
        links: square matrix, rows and columns in gres.conf device order.
        release: the Slurm release that reads the file.

    Returns:
        a new matrix of the same shape.
    """
    if release < LINKS_LEAST_FIRST:
        return [list(row) for row in links]
    top = max((v for row in links for v in row), default=0)
    return [[v if v < 0 else top - v for v in row] for row in links]
