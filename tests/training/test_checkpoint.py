"""Checkpoints in one process: round trip of weights, optimizer and RNG; errors that name the file
and key on an incompatible or corrupted checkpoint; retention of the last K plus the best."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.errors import CheckpointError
from anatomy.text.chars import chars_tokenizer
from anatomy.training.checkpoint import latest_checkpoint, load_checkpoint, prune, save_checkpoint
from anatomy.training.distributed import Dist
from anatomy.training.optim import make_optimizer


def _setup(d_model: int = 32):
    config = get_preset("gpt2", d_model=d_model, n_layers=2, n_heads=2, d_ff=64, vocab_size=40, max_seq_len=8,
                        bos_token_id=None, eos_token_id=None)
    model = build_model(config)
    return model, make_optimizer(model, lr=1e-2, weight_decay=0.1)


def _train_a_step(model, opt):
    ids = torch.randint(0, 40, (2, 8))
    model(ids).logsumexp(-1).mean().backward()
    opt.step()
    opt.zero_grad()


def _save(tmp_path, model, opt, step=1, val_loss=None, keep=3):
    trainer = {"step": step, "tokens": 16 * step, "val_loss": val_loss}
    return save_checkpoint(tmp_path / "run", wrapped=model, model=model, optimizer=opt, trainer=trainer,
                           tokenizer=chars_tokenizer("abc"), info=Dist(), keep=keep)


def test_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    model, opt = _setup()
    _train_a_step(model, opt)
    directory = _save(tmp_path, model, opt)
    expected_next = (random.random(), np.random.rand(), torch.rand(3))
    model2, opt2 = _setup()
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    trainer = load_checkpoint(latest_checkpoint(tmp_path / "run"), wrapped=model2, model=model2, optimizer=opt2,
                              info=Dist())
    assert trainer["step"] == 1 and directory.name == "step-000001"
    assert (random.random(), np.random.rand()) == expected_next[:2] and torch.equal(torch.rand(3), expected_next[2])
    for (name, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), name
    for m, o in ((model, opt), (model2, opt2)):  # same moments and step count: the same update, exactly
        torch.manual_seed(0)
        _train_a_step(m, o)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_incompatible_checkpoint_names_file_and_key(tmp_path):
    model, opt = _setup()
    directory = _save(tmp_path, model, opt)
    other, other_opt = _setup(d_model=48)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: key 'stack.embed.tokens.weight' has shape \(40, 32\)"):
        load_checkpoint(directory, wrapped=other, model=other, optimizer=other_opt, info=Dist())
    (directory / "trainer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="trainer.json: not readable JSON"):
        load_checkpoint(directory, wrapped=model, model=model, optimizer=opt, info=Dist())


def _rewrite_json(path, change):
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


@pytest.mark.parametrize("change, message", [
    (lambda t: [t], r"trainer\.json: expected a JSON object, got list"),
    (lambda t: {**t, "step": "3"}, r"trainer\.json: key 'step' is not a JSON integer"),
    (lambda t: {**t, "optimizer_groups": t["optimizer_groups"][:1]}, r"key 'optimizer_groups' does not name"),
    (lambda t: {**t, "optimizer_groups": t["optimizer_groups"][::-1]}, r"key 'optimizer_groups' does not name"),
])
def test_trainer_json_that_does_not_fit_the_optimizer_is_refused_before_loading(tmp_path, change, message):
    model, opt = _setup()
    _train_a_step(model, opt)
    directory = _save(tmp_path, model, opt)
    _rewrite_json(directory / "trainer.json", change)
    fresh, fresh_opt = _setup()
    before = [p.detach().clone() for p in fresh.parameters()]
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(directory, wrapped=fresh, model=fresh, optimizer=fresh_opt, info=Dist())
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters())) and not fresh_opt.state


def test_optimizer_state_that_is_not_adamw_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    model, opt = _setup()
    _train_a_step(model, opt)
    directory = _save(tmp_path, model, opt)
    path = directory / "optimizer.safetensors"
    tensors = load_file(path)
    save_file({k: v for k, v in tensors.items() if k != "stack.embed.tokens.weight::exp_avg_sq"}, path)
    with pytest.raises(CheckpointError, match=r"key 'stack.embed.tokens.weight::exp_avg_sq' is missing"):
        load_checkpoint(directory, wrapped=model, model=model, optimizer=opt, info=Dist())
    save_file({**tensors, "stack.embed.tokens.weight::momentum": tensors["stack.embed.tokens.weight::exp_avg"].clone()}, path)
    with pytest.raises(CheckpointError, match=r"'momentum' is not AdamW state"):
        load_checkpoint(directory, wrapped=model, model=model, optimizer=opt, info=Dist())


def test_missing_pointer_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="latest.json does not exist"):
        latest_checkpoint(tmp_path)


def test_keeps_last_k_and_the_best(tmp_path):
    model, opt = _setup()
    for step, val in zip(range(1, 6), [3.0, 1.0, 2.0, 2.5, 2.7]):
        _save(tmp_path, model, opt, step=step, val_loss=val, keep=2)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000002", "step-000004", "step-000005"]
    assert json.loads((root / "latest.json").read_text())["step"] == 5
    prune(root, keep=0)
    assert len(list(root.glob("step-*"))) == 3


def test_non_finite_weights_are_never_saved(tmp_path):
    model, opt = _setup()
    _save(tmp_path, model, opt, step=1)
    with torch.no_grad():
        model.stack.blocks[0].attn.qkv.weight[0, 0] = float("nan")
    assert _save(tmp_path, model, opt, step=2) is None
    assert latest_checkpoint(tmp_path / "run").name == "step-000001"


def test_hf_transformers_reads_the_checkpoint_weights(tmp_path):
    """The weights are saved in the HF layout: GPT2LMHeadModel loads them and computes our logits."""
    from transformers import GPT2LMHeadModel

    model, opt = _setup()
    _train_a_step(model, opt)
    directory = _save(tmp_path, model, opt)
    hf = GPT2LMHeadModel.from_pretrained(directory).eval()
    ids = torch.randint(0, 40, (2, 8))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, model.eval()(ids), atol=1e-5)


def test_a_config_without_an_hf_layout_round_trips_in_anatomy_names(tmp_path):
    config = get_preset("bert-base", d_model=32, n_layers=1, n_heads=2, d_ff=64, vocab_size=40, max_seq_len=8,
                        norm_position="pre", final_norm=True)  # a Pre-LN BERT: no HF class has it
    model = build_model(config, head="mlm")
    opt = make_optimizer(model, lr=1e-2, weight_decay=0.1)
    directory = _save(tmp_path, model, opt)
    assert json.loads((directory / "config.json").read_text())["norm_position"] == "pre"
    fresh = build_model(config, head="mlm")
    load_checkpoint(directory, wrapped=fresh, model=fresh, optimizer=make_optimizer(fresh, lr=1e-2, weight_decay=0.1),
                    info=Dist())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
