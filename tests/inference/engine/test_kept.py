"""Engines are kept for a model across calls: the second `anatomy.generate(model, ...)` reuses the
first one's engine (its plan, cache and captured graphs), a change to the model's weights makes a
new one, the model itself is never changed, and no code outside the engine package reaches into it."""

from __future__ import annotations

import gc
import re
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine, Seq2SeqEngine, engine_for, kept_engines

from ..conftest import llama_tiny, seq2seq_tiny

SRC = Path(anatomy.__file__).parent


def test_the_same_model_gets_the_same_engine_until_its_weights_change():
    model = llama_tiny()
    engine = engine_for(model)
    assert engine_for(model) is engine and engine_for(model, compile=False) is engine  # defaults are one key
    assert engine_for(model, capture=False) is not engine  # other options, another engine
    before = anatomy.generate(model, [5, 6, 7], max_new_tokens=8).token_ids
    with torch.no_grad():
        model.lm_head.weight.mul_(-1)  # in place: the version counter moves
    changed = engine_for(model)
    assert changed is not engine
    after = anatomy.generate(model, [5, 6, 7], max_new_tokens=8).token_ids
    assert after != before, "the new engine runs the new weights"
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # a new tensor put in place
    assert engine_for(model) is not changed


def test_generate_with_a_model_reuses_its_engine_and_never_changes_the_model():
    model = llama_tiny().train()
    classes = [type(m) for m in model.modules()]
    anatomy.generate(model, [5, 6, 7], max_new_tokens=4)
    engine = engine_for(model)
    anatomy.generate(model, [8, 9], max_new_tokens=4)
    assert engine_for(model) is engine
    assert model.training and [type(m) for m in model.modules()] == classes


def test_an_engine_does_not_keep_its_model_alive():
    model = llama_tiny()
    engine_for(model)
    count = len(kept_engines)
    del model
    gc.collect()
    assert len(kept_engines) == count - 1


def test_an_encoder_decoder_gets_a_seq2seq_engine_and_bad_options_are_refused():
    model = seq2seq_tiny()
    assert isinstance(engine_for(model), Seq2SeqEngine) and engine_for(model) is engine_for(model)
    with pytest.raises(InputError, match="unknown engine option"):
        engine_for(model, compile=True)
    with pytest.raises(InputError, match="unknown engine option"):
        engine_for(llama_tiny(), fast=True)
    assert isinstance(engine_for(llama_tiny()), DecoderEngine)


PRIVATE = re.compile(r"\bengine\._[a-z]|\.model\.stack\.run\b|\bengine\.model\.stack\b")


def test_no_code_outside_the_engine_package_reaches_into_an_engine():
    """The engine's public API is the only way in: outside inference/engine/ no module touches an
    engine's underscore members or runs the model's stack itself."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.parent == SRC / "inference" / "engine":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE.search(line):
                offenders.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert offenders == []
    assert PRIVATE.search("tokens = self.engine._choose(logits)")  # the rule does catch a reach
