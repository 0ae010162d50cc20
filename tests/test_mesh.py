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
