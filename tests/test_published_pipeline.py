"""profiles/published_pipeline.json: every row parses, is cited, and its settings are those of a run that
could have happened (the model's layers split over its stages, GPUs = stages x tp x dp, the memory under
the card's 80 GB). The truth is the paper's table; these checks keep the copy honest."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import accuracy_pipeline  # noqa: E402
from advisor.model.sources import resolve  # noqa: E402

PUBLISHED = accuracy_pipeline.load_published()


def test_zero_bubble_table_4_is_complete():
    table4 = [row for row in PUBLISHED.rows if row.source.where.startswith("Table 4")]
    assert len(table4) == 16
    assert {(row.model, row.schedule) for row in table4} == {
        (model, schedule) for model in ("zb-gpt3-1.5b", "zb-gpt3-6.2b", "zb-gpt3-14.6b", "zb-gpt3-28.3b")
        for schedule in ("zb-2p", "zb-1p", "1f1b", "interleaved-1f1b")}
    # The paper's own ordering holds in every model: ZB-2p > 1F1B-I > ZB-1p > 1F1B.
    for model in {row.model for row in table4}:
        gb = {row.schedule: row.memory_gb for row in table4 if row.model == model}
        assert gb["zb-2p"] > gb["interleaved-1f1b"] > gb["zb-1p"] > gb["1f1b"]


@pytest.mark.parametrize("name", sorted(PUBLISHED.models))
def test_model_config_resolves_to_its_published_size(name):
    # 1.5B, 6.2B, 14.6B, 28.3B: the name's size within 0.05B (vocab 32000, tied embeddings, positions 2048).
    spec, _ = resolve(PUBLISHED.models[name])
    size = float(name.rsplit("-", 1)[1].rstrip("b"))
    assert abs(spec.total_params / 1e9 - size) < 0.05 + 0.01 * size


def test_table_3_settings():
    # Table 3: layers 22/30/46/62 on 8/8/16/32 stages, micro-batch 6/3/1/1, sequence 1024; the first and
    # last stage one layer short (section 5.1).
    expected = {"zb-gpt3-1.5b": (22, 8, 6), "zb-gpt3-6.2b": (30, 8, 3), "zb-gpt3-14.6b": (46, 16, 1),
                "zb-gpt3-28.3b": (62, 32, 1)}
    for row in PUBLISHED.rows:
        layers, stages, micro_batch = expected[row.model]
        assert (PUBLISHED.models[row.model]["n_layer"], row.num_stages, row.micro_batch_size, row.seq_len) == \
               (layers, stages, micro_batch, 1024)
        if row.layers_per_stage:
            middle = row.layers_per_stage[1]
            assert row.layers_per_stage[0] == row.layers_per_stage[-1] == middle - 1


def test_interleaved_chunks_follow_megatrons_padding():
    # get_offset at the paper's commit: layers padded to a multiple of p, one layer a chunk, the first and
    # the last chunk left empty: 22 layers on p 8 -> 24 chunks (v 3), 62 on p 32 -> 64 chunks (v 2).
    for row in PUBLISHED.rows:
        if row.schedule != "interleaved-1f1b":
            continue
        layers = PUBLISHED.models[row.model]["n_layer"]
        padded = -(-layers // row.num_stages) * row.num_stages
        assert row.virtual_stages == padded // row.num_stages
        assert row.layers_per_chunk == (0,) + (1,) * (padded - 2) + (0,)


def test_schema_rejects_a_misspelled_key():
    raw = json.loads(accuracy_pipeline.PUBLISHED.read_text())
    raw["rows"][0]["micro_batch"] = raw["rows"][0].pop("micro_batch_size")
    with pytest.raises(ValidationError, match="micro_batch"):
        accuracy_pipeline.Published.model_validate(raw)


def test_schema_rejects_a_split_that_misses_layers():
    raw = json.loads(accuracy_pipeline.PUBLISHED.read_text())
    raw["rows"][2]["layers_per_stage"][0] += 1
    with pytest.raises(ValidationError, match="layers_per_stage sums to"):
        accuracy_pipeline.Published.model_validate(raw)


def test_other_measurements_say_why_they_are_not_compared():
    for row in PUBLISHED.other_measurements:
        assert row["comparable"] is False and row["why_not_comparable"] and row["source"]["url"].startswith("https://")
