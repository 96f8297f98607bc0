"""The real default model, SmolLM2-135M-Instruct in fp32: speculative greedy output is token for
token plain greedy output with both proposers (n-gram; the same model with the GGUF's own Q4_1
weights as the draft), on input-grounded (a rewrite, a code edit) and open-ended chat prompts."""

from __future__ import annotations

import pytest

import anatomy
from anatomy.inference.engine import DecoderEngine
from benchmarks.speculative_prompts import CHAT, GROUNDED

PROMPTS = {"copy-edit": GROUNDED["copy-edit"], "code-edit": GROUNDED["code-edit"], "story": CHAT["story"]}
NEW = 48


@pytest.fixture(scope="module")
def target(smollm2):
    return DecoderEngine(smollm2)


@pytest.fixture(scope="module")
def plain(target, smollm2_tokenizer):
    return {name: anatomy.generate(target, p, tokenizer=smollm2_tokenizer, max_new_tokens=NEW)
            for name, p in PROMPTS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", PROMPTS)
def test_ngram_speculation_gives_the_plain_greedy_tokens(target, plain, smollm2_tokenizer, name):
    r = anatomy.generate(target, PROMPTS[name], tokenizer=smollm2_tokenizer, max_new_tokens=NEW,
                         speculative="ngram", num_speculative_tokens=5)
    assert r.token_ids == plain[name].token_ids and r.text == plain[name].text
    assert r.speculative.verifications > 0  # the identity was put to the test
    if name == "copy-edit":  # copying the passage: most guesses are right
        assert r.speculative.acceptance_rate > 0.5 and r.speculative.tokens_per_forward > 2


@pytest.mark.slow
def test_an_int4_draft_of_the_same_model_gives_the_plain_greedy_tokens(target, plain, smollm2_tokenizer,
                                                                       smollm2_gguf_path):
    draft = DecoderEngine(anatomy.load(smollm2_gguf_path, weights="auto"))  # the file's Q4_1 blocks, kept
    for name in ("copy-edit", "story"):  # a grounded and an open-ended prompt (each costs a draft prefill too)
        r = anatomy.generate(target, PROMPTS[name], tokenizer=smollm2_tokenizer, max_new_tokens=NEW, speculative="draft",
                             draft_model=draft, num_speculative_tokens=4)
        assert r.token_ids == plain[name].token_ids, name
        assert r.speculative.draft_forwards > 0 and r.speculative.acceptance_rate > 0.5, r.speculative
