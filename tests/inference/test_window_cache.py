"""Sliding-window layers against HF transformers: Gemma 3 (5-token windows with a RoPE base of their
own, then a global layer) and Mistral (every layer windowed), each read from an HF checkpoint. A static
KVCache keeps every slot and its masks apply the window: decoding through it gives each position the
logits of the full forward (fp32, 1e-4), after a left-padded prefill and after rewinds. An engine's run
keeps rings of blocks (run.py) that hold less than full tables, wrap with HF's logits, keep HF's greedy
tokens, and refuse a rewind past the ring's slack."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.errors import InputError
from anatomy.inference.engine import PagedKVCache
from anatomy.inference.engine.kv_cache import KVCache
from anatomy.inference.engine.run import ring_blocks
from anatomy.inference.sampling import SamplingParams

transformers = pytest.importorskip("transformers")
TOL = 1e-4
V = 101
SMALL = dict(vocab_size=V, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _configs() -> dict:
    T = transformers
    return {
        "gemma3": T.Gemma3TextConfig(**SMALL, num_hidden_layers=3, head_dim=16, sliding_window=5, query_pre_attn_scalar=16,
                                     layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                     rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                      "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}),
        "mistral": T.MistralConfig(**SMALL, num_hidden_layers=2, sliding_window=4),
    }


@pytest.fixture(scope="module", params=["gemma3", "mistral"])
def pair(request, tmp_path_factory):
    """(HF model, anatomy's model loaded from its checkpoint)."""
    torch.manual_seed(3)
    config = _configs()[request.param]
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    directory = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(directory)
    return hf, anatomy.load(directory)


def _ids(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, V - 1, (2, length), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    return ids, mask


@torch.no_grad()
def test_windowed_layers_decode_as_the_full_forward(pair):
    """A prefill of 9 slots (past the window), then one token at a time to 30: every step's logits are
    HF's full forward's at that position; every layer of the static cache holds all 30 slots."""
    hf, model = pair
    ids, mask = _ids(30)
    full = hf(ids, attention_mask=mask).logits
    cache = KVCache(model.config, batch=2, max_len=30)
    assert all(layer.max_len == 30 for layer in cache)
    steps = [model(ids[:, :9], attention_mask=mask, cache=cache, input_pos=torch.arange(9))[:, -1]]
    for t in range(9, 30):
        steps.append(model(ids[:, t:t + 1], attention_mask=mask, cache=cache, input_pos=torch.tensor([t]))[:, -1])
    got = torch.stack(steps, 1)  # positions 8..29
    assert (got - full[:, 8:]).abs().max() <= TOL


@torch.no_grad()
def test_a_span_rewound(pair):
    """Verification-like spans of 2 tokens, the second taken back each time (written over next)."""
    hf, model = pair
    ids, mask = _ids(24)
    full = hf(ids, attention_mask=mask).logits
    cache = KVCache(model.config, batch=2, max_len=24)
    model(ids[:, :6], attention_mask=mask, cache=cache, input_pos=torch.arange(6))
    for t in range(6, 22):
        wrong = torch.randint(3, V - 1, (2, 1))  # a rejected proposal at slot t + 1
        span = torch.cat([ids[:, t:t + 1], wrong], 1)
        out = model(span, attention_mask=mask, cache=cache, input_pos=torch.arange(t, t + 2))
        assert (out[:, 0] - full[:, t]).abs().max() <= TOL


def _run_caches(config, tokens: int) -> tuple[int, int, int]:
    """(bytes of a run's paged cache of one row with rings, bytes without, blocks of a ring) on meta."""
    blocks = tokens // 16
    ring = ring_blocks(config, blocks=blocks, block_size=16, prompt=0, exact=True)
    kept = dict(num_blocks=blocks, block_size=16, dtype=torch.float32, device="meta")
    return PagedKVCache(config, window_blocks=ring, **kept).nbytes, PagedKVCache(config, **kept).nbytes, ring


def test_rings_hold_less_than_full_caches(pair):
    """A run's windowed layers hold a ring of blocks (and a scratch block), the others a full table."""
    _, model = pair
    config = model.config
    ringed, full, ring = _run_caches(config, 4096)
    windowed = sum(1 for i in range(config.n_layers) if config.layer_window(i))
    expected = full * (config.n_layers - windowed + windowed * (ring + 1) / 257) / config.n_layers
    assert ringed == pytest.approx(expected, rel=1e-12) and ringed < full


@torch.no_grad()
def test_generation_keeps_hfs_greedy_tokens(pair):
    """80 tokens after a 6-token prompt through the engine (rings of window + 64 slots) against HF's
    generate with its own sliding caches."""
    hf, model = pair
    prompt = [5, 17, 33, 8, 91, 40]
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=80, do_sample=False, min_new_tokens=80)[0, 6:].tolist()
    engine = anatomy.engine_for(model)
    got = anatomy.generate(engine, [prompt], max_new_tokens=80, ignore_eos=True)[0].token_ids
    assert got == want


def test_a_rewind_past_the_slack_is_refused(pair):
    _, model = pair
    engine = anatomy.engine_for(model)
    run = engine.start([list(range(3, 90))], SamplingParams(max_new_tokens=80))  # 167 slots: rings
    assert run.cache.window_blocks is not None and run.cache.window_blocks < run.cache.num_blocks
    token = run.choose(run.prefill())
    for _ in range(65):
        token = run.choose(run.decode(token))
    with pytest.raises(InputError, match="ring keeps 64 beyond its window"):
        run.rewind(run.slot - 65)
    run.rewind(run.slot - 64)


def test_gemma3_1b_holds_a_sixth_of_a_full_cache_at_32k():
    """In a run, 22 of its 26 layers keep rings of 512 + 2 * 64 positions and a block instead of 32,768
    (the issue's bound: a quarter)."""
    ringed, full, ring = _run_caches(anatomy.get_preset("gemma-3-1b"), 32768)
    assert ring == 41 and ringed == pytest.approx(full * (4 + 22 * 42 / 2049) / 26, rel=1e-12)
    assert ringed <= 0.25 * full


@torch.no_grad()
def test_a_runs_rings_wrap_and_keep_the_full_forwards_logits(pair):
    """A run's sliding-window layers hold rings of blocks (window + 64 positions and a block): two prompts
    of 150 and 97 tokens, then 250 tokens each fed one at a time with spans of three verified and two taken
    back, far past the ring, give HF's full-forward logits at every position (fp32, 1e-4)."""
    hf, model = pair
    ids = torch.randint(3, V - 1, (2, 400), generator=torch.Generator().manual_seed(5))
    engine = anatomy.engine_for(model)
    prompts = [ids[0, :150].tolist(), ids[1, 53:150].tolist()]
    run = engine.start(prompts, SamplingParams(max_new_tokens=260))
    ring = run.cache.window_blocks // 2
    assert ring * run.cache.block_size < 200 and run.cache.window_blocks < run.cache.num_blocks
    full = [hf(ids[:1]).logits[0], hf(ids[1:, 53:]).logits[0]]  # row 1 starts at 53: positions shift by 53
    got = run.prefill()
    for t in range(150, 400):
        expected = torch.stack([full[0][t - 1], full[1][t - 54]])
        assert (got - expected).abs().max() <= TOL, t
        if t % 7 == 0:  # verify t and two wrong guesses; keep t only
            span = torch.cat([ids[:, t:t + 1], torch.full((2, 2), 7)], 1)
            got = run.verify(span)[:, 0]
            run.rewind(run.slot - 2)
        else:
            got = run.decode(ids[:, t])
