"""Families whose transformers TP plan names styles wrap() cannot apply get no tensor-parallel mesh
(``profiles/tensor_parallel.json`` ``unsupported_tp_styles``, written by ``benchmarks/tp_plan_styles.py``).
Found by issue 20's sweep: qwen3, olmo2 and gemma3_text mesh rows were planned, then the mesh step refused
the plan (``wrappers.tensor_parallel.resolve_plan``: 'no plain PyTorch equivalent')."""

from __future__ import annotations

import pytest

from advisor.model.bundled import load_tensor_parallel

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=128, tie_word_embeddings=False)


@pytest.mark.parametrize("model_type, refused", [("qwen3", True), ("gemma3_text", True), ("olmo2", True),
                                                 ("llama", False), ("qwen2", False), ("granite", False)])
def test_table_agrees_with_what_wrappers_applies(model_type, refused):
    torch = pytest.importorskip("torch")
    import transformers

    from wrappers.tensor_parallel import resolve_plan

    with torch.device("meta"):
        net = transformers.AutoModelForCausalLM.from_config(transformers.CONFIG_MAPPING[model_type](**TINY))
    styles = load_tensor_parallel().unsupported_tp_styles.get(model_type)
    assert bool(styles) is refused
    if refused:
        with pytest.raises(ValueError, match="no plain PyTorch equivalent here: " + ", ".join(styles)):
            resolve_plan(net)
    else:
        assert resolve_plan(net)[0]


def _qwen3(model_type: str) -> dict:
    arch = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM"}[model_type]
    return dict(model_type=model_type, architectures=[arch], hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=4096, tie_word_embeddings=False,
                max_position_embeddings=4096, _name_or_path=f"tiny-{model_type}")


def test_planner_refuses_a_pinned_tp_mesh_and_keeps_the_others():
    from advisor.planning.api import plan

    with pytest.raises(ValueError, match="qwen3's transformers TP plan uses replicated_with_grad_allreduce"):
        plan(_qwen3("qwen3"), gpus="8xH100", strategy="zero3", tp=2, seq_len=1024)
    assert plan(_qwen3("qwen2"), gpus="8xH100", strategy="zero3", tp=2, seq_len=1024).candidates
