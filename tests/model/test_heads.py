"""Task heads (``advisor.model.heads``): parameter counts worked by hand from the config and equal to
the head class transformers builds on the meta device; the head a config's architectures names; bad
input is a ValueError."""

from __future__ import annotations

import pytest

from advisor.model.heads import resolve_head, task_of_architecture, with_head
from advisor.model.sources import resolve, resolve_model, spec_from_config


def _head(spec, task, num_labels=None):
    return with_head(spec, resolve_head(task, num_labels, architecture=spec.architecture, config=None))


def test_qwen25_05b_sequence_classification_two_labels_worked_by_hand():
    # Qwen2.5-0.5B (config.json): hidden 896, 24 layers, 14 query and 2 key/value heads of 64, MLP 4864,
    # vocabulary 151,936, tied embeddings, biases on q, k and v.
    #   embedding 151,936 x 896                                        = 136,134,656
    #   one layer: q 896 x 896 + 896 = 803,712; k and v 896 x 128 + 128 = 114,816 each; o 896 x 896 = 802,816;
    #              MLP 3 x 896 x 4864 = 13,074,432; two norms 1,792    =  14,912,384; x 24 = 357,897,216
    #   final norm                                                     =         896
    #   causal LM (tied: no lm_head of its own)                        = 494,032,768
    #   Qwen2ForSequenceClassification: score = Linear(896, 2, bias=False) = 1,792 more = 494,034,560
    spec = resolve_model("Qwen/Qwen2.5-0.5B")
    assert spec.total_params == 494_032_768
    head = _head(spec, "sequence-classification", 2)
    assert (head.total_params, head.head_params, head.trainable_params) == (494_034_560, 1_792, 494_034_560)
    assert head.architecture == "Qwen2ForSequenceClassification" and head.tied_embeddings is False


def test_untied_lm_head_leaves_and_bias_heads_count_their_bias():
    # Qwen2.5-7B is untied: its lm_head (152,064 x 3584 = 544,997,376) leaves; token classification's
    # score has a bias (token_classification_bias defaults to True): 5 x 3584 + 5 = 17,925;
    # question answering's qa_outputs = Linear(3584, 2): 7,170.
    spec = resolve_model("Qwen/Qwen2.5-7B")
    assert spec.total_params == 7_615_616_512
    assert _head(spec, "token-classification", 5).total_params == 7_615_616_512 - 544_997_376 + 17_925
    assert _head(spec, "question-answering").total_params == 7_615_616_512 - 544_997_376 + 7_170


SMALL = dict(num_hidden_layers=2)


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-7B",
                                   "google-bert/bert-large-uncased"])
@pytest.mark.parametrize("task,num_labels", [("sequence-classification", 2), ("token-classification", 7),
                                              ("question-answering", None)])
def test_counts_equal_the_head_class_on_the_meta_device(model, task, num_labels):
    from advisor.model.meta import build_meta_model, spec_from_module
    from advisor.simulate.heads import head_config

    config = {**resolve(model).config, **SMALL}
    spec = _head(spec_from_config(config, name=model, source="local"), task, num_labels)
    net = build_meta_model(head_config(config, spec.head))
    assert type(net).__name__ == spec.architecture
    assert spec.total_params == spec_from_module(net).total_params
    module = getattr(net, spec.head.module)
    assert spec.head_params == sum(p.numel() for p in module.parameters())


def test_config_naming_the_head_class_is_planned_with_that_head():
    import advisor

    config = {**resolve("Qwen/Qwen2.5-0.5B").config, **SMALL, "architectures": ["Qwen2ForTokenClassification"],
              "id2label": {"0": "O", "1": "B", "2": "I"}}
    plan = advisor.plan(config, "1xA100")
    assert plan.model.head.task == "token-classification" and plan.model.head.num_labels == 3
    by_formula = _head(spec_from_config({**config, "architectures": ["Qwen2ForCausalLM"]}, name="x", source="local"),
                       "token-classification", 3)
    assert (plan.model.total_params, plan.model.head_params) == (by_formula.total_params, 3 * 896 + 3)
    assert any(note.startswith("task head (the config's architectures)") for note in plan.assumptions)


def test_task_from_architecture_names():
    assert task_of_architecture("LlamaForSequenceClassification") == "sequence-classification"
    assert task_of_architecture("Qwen2ForTokenClassification") == "token-classification"
    assert task_of_architecture("MistralForQuestionAnswering") == "question-answering"
    assert task_of_architecture("LlamaForCausalLM") is None


@pytest.mark.parametrize("task,num_labels,message", [
    ("summarise", None, "unknown --task 'summarise'; one of: causal-lm, sequence-classification"),
    ("sequence-classification", 0, "--num-labels must be at least 1"),
    ("causal-lm", 3, "--num-labels needs --task"),
    ("question-answering", 4, "does not apply to --task question-answering"),
])
def test_bad_task_input_is_a_value_error(task, num_labels, message):
    with pytest.raises(ValueError, match=message):
        resolve_head(task, num_labels, architecture="Qwen2ForCausalLM", config=None)


def test_a_family_without_a_head_formula_is_refused():
    with pytest.raises(ValueError, match="modelled for the Llama-like decoders .* is gpt2"):
        _head(resolve_model("openai-community/gpt2"), "sequence-classification", 2)


def test_num_labels_against_the_configs_own_is_refused():
    config = {"architectures": ["Qwen2ForSequenceClassification"], "id2label": {"0": "neg", "1": "neu", "2": "pos"}}
    with pytest.raises(ValueError, match="the config's Qwen2ForSequenceClassification has 3 labels"):
        resolve_head(None, 2, architecture="Qwen2ForSequenceClassification", config=config)
    assert resolve_head(None, None, architecture="Qwen2ForSequenceClassification", config=config).num_labels == 3


def test_a_task_on_a_config_without_architectures_says_so():
    """It said '... (architectures ...ForCausalLM), not None'."""
    from advisor.model.heads import head_class

    with pytest.raises(ValueError, match=r"needs a causal-LM config \(architectures \.\.\.ForCausalLM\), or "
                                         r"BERT's \(\.\.\.ForMaskedLM\), and this config names no architectures$"):
        head_class(None, "sequence-classification")
    with pytest.raises(ValueError, match="not T5ForConditionalGeneration$"):
        head_class("T5ForConditionalGeneration", "sequence-classification")
    assert head_class("BertModel", "sequence-classification") == "BertForSequenceClassification"


def test_bert_heads_worked_by_hand():
    # bert-large-uncased (config.json): hidden 1024, 24 layers, MLP 4096, vocabulary 30,522, 512 positions, 2 token
    # types. BertForMaskedLM: embeddings 30,522 x 1024 + (512 + 2) x 1024 + LayerNorm 2,048 = 31,782,912; one layer
    # 4 x (1024^2 + 1024) + 2,048 + 2 x 1024 x 4096 + 4096 + 1024 + 2,048 = 12,596,224, x 24 = 302,309,376; the
    # masked-LM head's transform 1024^2 + 1024, its LayerNorm 2,048 and decoder bias 30,522 (the decoder is the tied
    # embedding) = 1,082,170: 335,174,458. BertForSequenceClassification drops that head for the pooler
    # (1024^2 + 1024 = 1,049,600) and classifier = Linear(1024, 2) with a bias (2,050): 335,143,938;
    # token classification and question answering keep no pooler: 334,094,338 (transformers' own classes on the
    # meta device agree, test_counts_equal_the_head_class_on_the_meta_device).
    spec = resolve_model("google-bert/bert-large-uncased")
    assert spec.total_params == 335_174_458
    seq = _head(spec, "sequence-classification")
    assert (seq.total_params, seq.head_params, seq.architecture) == (335_143_938, 2_050, "BertForSequenceClassification")
    assert (seq.head.module, seq.head.bias, seq.head.base_prefix) == ("classifier", True, "bert")
    assert _head(spec, "token-classification", 2).total_params == 334_094_338
    qa = _head(spec, "question-answering")
    assert (qa.total_params, qa.head.module) == (334_094_338, "qa_outputs")
