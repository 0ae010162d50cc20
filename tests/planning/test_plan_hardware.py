"""A plan keeps the validated ``Hardware`` it was made for; callers resize it instead of formatting
and re-parsing a ``--gpus`` string, and the JSON keeps its flat summary."""

from __future__ import annotations

import json

from advisor.hardware.cluster import Hardware, build_hardware, parse_gpus, resize
from advisor.planning.api import plan


def test_plan_keeps_the_hardware_object():
    p = plan("Qwen/Qwen2.5-0.5B", "2x8xH100")
    assert isinstance(p.hardware, Hardware)
    assert (p.hardware.gpu.name, p.hardware.nodes, p.hardware.gpus_per_node) == ("H100-80GB-SXM", 2, 8)
    assert p.hardware.inter_node_link.name == "ib-ndr"  # profiles/gpus.json default for H100 nodes


def test_plan_json_hardware_is_the_flat_summary():
    doc = json.loads(plan("Qwen/Qwen2.5-0.5B", "2x8xH100").model_dump_json())
    assert doc["hardware"] == {"gpu": "H100-80GB-SXM", "gpu_memory_bytes": 85_017_755_648, "gpus_per_node": 8,
                               "nodes": 2, "world_size": 16, "interconnect": "nvlink4 + ib-ndr",
                               "intra_node_link": "nvlink4", "inter_node_link": "ib-ndr"}


def test_resize_keeps_the_gpu_and_chooses_links():
    one = parse_gpus("8xH100")
    two = resize(one, nodes=2)
    assert (two.world_size, two.gpu, two.inter_node_link.name) == (16, one.gpu, "ib-ndr")
    back = resize(two, nodes=1, gpus_per_node=4)
    assert (back.world_size, back.inter_node_link) == (4, None)
    slow = parse_gpus("2x8xH100", interconnect="eth-100g")
    assert resize(slow, nodes=4).inter_node_link.name == "eth-100g"  # the user's link is kept


def test_build_hardware_from_a_launch_keeps_its_node_count():
    """A launch with 16 GPUs in one node is one node of 16, not "16xA100" read as 2 servers of 8."""
    hw = build_hardware("NVIDIA A100-SXM4-80GB", gpus_per_node=16, nodes=1)
    assert (hw.gpu.name, hw.nodes, hw.gpus_per_node, hw.inter_node_link) == ("A100-80GB-SXM", 1, 16, None)
    assert parse_gpus("16xA100").nodes == 2
