"""PEFT's ``modules_to_save`` (``advisor.model.saved_modules``): adapters plus the saved modules' trainable
copies equal PEFT's own ``get_nb_trainable_parameters`` on the model built on the meta device, and a name
the model lacks (or one inside the blocks) is a ValueError."""

from __future__ import annotations

import pytest

from advisor.model.heads import resolve_head, with_head
from advisor.model.lora import LoraConfig, default_targets, with_lora
from advisor.model.sources import resolve, resolve_model, spec_from_config

SMALL = dict(num_hidden_layers=2)


def _spec(model: str, task: str | None):
    config = {**resolve(model).config, **SMALL}
    spec = spec_from_config(config, name=model, source="local")
    if task is not None:
        spec = with_head(spec, resolve_head(task, 3 if task != "question-answering" else None,
                                            architecture=spec.architecture, config=None))
    return config, spec


def test_qwen25_05b_score_and_embeddings_worked_by_hand():
    # Rank 16 on q_proj (896 -> 896) and v_proj (896 -> 128): 16 x (1792 + 1024) = 45,056 a layer, x 24 =
    # 1,081,344. Saving score (Linear(896, 2, bias=False): 1,792) adds 1,792 trainable parameters, and
    # PEFT's copy of them; saving embed_tokens on the causal LM copies 151,936 x 896 = 136,134,656.
    seq = with_head(resolve_model("Qwen/Qwen2.5-0.5B"), resolve_head("sequence-classification", 2,
                                                                     architecture="Qwen2ForCausalLM", config=None))
    saved = with_lora(seq, LoraConfig(rank=16, modules_to_save=("score",)))
    assert (saved.trainable_params, saved.total_params) == (1_081_344 + 1_792, 494_034_560 + 1_081_344 + 1_792)
    causal = with_lora(resolve_model("Qwen/Qwen2.5-0.5B"), LoraConfig(rank=16, modules_to_save=("embed_tokens",)))
    assert causal.trainable_params == 1_081_344 + 136_134_656


@pytest.mark.parametrize("model,task,names", [
    ("Qwen/Qwen2.5-0.5B", "sequence-classification", ("score",)),
    ("meta-llama/Llama-3.2-1B", "token-classification", ("score", "embed_tokens")),
    ("Qwen/Qwen2.5-7B", "question-answering", ("qa_outputs", "transformer.norm")),  # its base is "transformer"
    ("Qwen/Qwen2.5-0.5B", None, ("lm_head",)),  # tied: PEFT copies the shared weight whole
    ("meta-llama/Llama-3.2-1B", None, ("embed_tokens", "lm_head")),
    ("Qwen/Qwen2.5-7B", None, ("lm_head",)),  # untied
    ("google-bert/bert-base-uncased", "sequence-classification", ("classifier",)),  # BERT: its task head only
    ("google-bert/bert-base-uncased", "question-answering", ("qa_outputs",)),
])
def test_trainable_count_equals_peft_on_the_meta_device(model, task, names):
    peft = pytest.importorskip("peft")
    from advisor.model.meta import build_meta_model
    from advisor.simulate.heads import head_config

    config, spec = _spec(model, task)
    net = build_meta_model(head_config(config, spec.head) if task else config)
    lora = LoraConfig(rank=8, modules_to_save=names)
    wrapped = peft.get_peft_model(net, peft.LoraConfig(**lora.peft_kwargs(default_targets(spec))))
    trainable, total = wrapped.get_nb_trainable_parameters()
    planned = with_lora(spec, lora)
    assert (planned.trainable_params, planned.total_params) == (trainable, total)


@pytest.mark.parametrize("names,message", [
    (("classifier",), "no module of .* ends with it; its modules outside the blocks are: model.embed_tokens"),
    (("input_layernorm",), "matches model.layers.0.input_layernorm .* not modelled"),
    (("norm",), "matches model.layers.0.input_layernorm"),  # PEFT's suffix match takes every block's norms too
])
def test_names_the_model_lacks_or_inside_the_blocks_are_refused(names, message):
    with pytest.raises(ValueError, match=message):
        with_lora(resolve_model("Qwen/Qwen2.5-0.5B"), LoraConfig(rank=8, modules_to_save=names))


def test_a_task_plan_saves_the_head_as_peft_task_models_do():
    import advisor

    plan = advisor.plan("Qwen/Qwen2.5-7B", "1xRTX4090", lora=16, task="sequence-classification", num_labels=2)
    assert plan.training.lora.modules_to_save == ("score",)
    # 5,046,272 adapters (tests/model/test_lora.py) + score, Linear(3584, 2, bias=False): 7,168
    assert plan.model.trainable_params == 5_046_272 + 7_168


def test_a_live_peft_classifier_is_planned_with_its_head_and_saved_copy():
    peft = pytest.importorskip("peft")
    import advisor
    from transformers import LlamaConfig, LlamaForSequenceClassification

    base = LlamaForSequenceClassification(LlamaConfig(
        hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, num_labels=3, pad_token_id=0))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS"))
    plan = advisor.plan(model, "2xA100")
    # rank 4 on q_proj (64 -> 64) and v_proj (64 -> 32): 4 x (128 + 96) x 2 layers = 1,792, and PEFT's copy
    # of score, Linear(64, 3, bias=False): 192
    assert plan.model.trainable_params == 1_792 + 192 == model.get_nb_trainable_parameters()[0]
    assert (plan.model.head.task, plan.model.head.num_labels, plan.model.head_params) == ("sequence-classification", 3, 192)
    assert plan.model.head.saved_copy and set(plan.training.lora.modules_to_save) == {"classifier", "score"}


def test_question_answering_base_is_transformer_in_qwen2():
    # transformers' Qwen2ForQuestionAnswering keeps base_model_prefix = "transformer" (LlamaForQuestionAnswering
    # too, "for BC"), so PEFT finds transformer.norm and no model.norm there.
    _, spec = _spec("Qwen/Qwen2.5-0.5B", "question-answering")
    with pytest.raises(ValueError, match="no module of .* ends with it; .* transformer.embed_tokens"):
        with_lora(spec, LoraConfig(rank=8, modules_to_save=("model.norm",)))
