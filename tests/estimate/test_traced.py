"""A traced profile composes the step as a formula does (``advisor.estimate.traced``): worked by hand."""

from __future__ import annotations

from advisor.estimate.traced import activations_from_profile
from advisor.model.block_profile import Bilinear, BlockProfile, ProfileKey

KEY = ProfileKey(residual_bytes=2, compute_bytes=2, input_casts=False, checkpointing="on", seq_len=8,
                 attention="sdpa", loss="hf")


def test_bilinear_is_solved_exactly_from_four_steps():
    """v(L, b) = 5 + 7b + 3L + 11Lb: (1,1) = 26, (2,1) = 40, (1,2) = 44, (2,2) = 69."""
    form = Bilinear.solve(26, 40, 44, 69)
    assert (form.const, form.per_sample, form.per_layer, form.per_layer_sample) == (5, 7, 3, 11)
    assert form.at(num_layers=24, micro_batch_size=8) == 5 + 7 * 8 + 3 * 24 + 11 * 24 * 8


def test_profile_moments_become_the_formula_fields():
    """24 blocks, micro-batch 4. saved = 100 + 4*10 + 24*4*50 = 4,940; forward peak 4,940 + 4*1,000 ->
    logits 4,000; loss peak 4,940 + 4*1,500 -> loss transient 6,000; block peak 4,940 + 4*300 -> 1,200 over
    saved, of which the recomputed block is 4*200 = 800 and the backward temporaries 400. Returned logits
    (hf loss): 4 * 8 tokens * vocabulary 16 * 2 bytes = 1,024."""
    def form(per_sample: int) -> Bilinear:
        return Bilinear(const=100, per_sample=10 + per_sample, per_layer=0, per_layer_sample=50)

    profile = BlockProfile(key=KEY, saved=form(0), forward_peak=form(1000), loss_peak=form(1500), block_peak=form(300),
                           recompute=Bilinear(const=0, per_sample=200, per_layer=0, per_layer_sample=0),
                           layer_saved_per_sample=250)
    acts = activations_from_profile(profile, num_layers=24, micro_batch_size=4, vocab_size=16)
    assert acts.saved_bytes == 4_940
    assert (acts.logits_bytes, acts.loss_transient_bytes) == (4_000, 6_000)
    assert (acts.recompute_bytes, acts.backward_temp_bytes) == (800, 400)
    assert (acts.layer_bytes, acts.returned_logits_bytes) == (1_000, 1_024)


def test_chunked_loss_bend_beyond_the_traced_batches():
    """The chunked loss's backward peaks at the larger of ``all chunks + 2 chunk gradients`` and ``all chunks - 2
    chunks + 3 head gradients`` (``activations_loss.loss_bytes``): the second holds head-sized gradients that do
    not grow with the tokens, so the line a profile draws through micro-batches 1 and 2 misses the bend. Issue 20's
    sweep row bd5073398ef7 (a StableLM, vocabulary 29,504, width 256, s 1024, fp32, micro-batch 4): -7.84%, the
    simulated loss backward 60,424,192 bytes above the line. By hand, per micro-batch b (1024 b tokens, 128 b a
    chunk): b = 1: max(151,060,480; 120,848,384 - 30,212,096 + 3 x 30,212,096 = 181,272,576); b = 2:
    max(302,120,960; 271,908,864); the line at b = 4: 181,272,576 + 3 x 120,848,384 = 543,817,728; the kernel at
    b = 4: 483,393,536 + 2 x 60,424,192 = 604,241,920: 60,424,192 more (one chunk's two fp32 gradients)."""
    key = ProfileKey(residual_bytes=4, compute_bytes=4, input_casts=False, checkpointing="on", seq_len=1024,
                     attention="sdpa", loss="chunked")
    line = Bilinear(const=181_272_576 - 120_848_384, per_sample=120_848_384, per_layer=0, per_layer_sample=0)
    zero = Bilinear(const=0, per_sample=0, per_layer=0, per_layer_sample=0)
    profile = BlockProfile(key=key, saved=zero, forward_peak=zero, loss_peak=line, block_peak=zero, recompute=zero,
                           layer_saved_per_sample=0)
    acts = activations_from_profile(profile, num_layers=3, micro_batch_size=4, vocab_size=29_504, hidden_size=256)
    assert acts.loss_transient_bytes == 543_817_728 + 60_424_192
    at_two = activations_from_profile(profile, num_layers=3, micro_batch_size=2, vocab_size=29_504, hidden_size=256)
    assert at_two.loss_transient_bytes == 302_120_960  # a traced batch: the profile's own figure
