"""The attention page in headless Chromium: the grid has L x H cells per attention group, the page
decodes exactly the weights the model returned, and hovering the enlarged map says which token
attends to which and how much; for a decoder (SmolLM2), an encoder (all-MiniLM-L6-v2) and an
encoder-decoder (cross-attention, token ids). Screenshots go to the test's tmp_path."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy import build_model, get_preset
from anatomy.analysis.attention_maps import attention

pytestmark = pytest.mark.slow  # a real browser and real checkpoints

TEXT = "The cat sat on the mat because it was warm. Then the cat fell asleep."


def _shown(token: str) -> str:
    """How the page prints a token (attention.js `shown`)."""
    text = token.replace("\n", "⏎").replace("\t", "⇥").replace("\r", "")
    return text.strip() or ("␣" if text else "∅")


def _open(browser, tmp_path, maps, name):
    path = maps.save_html(tmp_path / f"{name}.html")
    opened = browser.open(path)
    assert opened.errors == [] and opened.foreign_requests() == []
    return opened


def _decoded(page, group: int):
    """Every weight of a group as the page's script decoded it, [L, H, S_q, S_k]."""
    flat = page.evaluate(f"() => Array.from(window.anatomyAttention.groups[{group}].values)")
    shape = page.evaluate(f"() => window.anatomyAttention.groups[{group}].shape")
    return torch.tensor(flat, dtype=torch.float64).view(*shape)


def _hover_cell(page, section, i: int, j: int, S_q: int, S_k: int) -> str:
    overlay = section.locator("canvas.overlay")
    overlay.scroll_into_view_if_needed()
    box = overlay.bounding_box()
    page.mouse.move(box["x"] + (j + 0.5) * box["width"] / S_k, box["y"] + (i + 0.5) * box["height"] / S_q)
    return page.locator("#tip").inner_text()


def test_decoder_attention_page(browser, tmp_path, smollm2, smollm2_tokenizer):
    maps = attention(smollm2, TEXT, tokenizer=smollm2_tokenizer, name="smollm2-135m-instruct")
    g = maps.groups[0]
    L, H, S, _ = g.weights.shape
    assert (L, H) == (30, 9)
    opened = _open(browser, tmp_path, maps, "attention-smollm2")
    page = opened.page
    try:
        section = page.locator("#group-0")
        assert section.locator("canvas.cell").count() == L * H
        assert (_decoded(page, 0) - g.weights.double()).abs().max().item() <= 1e-5  # 16-bit fractions

        i, j = 9, 4
        tip = _hover_cell(page, section, i, j, S, S)
        assert f"layer 0, head 0\n“{_shown(g.queries[i])}” ({i}) → “{_shown(g.keys[j])}” ({j}): " in tip
        assert float(tip.rsplit(": ", 1)[1]) == pytest.approx(g.weights[0, 0, i, j].item(), abs=1e-4)
        assert _hover_cell(page, section, 2, 5, S, S).endswith("masked")  # a causal map hides the future

        section.locator('canvas.cell[data-layer="7"][data-head="4"]').click()
        assert section.locator(".pick-layer").input_value() == "7"
        assert section.locator(".pick-head").input_value() == "4"
        tip = _hover_cell(page, section, i, j, S, S)
        assert tip.startswith("layer 7, head 4")
        assert float(tip.rsplit(": ", 1)[1]) == pytest.approx(g.weights[7, 4, i, j].item(), abs=1e-4)

        page.mouse.move(0, 0)
        section.locator(".token-strip.queries .tok").nth(4).hover()
        shaded = section.locator(".token-strip.queries .tok").evaluate_all(
            "els => els.map(e => e.style.background !== '')")
        assert shaded == [k <= 4 for k in range(S)]  # token 4 attends to itself and what came before
        page.mouse.move(0, 0)
        assert section.locator(".token-strip .tok").evaluate_all(
            "els => els.every(e => e.style.background === '' && e.style.color === '')")
        opened.shot(tmp_path, "attention-smollm2")
    finally:
        page.close()


def test_encoder_attention_page(browser, tmp_path):
    model = anatomy.load("all-minilm-l6-v2")
    tokenizer = anatomy.load_tokenizer("all-minilm-l6-v2")
    maps = attention(model, "The cat sat on the mat, and the dog lay on the rug.", tokenizer=tokenizer,
                     name="all-minilm-l6-v2")
    g = maps.groups[0]
    assert g.kind == "bidirectional" and g.queries[0] == "[CLS]"
    opened = _open(browser, tmp_path, maps, "attention-minilm")
    page = opened.page
    try:
        section = page.locator("#group-0")
        assert section.locator("canvas.cell").count() == 6 * 12
        S = len(g.queries)
        tip = _hover_cell(page, section, 1, S - 1, S, S)  # bidirectional: a token sees the ones after it
        assert "“the” (1) → “[SEP]”" in tip and not tip.endswith("masked")
        assert (_decoded(page, 0) - g.weights.double()).abs().max().item() <= 1e-5
        opened.shot(tmp_path, "attention-minilm")
    finally:
        page.close()


def test_encoder_decoder_attention_page_shows_cross_attention_and_ids(browser, tmp_path):
    torch.manual_seed(0)
    config = get_preset("transformer-base", vocab_size=64, d_model=32, n_layers=2, n_decoder_layers=3, n_heads=4,
                        d_ff=48, max_seq_len=32, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    maps = attention(build_model(config).eval(), "5 9 13 2 40 7", target="11 3 8", name="tiny transformer")
    opened = _open(browser, tmp_path, maps, "attention-seq2seq")
    page = opened.page
    try:
        names = page.locator("section.attention-group h2").all_inner_texts()
        assert names == ["encoder self-attention", "decoder self-attention", "cross-attention"]
        counts = [page.locator(f"#group-{k} canvas.cell").count() for k in range(3)]
        assert counts == [2 * 4, 3 * 4, 3 * 4]
        cross = maps.groups[2]
        section = page.locator("#group-2")
        tip = _hover_cell(page, section, 1, 3, len(cross.queries), len(cross.keys))
        assert "“11” (1) → “2” (3): " in tip  # token ids: the model has no tokenizer
        assert float(tip.rsplit(": ", 1)[1]) == pytest.approx(cross.weights[0, 0, 1, 3].item(), abs=1e-4)
        opened.shot(tmp_path, "attention-seq2seq")
    finally:
        page.close()
