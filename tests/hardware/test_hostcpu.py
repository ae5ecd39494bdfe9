"""Reading the host CPU layout from a sysfs tree (a recorded layout written into tmp_path)."""

from __future__ import annotations

import pytest

from slurm_gpushare.errors import HardwareError
from slurm_gpushare.hardware.hostcpu import read_cpu_layout


def _sysfs(root, cpus):
    """cpus: list of (package, core_id) by logical CPU id."""
    for n, (pkg, core) in enumerate(cpus):
        d = root / f"cpu{n}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{pkg}\n")
        (d / "core_id").write_text(f"{core}\n")
    (root / "cpufreq").mkdir()  # not a cpuN directory: ignored
    return root


def test_linux_smt_enumeration_gives_the_default_mapping(tmp_path):
    # 2 sockets x 4 cores x 2 threads, siblings after all first threads (cpu 8 is cpu 0's sibling)
    first = [(s, c) for s in range(2) for c in range(4)]
    layout = read_cpu_layout(_sysfs(tmp_path, first + first))
    assert (layout.sockets, layout.cores_per_socket, layout.threads_per_core) == (2, 4, 2)
    assert layout.core_of_cpu == ()
    assert layout.core_ids([0, 8, 1, 9]) == (0, 1)


def test_interleaved_siblings_and_sparse_core_ids_map_to_slurm_cores(tmp_path):
    # siblings adjacent (cpu 0,1 = core 0) and core_id values with gaps (0, 4) as on many AMD parts
    cpus = [(0, 0), (0, 0), (0, 4), (0, 4), (1, 0), (1, 0), (1, 4), (1, 4)]
    layout = read_cpu_layout(_sysfs(tmp_path, cpus))
    assert (layout.sockets, layout.cores_per_socket, layout.threads_per_core) == (2, 2, 2)
    assert layout.core_of_cpu == (0, 0, 1, 1, 2, 2, 3, 3)
    assert layout.core_ids([6, 7]) == (3,)


def test_no_topology_is_a_clear_error(tmp_path):
    with pytest.raises(HardwareError, match="no CPU topology"):
        read_cpu_layout(tmp_path)


def test_uneven_sockets_are_refused(tmp_path):
    with pytest.raises(HardwareError, match="different core counts"):
        read_cpu_layout(_sysfs(tmp_path, [(0, 0), (0, 1), (1, 0)]))
