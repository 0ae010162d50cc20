"""T5's per-block saved tensors, counted by ``advisor.estimate.activations_encdec``, against what
autograd saves (``saved_tensors_hooks``) on tiny T5 models built in code, with bf16 weights (the
FSDP2 recipe's compute dtype), eager attention and CUDA's bool dropout masks (the simulator's
``cuda_dropout``). Source and target lengths differ so that each stack's length is checked."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from advisor.estimate.activations import Dtypes, shape_of  # noqa: E402
from advisor.estimate.activations_encdec import decoder_layer_per_token, encoder_layer_per_token  # noqa: E402
from advisor.model.architectures import count_from_config  # noqa: E402
from tests.saved_tensors import saved_forward_bytes  # noqa: E402

B, SRC, TGT = 2, 24, 16
BASE = dict(model_type="t5", architectures=["T5ForConditionalGeneration"], vocab_size=128, d_model=64, d_kv=16,
            num_heads=4, d_ff=160, dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0)


def _saved_bytes(cfg: dict, n_enc: int, n_dec: int) -> int:
    config = transformers.T5Config(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")},
                                   num_layers=n_enc, num_decoder_layers=n_dec, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).to(torch.bfloat16).train()
    ids, labels = torch.randint(0, 128, (B, SRC)), torch.randint(0, 128, (B, TGT))
    return saved_forward_bytes(model, input_ids=ids, labels=labels)


@pytest.mark.parametrize("proj", ["relu", "gated-gelu"])
def test_block_counts_match_saved_tensors(proj):
    cfg = {**BASE, "feed_forward_proj": proj}
    base = _saved_bytes(cfg, 1, 1)
    measured_enc = _saved_bytes(cfg, 2, 1) - base
    measured_dec = _saved_bytes(cfg, 1, 2) - base
    shape = shape_of(count_from_config(cfg, name="tiny-t5", source="local"))
    dt = Dtypes(residual=2, compute=2, input_casts=False)
    enc = B * SRC * encoder_layer_per_token(shape, dt, src_len=SRC, eager=True)
    kv = B * SRC * 2 * dt.compute * shape.num_attention_heads * shape.head_dim  # cross k, v over the source
    dec = B * TGT * decoder_layer_per_token(shape, dt, tgt_len=TGT, src_len=SRC, eager=True) + kv
    # Left out on purpose: each T5LayerNorm's fp32 rsqrt (4 bytes a token).
    assert measured_enc - enc == B * SRC * 2 * 4
    assert measured_dec - dec == B * TGT * 3 * 4


BART = dict(model_type="bart", architectures=["BartForConditionalGeneration"], vocab_size=128, d_model=64,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=160, decoder_ffn_dim=160,
            max_position_embeddings=64, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0)


def _bart(n_enc: int, n_dec: int, attention: str):
    config = transformers.BartConfig(**{k: v for k, v in BART.items() if k not in ("model_type", "architectures")},
                                     encoder_layers=n_enc, decoder_layers=n_dec, attn_implementation=attention)
    torch.manual_seed(0)
    return transformers.BartForConditionalGeneration(config).to(torch.bfloat16).train()


def _bart_saved(n_enc: int, n_dec: int, attention: str) -> int:
    model = _bart(n_enc, n_dec, attention)
    ids, labels = torch.randint(3, 128, (B, SRC)), torch.randint(3, 128, (B, TGT))
    return saved_forward_bytes(model, input_ids=ids, labels=labels)


def test_bart_count_equals_meta_model():
    spec = count_from_config({**BART, "encoder_layers": 3, "decoder_layers": 2}, name="tiny-bart", source="local")
    assert spec.count_method == "formula"
    assert spec.total_params == sum(p.numel() for p in _bart(3, 2, "eager").parameters())


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_bart_block_counts_match_saved_tensors(attention):
    from advisor.estimate.activations_encdec import _decoder_layer, _encoder_layer

    base = _bart_saved(1, 1, attention)
    measured_enc, measured_dec = _bart_saved(2, 1, attention) - base, _bart_saved(1, 2, attention) - base
    shape = shape_of(count_from_config({**BART, "encoder_layers": 1, "decoder_layers": 1}, name="b", source="local"))
    dt = Dtypes(residual=2, compute=2, input_casts=False)
    eager = attention == "eager"
    enc = B * SRC * _encoder_layer(shape, dt, src_len=SRC, eager=eager)
    kv = B * SRC * 2 * dt.compute * shape.num_attention_heads * shape.head_dim
    dec = B * TGT * _decoder_layer(shape, dt, tgt_len=TGT, src_len=SRC, eager=eager) + kv
    # Left out on purpose: each LayerNorm's fp32 statistics (4 bytes a token as measured here).
    assert measured_enc - enc == B * SRC * 2 * 4
    assert measured_dec - dec == B * TGT * 3 * 4
