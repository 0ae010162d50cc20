"""ParallelDims: the degrees multiply to the world size, and the practitioner's rules hold."""

import pytest

from advisor.mesh import ParallelDims


def test_product_must_be_world_size_and_error_names_every_factor():
    with pytest.raises(ValueError) as err:
        ParallelDims(dp_shard=4, tp=4, world_size=8)
    assert "dp_replicate 1 x dp_shard 4 x cp 1 x tp 4 = 16, not 8" in str(err.value)


def test_degrees_and_labels():
    dims = ParallelDims(dp_replicate=2, dp_shard=4, tp=2, cp=2, world_size=32)
    assert (dims.dp, dims.model_parallel, dims.hybrid) == (8, 4, True)
    assert dims.shape == {"dp_replicate": 2, "dp_shard": 4, "cp": 2, "tp": 2}
    assert dims.label == "dp_replicate 2 x dp_shard 4 x cp 2 x tp 2"
    assert ParallelDims.data_parallel(8).label == "dp 8"
    assert ParallelDims.data_parallel(8).is_data_parallel_only


def test_tp_divides_heads():
    ParallelDims(dp_shard=1, tp=8, world_size=8).check_model(num_attention_heads=32, num_kv_heads=8)
    with pytest.raises(ValueError, match="does not divide the model's 8 key/value heads"):
        ParallelDims(tp=16, world_size=16).check_model(num_attention_heads=32, num_kv_heads=8)


def test_cp_divides_sequence_and_stays_in_node():
    ParallelDims(cp=4, world_size=4).check_sequence(8192)
    with pytest.raises(ValueError, match="divisible by 8"):
        ParallelDims(cp=4, world_size=4).check_sequence(1001)
    with pytest.raises(ValueError, match="span more than one node"):
        ParallelDims(tp=8, cp=2, world_size=16).check_node(8)
    ParallelDims(tp=8, cp=2, world_size=16).check_node(8, allow_cross_node=True)


# Pipeline and expert parallelism (issue 23).

def test_pp_is_outermost_and_in_the_product():
    from advisor.mesh import DIM_NAMES

    assert DIM_NAMES == ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # torchtitan's order
    dims = ParallelDims(pp=4, dp_shard=8, tp=4, world_size=128, ep=8)
    assert dims.shape == {"pp": 4, "dp_shard": 8, "tp": 4}
    assert dims.label == "pp 4 (1f1b) x dp_shard 8 x tp 4 (ep 8)"
    assert (dims.dp, dims.expert_data_parallel, dims.is_data_parallel_only) == (8, 1, False)
    with pytest.raises(ValueError, match="pp 2 x dp_replicate 1 x dp_shard 4 x cp 1 x tp 2 = 16, not 8"):
        ParallelDims(pp=2, dp_shard=4, tp=2, world_size=8)


def test_json_without_pp_or_ep_is_unchanged():
    assert ParallelDims(dp_shard=4, tp=2, world_size=8).model_dump(mode="json") == {
        "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 2, "world_size": 8}
    assert ParallelDims(pp=2, dp_shard=4, world_size=8).model_dump(mode="json")["pp_schedule"] == "1f1b"


@pytest.mark.parametrize("kwargs, message", [
    (dict(dp_shard=8, ep=3, world_size=8), "ep 3 must divide dp_shard 8 x cp 1 = 8"),
    (dict(dp_shard=2, tp=4, ep=4, world_size=8), "ep 4 must divide dp_shard 2 x cp 1 = 2"),
    (dict(pp=2, dp_shard=2, virtual_stages=2, world_size=4), "virtual stages 2 need an interleaved schedule"),
    (dict(pp=2, dp_shard=2, pp_schedule="zbv", virtual_stages=3, world_size=4), "zbv runs exactly 2 model chunks"),
    (dict(pp=2, dp_shard=2, pp_layers=(16,), world_size=4), "must give pp 2 positive layer counts"),
])
def test_pipeline_and_expert_rules(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelDims(**kwargs)


def test_pp_divides_layers_unless_split_and_ep_divides_experts():
    with pytest.raises(ValueError, match=r"^--pp 3 does not divide the model's 32 layers"):
        ParallelDims(pp=3, world_size=3).check_layers(num_layers=32, num_experts=None)
    ParallelDims(pp=3, world_size=3, pp_layers=(10, 11, 11)).check_layers(num_layers=32, num_experts=None)
    with pytest.raises(ValueError, match="sum to 31, not the model's 32 layers"):
        ParallelDims(pp=3, world_size=3, pp_layers=(10, 10, 11)).check_layers(num_layers=32, num_experts=None)
    with pytest.raises(ValueError, match="pp 4 x 2 chunks = 8 does not divide the model's 36 layers"):
        ParallelDims(pp=4, pp_schedule="zbv", world_size=4).check_layers(num_layers=36, num_experts=None)
    with pytest.raises(ValueError, match=r"^--ep 3 does not divide the model's 8 experts$"):
        ParallelDims(dp_shard=6, ep=3, world_size=6).check_layers(num_layers=32, num_experts=8)
    with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
        ParallelDims(dp_shard=2, ep=2, world_size=2).check_layers(num_layers=32, num_experts=None)


def test_pp_across_nodes_before_tp():
    with pytest.raises(ValueError, match="put pipeline stages across nodes"):
        ParallelDims(tp=16, dp_shard=2, world_size=32).check_node(8)
    with pytest.raises(ValueError, match="keep TP and CP inside a node"):
        ParallelDims(pp=2, tp=16, world_size=32).check_node(8)
    ParallelDims(pp=4, tp=8, world_size=32).check_node(8)


def test_stage_layers_and_chunks():
    assert ParallelDims(pp=4, world_size=4).stage_layers(32) == (8, 8, 8, 8)
    assert ParallelDims(pp=2, world_size=2, pp_layers=(15, 17)).stage_layers(32) == (15, 17)
    assert ParallelDims(pp=2, world_size=2, pp_schedule="dualpipev").chunks_per_rank == 2
    assert ParallelDims(pp=2, world_size=2, pp_schedule="interleaved_1f1b", virtual_stages=4).chunks_per_rank == 4
