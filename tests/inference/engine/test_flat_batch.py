"""One forward over chunks of every length (flat_batch.py): prefill chunks, decode rows and verification
rows in one step give each row the logits of the model's full forward over its sequence, through one
call of the stack; a serving step of any mix of them is one engine step and at most one forward."""

from __future__ import annotations

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.inference.engine.flat_batch import by_length
from anatomy.inference.sampling import SamplingParams
from anatomy.serving.loop import ServingLoop

from ..conftest import deepseek_tiny, gemma3_tiny, gpt2_tiny, gpt_oss_tiny, llama_tiny

BS = 4
SEQS = [list(range(10, 31)), list(range(40, 47)), list(range(50, 59)), list(range(60, 65)), list(range(70, 82)),
        list(range(20, 28))]
# (already in the cache, then this step's tokens, logits wanted) per sequence: a prefill chunk's rest,
# two decode rows, a verification row of 1 + 3 tokens, a new prompt, and a second chunk as long as the first
MIXED = [(13, 8, 1), (6, 1, 1), (5, 4, 4), (0, 5, 1), (11, 1, 1), (0, 8, 8)]


def alibi_tiny():
    torch.manual_seed(0)
    return build_model(get_preset("llama-7b", vocab_size=97, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, n_layers=2,
                                  max_seq_len=64, position="alibi")).eval()


def windowed_tiny():
    torch.manual_seed(0)
    return build_model(get_preset("llama-7b", vocab_size=97, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, n_layers=2,
                                  max_seq_len=64, sliding_window=5, sliding_window_layers=(0,))).eval()


MODELS = dict(llama=llama_tiny, gpt2=gpt2_tiny, gemma3=gemma3_tiny, gpt_oss=gpt_oss_tiny, deepseek=deepseek_tiny,
              alibi=alibi_tiny, window=windowed_tiny)


def test_chunks_are_grouped_by_length_in_order_of_arrival():
    chunks = [Chunk([1] * n, 0, [0]) for n in (8, 1, 4, 5, 1, 8)]
    assert by_length(chunks) == [[0, 5], [1, 4], [2], [3]]


@pytest.mark.parametrize("kind, kv_dtype", [(kind, kv) for kv in (None, "int8", "bf16") for kind in MODELS
                                            if not (kind == "deepseek" and kv == "int8")])  # latent: floats only
@torch.inference_mode()
def test_a_mixed_step_is_one_forward_with_each_rows_full_forward_logits(kind, kv_dtype):
    """Six sequences with earlier tokens in scattered blocks, then one step of a prefill chunk's rest,
    two decode rows, a verification row (logits of all 4 tokens), a new prompt and a prompt whose every
    logit is wanted: one call of the stack, and each wanted logit equals the full forward's at that
    position (fp32 within 1e-4; an int8 or bf16 cache of the f32 model within 0.05 of logits of scale ~1)."""
    model = MODELS[kind]()
    engine = DecoderEngine(model, kv_dtype=kv_dtype)
    cache = engine.paged_cache(num_blocks=40, block_size=BS)
    tables = [list(range(39 - 6 * i, 33 - 6 * i, -1)) for i in range(len(SEQS))]  # blocks out of order
    before = [Chunk(s[:done], 0, t) for s, t, (done, _, _) in zip(SEQS, tables, MIXED) if done]
    for n in sorted({len(c.tokens) for c in before}):  # earlier steps, one length at a time
        engine.step(cache, [c for c in before if len(c.tokens) == n])
    chunks = [Chunk(s[done:done + n], done, t, logits=w) for s, t, (done, n, w) in zip(SEQS, tables, MIXED)]
    calls = []
    run = engine.model.stack.forward_pass
    engine.model.stack.forward_pass = lambda *a, **k: calls.append(a[0].shape) or run(*a, **k)
    logits = engine.step(cache, chunks)
    assert calls == [(1, sum(n for _, n, _ in MIXED))], "one forward over every token, nothing padded"
    expected = torch.cat([model(torch.tensor([s[:done + n]]))[0, done + n - w:done + n]
                          for s, (done, n, w) in zip(SEQS, MIXED)])
    tol = 1e-4 if kv_dtype is None else 5e-2
    assert logits.shape == expected.shape
    assert torch.allclose(logits, expected, atol=tol), (logits - expected).abs().max()


def test_every_serving_step_is_one_engine_step_and_at_most_one_forward():
    """A loop with prompt-lookup speculation and prompts arriving while others decode: each step hands
    all its chunks (prefill, decode and verification rows, several mixed in one step) to one engine
    step, which runs at most one forward of the stack (none where the decode graph is replayed); the
    greedy tokens equal the model's own."""
    model = llama_tiny()
    engine = DecoderEngine(model)
    loop = ServingLoop(engine, kv_bytes=10 ** 6, block_size=BS, max_step_tokens=24)
    steps, forwards = [], []
    step, run = engine.step, engine.model.stack.forward_pass
    engine.step = lambda cache, chunks, **kw: (steps[-1].append([(len(c.tokens), c.logits) for c in chunks])
                                               or step(cache, chunks, **kw))
    engine.model.stack.forward_pass = lambda *a, **k: forwards.__setitem__(-1, forwards[-1] + 1) or run(*a, **k)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    prompts = [[5, 6, 7, 8] * 4, [9, 10] * 7, list(range(20, 53)), [3, 4, 5] * 5]
    events = [[] for _ in prompts]
    for i, prompt in enumerate(prompts):
        loop.submit(prompt, params, events[i].append, speculative_tokens=3)
        for _ in range(2):
            steps.append([]), forwards.append(0)
            loop.step()
    while True:
        steps.append([]), forwards.append(0)
        if not loop.step():
            break
    assert all(len(s) <= 1 for s in steps) and max(forwards) == 1
    kinds = [{"decode" if n == 1 else "verify" if w == n else "prefill" for n, w in s[0]} for s in steps if s]
    assert any({"prefill", "decode"} <= k for k in kinds), "a prompt's chunk ran beside decoding rows"
    assert any({"prefill", "verify"} <= k for k in kinds), "a prompt's chunk ran beside verifying rows"
    for prompt, got in zip(prompts, events):
        ids = list(prompt)
        with torch.no_grad():
            for event in got:
                assert event.token == int(model(torch.tensor([ids]))[0, -1].argmax())
                ids.append(event.token)
