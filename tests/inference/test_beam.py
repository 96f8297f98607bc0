"""Beam search on a tiny encoder-decoder with hand-set weights, where the best sequence is known.

The decoder's attention, cross-attention and FFN output projections are zero, the norms come
before each branch and there is no final norm, so the residual stream is just the embedding of
the current token: with one-hot embeddings, logits[next] = lm_head.weight[next, current]. Setting
that column to log P(next | current) makes the model a hand-written Markov chain:

    start -> A .55 | B .45        A -> C .36 | D .34 | EOS .30        B -> EOS .90 | C .10
    C -> EOS                      D -> EOS

Greedy takes A (.55) then C: P(A C EOS) = .198. The best sequence is B EOS, P = .405.
"""

from __future__ import annotations

import math

import pytest
import torch

import anatomy
from anatomy import ModelConfig, build_model

START, EOS, A, B, C, D = range(6)
CHAIN = {START: {A: .55, B: .45}, A: {C: .36, D: .34, EOS: .30}, B: {EOS: .90, C: .10}, C: {EOS: 1.0},
         D: {EOS: 1.0}, EOS: {EOS: 1.0}}


# A chain whose likely path is long (A C D EOS, P = .96) while unlikely endings rank among the
# K = 2 best candidates on the way (A EOS at step 2, A C EOS at step 3), as they do for a model
# trained with label smoothing: two such endings must not stop the search before A C D ends.
LATE_CHAIN = {START: {A: .98, B: .012, EOS: .008}, A: {C: .99, EOS: .01}, B: {C: .6, EOS: .4},
              C: {D: .99, EOS: .01}, D: {EOS: 1.0}, EOS: {EOS: 1.0}}


def markov_seq2seq(chain: dict[int, dict[int, float]] = CHAIN) -> torch.nn.Module:
    config = ModelConfig(architecture="encoder-decoder", vocab_size=6, d_model=6, n_heads=1, d_ff=4, n_layers=1,
                         n_decoder_layers=1, norm_position="pre", final_norm=False, position="none",
                         tie_embeddings=False, pad_token_id=START, bos_token_id=START, eos_token_id=EOS,
                         decoder_start_token_id=START)
    model = build_model(config).eval()
    with torch.no_grad():
        for block in model.decoder.blocks:
            for linear in (block.attn.out, block.cross_attn.out, block.ffn.down):
                linear.weight.zero_()
        model.shared.weight.copy_(torch.eye(6))
        head = torch.full((6, 6), math.log(1e-9))  # [next, current]
        for current, nexts in chain.items():
            for nxt, p in nexts.items():
                head[nxt, current] = math.log(p)
        model.lm_head.weight.copy_(head)
    return model


def test_the_model_is_the_markov_chain():
    model = markov_seq2seq()
    with torch.no_grad():
        probs = model(torch.tensor([[A, B]]), torch.tensor([[START, A]])).softmax(-1)[0]
    assert probs[0, B].item() == pytest.approx(.45, abs=1e-6) and probs[1, C].item() == pytest.approx(.36, abs=1e-6)


def test_greedy_misses_the_best_sequence():
    result = anatomy.generate(markov_seq2seq(), [A, B, C], max_new_tokens=5)
    assert result.token_ids == [A, C] and result.finish_reason == "stop"


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_finds_the_best_sequence(length_penalty):
    result = anatomy.generate(markov_seq2seq(), [A, B, C], max_new_tokens=5, num_beams=2,
                              length_penalty=length_penalty)
    assert result.token_ids == [B] and result.finish_reason == "stop"


def test_beam_search_stops_at_max_new_tokens_with_the_best_unfinished_beam():
    result = anatomy.generate(markov_seq2seq(), [A], max_new_tokens=1, num_beams=2)
    assert result.token_ids == [A] and result.finish_reason == "length"


def test_batch_of_sources_gives_one_result_each():
    results = anatomy.generate(markov_seq2seq(), [[A], [B, C]], max_new_tokens=5, num_beams=3)
    assert [r.token_ids for r in results] == [[B], [B]]


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_unlikely_early_endings_do_not_stop_the_search(length_penalty):
    result = anatomy.generate(markov_seq2seq(LATE_CHAIN), [A], max_new_tokens=6, num_beams=2,
                              length_penalty=length_penalty)
    assert result.token_ids == [A, C, D] and result.finish_reason == "stop"
