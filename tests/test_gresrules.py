"""What each Slurm release accepts in gres.conf (slurm_gpushare.slurm.gresrules), value by value.

Every expected value is read from SchedMD's source at the tag named in the test (the rules module
cites the functions); the real daemons judge the generated files in tests/test_gres_slurm.py.
"""

from __future__ import annotations

import pytest

from slurm_gpushare.slurm.gresrules import (
    autodetect_values,
    cores_for_release,
    cores_problem,
    flag_values,
    links_for_release,
)
from slurm_gpushare.slurm.release import (
    CORES_ONE_SOCKET,
    CORES_WHOLE_SOCKETS,
    LINKS_LEAST_FIRST,
    MULTIPLE_FILES,
    Release,
)

R2205, R2302, R2311, R2405, R2411, R2505, R2511, R2605 = (
    Release(22, 5), Release(23, 2), Release(23, 11), Release(24, 5), Release(24, 11), Release(25, 5),
    Release(25, 11), Release(26, 5))


def test_release_boundaries_from_the_source():
    # _check_core_range_matches_sock: first at slurm-24-11-0-1, one-socket form first at slurm-25-11-0-1;
    # _build_sharing_list keeps MultipleFiles whole from 23.02.7 (so every 23.11)
    assert (CORES_WHOLE_SOCKETS, CORES_ONE_SOCKET, MULTIPLE_FILES) == (R2411, R2511, R2311)


def test_autodetect_values_per_release():
    # _handle_autodetect_flags at slurm-22-05-8-1, slurm-23-11-0-1, slurm-24-11-5-1, slurm-26-05-3-1
    assert autodetect_values(R2205) == ("nvml", "rsmi", "oneapi", "off")
    assert autodetect_values(R2311) == ("nvml", "rsmi", "oneapi", "off", "nrt")
    assert autodetect_values(R2411) == ("nvml", "rsmi", "oneapi", "off", "nrt", "nvidia")
    assert autodetect_values(R2605) == ("nvml", "rsmi", "oneapi", "off", "nrt", "nvidia", "full")


def test_flag_values_per_release():
    # gres_flags_parse at slurm-22-05-8-1, slurm-23-02-0-1, slurm-26-05-0-1
    base = {"countonly", "nvidia_gpu_env", "amd_gpu_env", "intel_gpu_env", "opencl_env", "one_sharing",
            "all_sharing", "no_gpu_env"}
    assert set(flag_values(R2205)) == base
    assert set(flag_values(R2302)) == set(flag_values(R2411)) == base | {"explicit"}
    assert set(flag_values(R2605)) == base | {"explicit", "env_uuid"}


# a node of 2 sockets x 2 cores, the one of Slurm's message "(Socket 0 is cores 0-1)"
@pytest.mark.parametrize("release", [R2205, R2405])
def test_no_core_check_before_24_11(release):
    assert cores_problem([0], 2, 2, release) is None
    assert cores_for_release((0,), 2, 2, release) == (0,)


def test_24_11_takes_whole_sockets_one_or_more():
    p = cores_problem([0], 2, 2, R2411)
    assert (p.socket, p.first, p.last, p.fix) == (0, 0, 1, (0, 1))
    assert p.slurmd_message([0], "node1") == (
        "gres/gpu GRES core specification 0 for node node1 doesn't match socket boundaries. "
        "(Socket 0 is cores 0-1)")
    assert cores_problem([0, 1], 2, 2, R2411) is None
    assert cores_problem([0, 1, 2, 3], 2, 2, R2411) is None  # two whole sockets: fine on 24.11
    p = cores_problem([0, 1, 2], 2, 2, R2411)
    assert (p.socket, p.fix) == (1, (0, 1, 2, 3))  # socket 0 is whole, socket 1 is not
    assert cores_problem([1], 2, 2, R2505) is not None


def test_25_11_on_takes_one_whole_socket_or_every_core():
    for release in (R2511, R2605):
        assert cores_problem([0, 1], 2, 2, release) is None
        assert cores_problem([0, 1, 2, 3], 2, 2, release) is None  # all cores: no socket affinity
        # two of three sockets, each whole: refused from 25.11 on, at the first socket
        p = cores_problem([0, 1, 2, 3], 3, 2, release)
        assert (p.socket, p.fix) == (0, (0, 1, 2, 3, 4, 5))
        assert cores_problem([0, 1, 2, 3], 3, 2, R2411) is None
        p = cores_problem([2], 2, 2, release)
        assert (p.socket, p.fix) == (1, (2, 3))


def test_dgx_a100_nps4_numa_node_widens_to_its_socket():
    numa3 = tuple(range(48, 64))
    assert cores_for_release(numa3, 2, 64, R2205) == numa3
    assert cores_for_release(numa3, 2, 64, R2411) == tuple(range(64))
    assert cores_for_release(numa3, 2, 64, R2605) == tuple(range(64))
    # the same node declared with its NUMA domains as sockets (numa_node_as_socket): accepted as is
    assert cores_problem(numa3, 8, 16, R2605) is None


def test_ids_beyond_the_node_are_left_to_the_core_count_lint():
    assert cores_problem([4], 2, 2, R2411) is None


def test_links_from_24_05_are_written_so_that_slurms_ascending_sort_picks_the_most_linked():
    # gres_select_filter.c (_compare_gres_by_links, slurm-24-05-0-1 to 26.05 and master) sorts the
    # candidate GPUs by their summed Links= to the GPUs already picked in ascending order, so it takes
    # the least linked first; 22.05 picked the most linked. The 8x A100 bridge pairs: 0-2 NV12 (22).
    links = [[-1, 0, 22, 0], [0, -1, 0, 22], [22, 0, -1, 0], [0, 22, 0, -1]]
    assert links_for_release(links, Release(22, 5)) == links
    assert LINKS_LEAST_FIRST == Release(24, 5)
    flipped = links_for_release(links, Release(24, 11))
    assert flipped == [[-1, 22, 0, 22], [22, -1, 22, 0], [0, 22, -1, 22], [22, 0, 22, -1]]
    assert links_for_release(links, Release(26, 5)) == flipped
    # the order of every pair is kept reversed: NVLink (10+n) < switch (10) < PIX .. NODE < SYS
    ranks = [[-1, 4, 10, 18], [4, -1, 1, 0], [10, 1, -1, 3], [18, 0, 3, -1]]
    assert links_for_release(ranks, Release(24, 11)) == [[-1, 14, 8, 0], [14, -1, 17, 18], [8, 17, -1, 15],
                                                       [0, 18, 15, -1]]
    # no link at all stays no link: nothing to prefer
    none = [[-1, 0], [0, -1]]
    assert links_for_release(none, Release(24, 11)) == none
