"""The three objectives against hand-computed expectations: MLM masking statistics, seq2seq
padding left out of the loss, causal LM targets shifted by one."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from anatomy import ModelConfig, build_model
from anatomy.training.data import TokenSplit
from anatomy.training.objectives import IGNORE, CausalLM, MaskedLM, Seq2Seq, mask_tokens
from anatomy.text.chars import chars_tokenizer


def test_mlm_masking_statistics_and_specials_never_masked():
    tok = chars_tokenizer("abcdefghij")
    rng = np.random.default_rng(0)
    B, S = 400, 256
    ids = rng.integers(0, tok.vocab_size, size=(B, S))  # specials (0-3) included on purpose
    special = np.asarray(tok.special_ids)
    objective = MaskedLM(S, tok)
    draws = objective.draw(rng, B, TokenSplit(np.zeros(S + 1, dtype=np.uint16)))
    inputs, labels = mask_tokens(ids, select=draws["select"], action=draws["action"], replacement=draws["replacement"],
                                 mask_id=tok.mask_id, special_ids=special)
    is_special = np.isin(ids, special)
    chosen = labels != IGNORE
    assert not (chosen & is_special).any()
    assert (inputs[is_special] == ids[is_special]).all()
    assert abs(chosen.sum() / (~is_special).sum() - 0.15) < 0.005
    assert (labels[chosen] == ids[chosen]).all()
    masked = chosen & (inputs == tok.mask_id)
    changed = chosen & (inputs != ids) & ~masked
    kept = chosen & (inputs == ids)
    n = chosen.sum()
    assert abs(masked.sum() / n - 0.8) < 0.01
    assert abs(changed.sum() / n - 0.1 * (1 - 1 / 10)) < 0.01  # a random ordinary token may equal the original
    assert abs(kept.sum() / n - 0.1 - 0.1 / 10) < 0.01
    assert not np.isin(inputs[changed], special).any()  # random replacements are ordinary tokens


def test_seq2seq_loss_ignores_padding():
    """The loss of a padded batch is the sum of each pair's loss computed alone, without padding."""
    config = ModelConfig(architecture="encoder-decoder", vocab_size=20, d_model=32, n_layers=1, n_decoder_layers=1,
                         n_heads=2, d_ff=64, position="sinusoidal", pad_token_id=0, max_seq_len=32)
    model = build_model(config).eval()
    objective = Seq2Seq(16, pad_id=0, start_id=1, eos_id=2)
    pairs = [(np.array([5, 6, 7, 8, 9]), np.array([10, 11])), (np.array([5, 6]), np.array([12, 13, 14, 15, 16]))]
    batch = objective.collate(pairs)
    assert batch["src_ids"].shape == (2, 5) and batch["tgt_ids"].shape == (2, 6)
    with torch.no_grad():
        total, count = objective.loss(model, batch)
        alone = [objective.loss(model, objective.collate([p])) for p in pairs]
    assert int(count) == (2 + 1) + (5 + 1)
    assert torch.allclose(total, sum(t for t, _ in alone), atol=1e-5)
    assert batch["labels"][0].tolist() == [10, 11, 2, IGNORE, IGNORE, IGNORE]
    assert batch["tgt_ids"][0].tolist() == [1, 10, 11, 0, 0, 0]


def test_label_smoothing_matches_the_definition():
    config = ModelConfig(architecture="encoder-decoder", vocab_size=20, d_model=32, n_layers=1, n_decoder_layers=1,
                         n_heads=2, d_ff=64, position="sinusoidal", max_seq_len=32)
    model = build_model(config).eval()
    objective = Seq2Seq(16, pad_id=0, start_id=1, eos_id=2)
    batch = objective.collate([(np.array([5, 6]), np.array([7]))])
    with torch.no_grad():
        total, _ = objective.loss(model, batch, label_smoothing=0.1)
        logp = F.log_softmax(model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"]), -1)[0]  # [S_tgt, V]
    labels = batch["labels"][0]
    expected = sum(-(0.9 * logp[i, y] + 0.1 * logp[i].mean()) for i, y in enumerate(labels.tolist()))
    assert torch.allclose(total, expected, atol=1e-5)


def test_causal_lm_targets_are_the_next_tokens():
    split = TokenSplit(np.arange(100, dtype=np.uint16))
    objective = CausalLM(8)
    draws = objective.draw(np.random.default_rng(0), 5, split)
    batch = objective.batch(split, draws)
    assert (batch["labels"] == batch["input_ids"] + 1).all()
    assert int(batch["labels"].max()) <= 99



def test_causal_lm_adds_the_load_balancing_loss_of_moe_models_while_training():
    """CE + router_aux_loss_coef x aux (per target token, so the mean loss gains coef x aux); not in eval."""
    import torch

    from anatomy import build_model, get_preset
    from anatomy.layers.moe import load_balancing_loss
    from anatomy.training.objectives import token_loss

    torch.manual_seed(0)
    config = get_preset("mixtral-8x7b", vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                        n_experts=4, router_aux_loss_coef=0.25)
    model = build_model(config).train()
    batch = {"input_ids": torch.randint(0, 50, (2, 6)), "labels": torch.randint(0, 50, (2, 6))}
    total, count = CausalLM(6).loss(model, batch)
    router: list = []
    ce, _ = token_loss(model(batch["input_ids"], router_logits=router), batch["labels"])
    aux = load_balancing_loss(router, 4, 2)
    assert len(router) == 2 and count == 12
    torch.testing.assert_close(total, ce + 0.25 * aux * 12)
    total.backward()
    assert model.stack.blocks[0].ffn.router.weight.grad.abs().sum() > 0
    torch.testing.assert_close(CausalLM(6).loss(model.eval(), batch)[0], ce.detach(), atol=1e-5, rtol=0)
