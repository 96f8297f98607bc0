"""SmolLM2-135M-Instruct from its Q4_1 GGUF: anatomy's load against HF transformers' own GGUF
load of the same file (HF dequantizes it and undoes the Q/K row order itself)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]
EOS = 2  # <|im_end|>


def _chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


@torch.no_grad()
def test_logits_match_hf_on_64_tokens(smollm2, hf_smollm2, hf_smollm2_tokenizer):
    text = ("The history of the Roman Empire spans more than a thousand years, from the founding of the "
            "city to the fall of Constantinople. Its roads, laws and language shaped Europe; its "
            "engineers built aqueducts, bridges and domes that still stand today across the continent. "
            "Historians still argue about why it declined, pointing to plague, inflation, civil war and "
            "the pressure of peoples moving across its long northern frontier.")
    ids = torch.tensor([hf_smollm2_tokenizer.encode(text, add_special_tokens=False)[:64]])
    assert ids.shape == (1, 64)
    ours = smollm2(ids)
    theirs = hf_smollm2(ids).logits
    assert (ours - theirs).abs().max().item() < 1e-3


@pytest.mark.parametrize("question", PROMPTS)
@torch.no_grad()
def test_greedy_tokens_match_hf(smollm2, hf_smollm2, hf_smollm2_tokenizer, greedy, question):
    ids = _chat_ids(hf_smollm2_tokenizer, question)
    ours = greedy(smollm2, ids, 32, eos=EOS)
    # HF's greedy choice after every prefix of our sequence, in one forward pass: if each equals our
    # next token, HF's own greedy decoding from the prompt produces exactly our tokens (induction)
    hf_logits = hf_smollm2(torch.tensor([ids + ours])).logits[0]  # [S, V]
    theirs = hf_logits[len(ids) - 1:-1].argmax(-1).tolist()
    assert ours == theirs
    if "France" in question:
        assert "Paris" in hf_smollm2_tokenizer.decode(ours)


def test_config_from_metadata(smollm2):
    c = smollm2.config
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff) == (30, 576, 9, 3, 64, 1536)
    assert (c.vocab_size, c.rope_theta, c.max_seq_len, c.tie_embeddings) == (49152, 100000.0, 8192, True)
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)
    assert smollm2.lm_head.weight is smollm2.token_embedding.weight
