"""``advisor.model.loss_kernels`` (the planner's table of which causal LMs ``--loss chunked|fused`` cannot
run on) against ``wrappers.losses.use_loss_kernel`` itself, on transformers' real classes built on the
meta device: the config class's defaults (a config.json that leaves the keys out) and the sweep's configs."""

from __future__ import annotations

import json
import random

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from advisor.model.bundled import load_architectures  # noqa: E402
from advisor.model.loss_kernels import load_loss_kernel_facts, loss_kernel_refusal  # noqa: E402
from benchmarks.sweep_cases import FORMULA, TRACED, draw_config  # noqa: E402
from wrappers.losses import use_loss_kernel  # noqa: E402

MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

# every causal LM transformers maps, the bundled formula families and the table's rows, less the model_types
# with no AutoModelForCausalLM class (encoder-decoder, vision-language)
NO_CAUSAL_LM = {"t5", "qwen2_vl", "qwen2_5_vl", "llava"}
FAMILIES = sorted((set(load_architectures()) | set(load_loss_kernel_facts()) | set(FORMULA) | set(TRACED)
                   | set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)) - NO_CAUSAL_LM)


def _wrapper_refusal(config: "transformers.PretrainedConfig") -> str | None:
    """What ``use_loss_kernel`` says, less its ``loss kernel 'chunked'`` opening and ``use loss='hf'`` close."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    try:
        use_loss_kernel(model, "chunked")
    except ValueError as err:
        text = str(err).removeprefix("loss kernel 'chunked' ")
        return text.removesuffix(": use loss='hf'")
    return None


@pytest.mark.parametrize("model_type", FAMILIES)
def test_class_defaults_match_the_wrapper(model_type):
    try:  # use_loss_kernel's ValueError is caught inside _wrapper_refusal: what escapes is the build's
        config = transformers.AutoConfig.for_model(model_type)
        for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):  # one block: the head counts
            if isinstance(getattr(config, key, None), int):
                setattr(config, key, 1)
        wrapper = _wrapper_refusal(config)
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"{model_type} does not build from its config class's defaults: {type(err).__name__}")
    assert loss_kernel_refusal({"model_type": model_type}) == wrapper


@pytest.mark.parametrize("family", FORMULA + TRACED)
def test_sweep_configs_match_the_wrapper(family):
    cfg = draw_config(random.Random(family), family)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "_name_or_path"})
    assert loss_kernel_refusal(json.loads(json.dumps(cfg))) == _wrapper_refusal(config)


# the causal LMs that record their routers' logits (the model_types whose forward reads router_logits), and two
# dense ones: with output_router_logits on in the config, the table refuses what use_loss_kernel refuses
ROUTED = sorted({"mixtral", "qwen3_moe", "olmoe",
                "deepseek_v3", "glm4_moe", "jetmoe", "llama4_text", "dbrx", "llama", "qwen2"})


@pytest.mark.parametrize("model_type", ROUTED)
def test_router_logits_on_match_the_wrapper(model_type):
    try:
        config = transformers.AutoConfig.for_model(model_type, output_router_logits=True)
        for key in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
            if isinstance(getattr(config, key, None), int):
                setattr(config, key, 1)
        wrapper = _wrapper_refusal(config)
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"{model_type} does not build from its config class's defaults: {type(err).__name__}")
    cfg = {"model_type": model_type, "architectures": [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]],
           "output_router_logits": True}
    assert loss_kernel_refusal(cfg) == wrapper


def test_hand_worked_reasons():
    # Granite 3.0's muP divisor (logits_scaling 8.0 in granite-3.0-2b-base's config.json) and Gemma 2 with
    # its soft-cap switched off in the config (null): refused, then accepted
    assert loss_kernel_refusal({"model_type": "granite", "architectures": ["GraniteForCausalLM"],
                                "logits_scaling": 8.0}) == (
        "computes the loss on the head's raw output; GraniteForCausalLM transforms its logits first "
        "(logits_scaling=8.0)")
    assert loss_kernel_refusal({"model_type": "gemma2", "final_logit_softcapping": None}) is None
    assert loss_kernel_refusal({"model_type": "llama"}) is None
    # GPT-2's decoder is .transformer, Phi's head has a bias: both run the kernels now. Bart's causal LM takes
    # unshifted labels with its own CrossEntropyLoss: refused
    assert loss_kernel_refusal({"model_type": "gpt2"}) is None
    assert loss_kernel_refusal({"model_type": "phi"}) is None
    assert loss_kernel_refusal({"model_type": "bart"}) == (
        "needs a causal LM whose loss is transformers' loss_function over a plain nn.Linear head on its decoder's "
        "output; BartForCausalLM is not one")
    # xLSTM's soft-cap (class default 30.0) and Falcon-H1's multiplier when its config.json sets one
    assert loss_kernel_refusal({"model_type": "xlstm"}) == (
        "computes the loss on the head's raw output; xLSTMForCausalLM transforms its logits first "
        "(output_logit_soft_cap=30.0)")
    assert loss_kernel_refusal({"model_type": "falcon_h1", "architectures": ["FalconH1ForCausalLM"],
                                "lm_head_multiplier": 0.5}) == (
        "computes the loss on the head's raw output; FalconH1ForCausalLM transforms its logits first "
        "(lm_head_multiplier=0.5)")


@pytest.mark.parametrize(("family", "reason"), [(
    "cohere", "CohereForCausalLM transforms its logits first (logit_scale=0.0625)")])
def test_traced_families_refused_from_their_config(family, reason):
    # Cohere (logit_scale 0.0625 by its config class's default) has no formula: the meta-device path carries the
    # refusal too, and a pinned kernel is refused
    import re

    import advisor

    cfg = draw_config(random.Random(0), family)
    cfg.pop("logit_scale", None)  # the class default decides
    with pytest.raises(ValueError, match=re.escape(reason)):
        advisor.plan(cfg, "1xA100", loss="fused", trace=False)
