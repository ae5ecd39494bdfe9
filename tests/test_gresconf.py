"""gres.conf record order: the order slurmd numbers devices in (grouped by type), Links following it."""

from __future__ import annotations

from slurm_gpushare.gresconf.render import generate_node_gres
from slurm_gpushare.hardware.machine import CpuLayout, Gpu, Link, Machine
from slurm_gpushare_dev.cluster import packaged_machine


def test_mixed_models_are_grouped_by_type_and_links_follow_the_new_order():
    # GPU 0 and 2 are A100s joined by 12 NVLinks, 1 and 3 are V100s joined by 2: interleaved indices
    gpus = tuple(Gpu(i, i, "NVIDIA A100-SXM4-80GB" if i % 2 == 0 else "Tesla V100-SXM2-16GB",
                     81920 if i % 2 == 0 else 16160) for i in range(4))
    links = (Link(0, 2, nvlinks=12), Link(1, 3, nvlinks=2), Link(0, 1, pcie="SYS"), Link(0, 3, pcie="SYS"),
             Link(1, 2, pcie="SYS"), Link(2, 3, pcie="SYS"))
    node = generate_node_gres(Machine("mixed", gpus, links, cpus=CpuLayout(1, 4)), "mixed")
    gpu = [r for r in node.records if r.name == "gpu"]
    assert [(r.type, r.gpu_index) for r in gpu] == [("a100", 0), ("a100", 2), ("v100", 1), ("v100", 3)]
    # device 0 (GPU 0) is nearest device 1 (GPU 2); device 2 (GPU 1) nearest device 3 (GPU 3)
    assert [r.links for r in gpu] == [(-1, 22, 0, 0), (22, -1, 0, 0), (0, 0, -1, 12), (0, 0, 12, -1)]
    assert list(node.counts) == [("gpu", "a100"), ("gpu", "v100"), ("shard", "")]


def test_mig_node_records_in_slurm_device_order():
    node = generate_node_gres(packaged_machine("4x-h100-mig-mixed.json"), "h100-mig")
    gpu = [(r.type, r.gpu_index, r.mig_gi) for r in node.records if r.name == "gpu"]
    assert gpu == [("h100", 0, None), ("h100", 1, None),
                   ("h100_4g.40gb", 2, 2), ("h100_4g.40gb", 3, 1),
                   ("h100_1g.10gb", 2, 7), ("h100_1g.10gb", 2, 8), ("h100_1g.10gb", 2, 9),
                   ("h100_1g.10gb", 3, 11), ("h100_1g.10gb", 3, 12), ("h100_1g.10gb", 3, 13)]
