"""Perplexity, KL divergence and top-1 agreement through the decode step (inference/perplexity.py):
the positions each mode scores against a float64 computation over the model's own forward; and on
SmolLM2, the figures of each token fed through the engine's decode step against HF transformers
fp32 on the same file: f32 weights' perplexity within 0.1%, the default weights' NLL within 0.5%,
the fused decode operator forced and counted on every step (eager and captured)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import anatomy
from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.engine.run import CAPTURE_AFTER
from anatomy.inference.perplexity import Tally, perplexity, spans_of
from anatomy.kernels import decode_block, native

from .conftest import llama_tiny

ENGLISH = Path(__file__).parents[1] / "data" / "english.txt"
TOKENS = 256  # of english.txt, for a test of modest time: both bounds hold with a wide margin here


def _nll64(model, chunk: list[int], first: int) -> float:
    """Sum of -log p(chunk[j + 1]) over j = first .. len(chunk) - 2, from the model's forward in float64."""
    with torch.no_grad():
        logp = model(torch.tensor([chunk]))[0].double().log_softmax(-1)  # [n, V]
    return -sum(logp[j, chunk[j + 1]].item() for j in range(first, len(chunk) - 1))


def test_the_whole_text_scores_every_prediction():
    model = llama_tiny()
    ids = torch.randint(0, 97, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    q = perplexity(DecoderEngine(model), model, ids)
    assert (q.tokens, q.chunks, q.ctx) == (39, 1, None)
    assert q.reference_nll == pytest.approx(_nll64(model, ids, 0) / 39, rel=1e-6)
    assert q.nll == pytest.approx(q.reference_nll, rel=1e-5)  # f32 weights: the decode steps give the forward's logits
    assert abs(q.kl_divergence) < 1e-8 and q.top1_agreement == 1.0
    assert q.perplexity == pytest.approx(math.exp(q.nll))


@pytest.mark.parametrize("bos", [None, 5])
def test_chunks_score_the_second_half_of_each_as_llama_perplexity_does(bos):
    """21 tokens in chunks of 8: two chunks (the last 5 tokens dropped), each scoring the predictions of
    its tokens 5..7 (llama-perplexity: logits at positions n_ctx/2 .. n_ctx-2), with `bos` in slot 0."""
    model = llama_tiny()
    ids = torch.randint(6, 97, (21,), generator=torch.Generator().manual_seed(4)).tolist()
    chunks = [ids[0:8], ids[8:16]]
    if bos is not None:
        chunks = [[bos] + c[1:] for c in chunks]
    q = perplexity(DecoderEngine(model), model, ids, ctx=8, bos=bos)
    assert (q.tokens, q.chunks, q.ctx) == (6, 2, 8)
    expected = sum(_nll64(model, c, 4) for c in chunks) / 6
    assert q.reference_nll == pytest.approx(expected, rel=1e-6)
    assert q.nll == pytest.approx(expected, rel=1e-5)


def test_the_tally_against_torchs_kl_div():
    g = torch.Generator().manual_seed(5)
    got, ref = torch.randn(7, 11, generator=g), torch.randn(7, 11, generator=g)
    ref[0] = got[0] + 0.01  # the same top token
    targets = torch.randint(0, 11, (7,), generator=g)
    tally = Tally()
    tally.add(got[:3], ref[:3], targets[:3])
    tally.add(got[3:], ref[3:], targets[3:])
    q = tally.result(chunks=1, ctx=None)
    lg, lr = got.double().log_softmax(-1), ref.double().log_softmax(-1)
    assert q.kl_divergence == pytest.approx(F.kl_div(lg, lr, log_target=True, reduction="sum").item() / 7, rel=1e-12)
    assert q.nll == pytest.approx(F.cross_entropy(got.double(), targets).item(), rel=1e-12)
    assert q.reference_nll == pytest.approx(F.cross_entropy(ref.double(), targets).item(), rel=1e-12)
    assert q.top1_agreement == (got.argmax(-1) == ref.argmax(-1)).double().mean().item() and q.top1_agreement > 0


@pytest.mark.parametrize("n, ctx, message", [
    (1, None, "the text has 1 token(s): perplexity needs at least 2"),
    (65, None, "the text has 65 tokens, more than the model's context of 64"),
    (10, 2, "ctx=2: a chunk needs at least 3 tokens"),
    (10, 65, "ctx=65: a chunk needs at least 3 tokens (one scored) and at most the model's context of 64"),
    (10, 16, "the text has 10 tokens, fewer than one chunk of ctx=16"),
])
def test_bad_lengths_name_the_value(n, ctx, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spans_of(llama_tiny().config, list(range(n)), ctx)


@pytest.fixture(scope="module")
def english_ids(smollm2_tokenizer) -> list[int]:
    return smollm2_tokenizer.encode(ENGLISH.read_text())[:TOKENS]


@pytest.fixture(scope="module")
def hf_nll(hf_smollm2, english_ids) -> float:
    """HF transformers fp32's mean NLL of english_ids[1:], in float64 from its logits."""
    with torch.no_grad():
        logits = hf_smollm2(torch.tensor([english_ids])).logits[0, :-1].double()  # [n-1, V]
    return F.cross_entropy(logits, torch.tensor(english_ids[1:])).item()


@pytest.mark.slow
def test_f32_weights_perplexity_through_decode_steps_is_hf_fp32s(smollm2, english_ids, hf_nll):
    q = perplexity(DecoderEngine(smollm2), smollm2, english_ids)
    assert q.tokens == TOKENS - 1
    assert abs(q.perplexity / math.exp(hf_nll) - 1) < 1e-3, (q.perplexity, math.exp(hf_nll))
    assert abs(q.reference_perplexity / math.exp(hf_nll) - 1) < 1e-3
    assert q.kl_divergence < 1e-6 and q.top1_agreement > 0.99


@pytest.mark.slow
@pytest.mark.skipif(not native.available(), reason="the fused decode block needs the native library's AVX2 or "
                                                   "AVX-512 path")
def test_default_weights_decode_path_nll_within_half_a_percent_of_hf_fp32(smollm2_gguf_path, smollm2, english_ids,
                                                                         hf_nll, monkeypatch):
    """The shipped file's own blocks through the fused decode operator (forced: no timing decides it),
    every decode step counted running it, the eager ones and the captured graph's replays."""
    monkeypatch.setattr(decode_block, "faster", lambda *args, **kwargs: True)
    engine = DecoderEngine(anatomy.load(smollm2_gguf_path))
    assert engine.native_blocks == engine.config.n_layers
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        q = perplexity(engine, smollm2, english_ids)
    steps = len(english_ids) - 2  # ids[1:-1], one decode step each
    assert steps > CAPTURE_AFTER and engine.captured_graphs == 1
    calls = sum(e.count for e in prof.key_averages() if e.key == "anatomy::decode_block")
    assert calls >= engine.native_blocks * steps, (calls, steps)
    assert abs(q.nll / hf_nll - 1) < 0.005, (q.nll, hf_nll)
    assert q.kl_divergence < 1e-3 and q.top1_agreement > 0.97
