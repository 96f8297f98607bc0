"""`anatomy serve` with a Gemma 3-shaped model (5 sliding-window layers to 1 global, q/k norms, two RoPE
bases; random weights, the default model's tokenizer) at an 8k context and 16 concurrent requests: the
sliding-window layers keep a group of blocks of their own (serving/window_blocks.py), the server's
metrics show what its sequences hold, and every answer equals offline generation's (fp32, greedy)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from .conftest import Server

pytestmark = pytest.mark.slow
CONTEXT, WINDOW, BLOCK, SEQS = 8192, 128, 16, 16


@pytest.fixture(scope="module")
def gemma3_dir(smollm2_tokenizer, tmp_path_factory):
    import anatomy

    torch.manual_seed(0)
    vocab = smollm2_tokenizer.vocab_size
    config = anatomy.get_preset("gemma-3-1b", vocab_size=vocab, d_model=64, n_layers=6, n_heads=4, n_kv_heads=1,
                                head_dim=16, d_ff=128, max_seq_len=CONTEXT, sliding_window=WINDOW, attn_scale=0.25,
                                sliding_window_layers=(0, 1, 2, 3, 4),
                                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    path = tmp_path_factory.mktemp("gemma3-hf")
    anatomy.save(anatomy.build_model(config).eval(), path)
    smollm2_tokenizer.save(path)
    return path


def test_sixteen_requests_at_an_8k_context_hold_the_windowed_cache(gemma3_dir):
    import anatomy

    prompts = [[(7 * i + 13 * j) % 4000 + 100 for j in range(n)]
               for i, n in enumerate([CONTEXT - 64] + [300 + 40 * i for i in range(SEQS - 1)])]
    model = anatomy.load(str(gemma3_dir)).eval()
    offline = [anatomy.generate(model, p, max_new_tokens=8, ignore_eos=True).token_ids for p in prompts]

    per_token = 2 * 6 * 16 * 4  # K and V, 6 layers, one KV head of 16 f32 values
    window_blocks = SEQS * (-(-(WINDOW + 512) // BLOCK) + 1)  # each sequence's window and a step's tokens
    memory = SEQS * CONTEXT * per_token // 6 + window_blocks * BLOCK * per_token * 5 // 6 + 8 * BLOCK * per_token
    server = Server("--model", str(gemma3_dir), "--weights", "f32", "--kv-memory", str(memory),
                    "--batch-size", str(SEQS), "--embedding-model", "none")
    try:
        assert "the sliding-window layers (5 of 6, window 128)" in server.output()
        held, done = [], threading.Event()

        def ask(prompt):
            return server.post("/v1/completions", {"model": str(gemma3_dir), "prompt": prompt, "max_tokens": 8,
                                                   "temperature": 0, "ignore_eos": True,
                                                   })

        def watch():
            while not done.is_set():
                held.append((server.metric("anatomy_kv_held_bytes"), server.metric("anatomy_kv_window_blocks_used")))
                done.wait(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        with ThreadPoolExecutor(SEQS) as pool:
            answers = list(pool.map(ask, prompts))
        done.set()
        watcher.join()
        assert all(status == 200 for status, _ in answers), answers[0]
        tokenizer = anatomy.load_tokenizer(str(gemma3_dir))
        for (_, body), tokens in zip(answers, offline):
            assert body["choices"][0]["text"] == tokenizer.decode(tokens, skip_special_tokens=True)
        assert server.metric("anatomy_kv_blocks_total") * BLOCK >= SEQS * CONTEXT, "16 sequences of 8k tokens fit"
        assert server.metric("anatomy_kv_window_blocks_total") == window_blocks
        assert server.metric("anatomy_kv_cache_bytes") <= 0.25 * SEQS * CONTEXT * per_token, \
            "the pools: 16 sequences of 8k tokens in a quarter of what full caches need"
        peak_bytes, peak_window = max(h[0] for h in held), max(h[1] for h in held)
        assert 0 < peak_window <= window_blocks
        tokens_in_flight = sum(len(p) + 8 for p in prompts)
        assert 0 < peak_bytes <= 0.3 * tokens_in_flight * per_token, "held: the global layer's blocks and windows"
        server.wait_idle()
        assert server.metric("anatomy_kv_window_blocks_used") == 0
    finally:
        server.close()
