"""8-bit KV caches (int8, fp8_e4m3, fp8_e5m2 with a float16 scale per token and head): the codes
round-trip within half a step of their scale; attention reading them as stored (the native kernel)
equals attention over their float values; decoding through them stays close to the float cache and is
the same in the static and the paged cache; captured steps, speculative rewind and the prefix cache
keep working; the bytes are about half of bf16's; bad kv_dtype values are refused naming the option."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from anatomy import kv_format
from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.kernels import native
from anatomy.kv_format import Codes, kv_bytes_per_token, parse_kv_dtype, quantize, table

from ..conftest import llama_tiny
from ..speculative.conftest import tiny

KINDS = list(kv_format.CODES)


@pytest.mark.parametrize("kind", KINDS)
def test_codes_round_trip_within_their_precision(kind):
    x = torch.randn(2, 3, 17, 64) * torch.rand(2, 3, 17, 1) * 4  # rows of different magnitudes
    codes, scale = quantize(x, kind)
    assert codes.dtype == kv_format.code_dtype(kind) and scale.dtype == torch.float16 and scale.shape == (2, 3, 17)
    back = Codes(codes, scale, table(kind)).dequantize(torch.float32)
    amax = x.abs().amax(-1, keepdim=True)
    step = {"int8": amax / 127 / 2 * 1.01, "fp8_e4m3": amax / 16, "fp8_e5m2": amax / 8}[kind]  # half a step; fp8: 3 / 2 mantissa bits
    assert ((back - x).abs() <= step + 1e-6).all()


def test_all_zero_rows_stay_zero():
    codes, scale = quantize(torch.zeros(1, 1, 2, 8), "int8")
    assert (Codes(codes, scale, table("int8")).dequantize(torch.float32) == 0).all()


@pytest.mark.skipif(not native.loaded(), reason="the native library is built by make")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("isa", native.vector_paths())
def test_reading_codes_as_stored_equals_attention_over_their_values(kind, rows, isa):
    """The native reader against SDPA over the dequantized cache: GQA (9 query heads, 3 KV heads), a
    padded row and a decode mask, on the portable loops and each vector path this CPU has, 1e-5."""
    torch.manual_seed(0)
    B, H, H_kv, T, d = 2, 9, 3, 200, 64
    q = torch.randn(B, H, rows, d)
    k_codes, k_scale = quantize(torch.randn(B, H_kv, T, d), kind)
    v_codes, v_scale = quantize(torch.randn(B, H_kv, T, d), kind)
    k, v = Codes(k_codes, k_scale, table(kind)), Codes(v_codes, v_scale, table(kind))
    mask = torch.zeros(B, 1, rows, T)
    mask[0, ..., 150:] = float("-inf")
    mask[1, ..., :7] = float("-inf")
    with native.limited(isa):
        got = native.read_cache(q, k, v, mask=mask, scale=1 / math.sqrt(d))
    kd, vd = k.dequantize(torch.float32), v.dequantize(torch.float32)
    want = F.scaled_dot_product_attention(q, kd.repeat_interleave(3, 1), vd.repeat_interleave(3, 1), attn_mask=mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def step_logits(engine: DecoderEngine, prompts, steps: int = 40, tokens: torch.Tensor | None = None) -> torch.Tensor:
    """The logits [B, steps, V] of a greedy run, or of one fed `tokens` [B, steps] (teacher forcing)."""
    run = engine.start(prompts, SamplingParams(max_new_tokens=steps))
    logits = [run.prefill()]
    for i in range(steps - 1):
        logits.append(run.decode(logits[-1].argmax(-1) if tokens is None else tokens[:, i]))
    return torch.stack(logits, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_decoding_through_codes_stays_close_to_the_float_cache(kind):
    """Teacher-forced on the float cache's own greedy tokens: the logits of an 8-bit cache within a few
    percent, the argmax mostly the same (a random tiny model has flat distributions)."""
    model = llama_tiny()
    prompts = [[5, 17, 33, 2, 9, 41, 8], [60, 3]]
    ref = step_logits(DecoderEngine(model, capture=False), prompts)
    got = step_logits(DecoderEngine(model, capture=False, kv_dtype=kind), prompts, tokens=ref.argmax(-1))
    error = float((got - ref).norm() / ref.norm())
    assert error < {"int8": 0.01, "fp8_e4m3": 0.03, "fp8_e5m2": 0.06}[kind], error


def test_captured_steps_over_codes_equal_the_eager_ones():
    model = llama_tiny()
    captured = DecoderEngine(model, kv_dtype="int8")
    eager = DecoderEngine(model, kv_dtype="int8", capture=False)
    prompts = [[5, 17, 33], [60]]
    a, b = step_logits(captured, prompts, 50), step_logits(eager, prompts, 50)
    assert captured.captured_graphs == 1
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_speculative_rewind_over_codes_gives_the_plain_tokens():
    from anatomy.inference.speculative import NgramProposer, SpeculativeDecoder

    engine = DecoderEngine(tiny(), kv_dtype="int8")
    prompt = [5, 17, 33, 2, 9, 41, 5, 17, 33, 2]
    params = SamplingParams(max_new_tokens=30)
    plain = [int(t) for t in engine.tokens([prompt], params)]
    decoder = SpeculativeDecoder(engine, NgramProposer(), k=4, adaptive=False)
    assert [int(t) for t in decoder.tokens([prompt], params)] == plain
    assert decoder.stats.verifications > 0


@pytest.mark.parametrize("kind", ["int8", "bf16"])
def test_the_paged_cache_over_codes_decodes_as_the_static_one(kind):
    """The serving loop on an int8 (or bf16: a float cache narrower than the f32 model, whose masks and
    angles stay f32) paged cache: each prompt's greedy tokens equal the static engine's alone with the
    same cache, and again from the prefix cache."""
    from anatomy.serving.loop import ServingLoop

    from ...serving.conftest import engine_tokens, random_prompts, run_all

    engine = DecoderEngine(llama_tiny(), kv_dtype=kind)
    prompts = random_prompts(6)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    alone = [engine_tokens(engine, p, params) for p in prompts]
    loop = ServingLoop(engine, kv_bytes=10 ** 6, block_size=4)
    for _ in range(2):
        assert [[e.token for e in events] for events in run_all(loop, prompts, params)] == alone
    assert loop.blocks.hit_tokens > 0


def test_bytes_per_token_are_about_half_of_bf16s():
    config = llama_tiny().config
    per = {name: kv_bytes_per_token(config, name) for name in ("bf16", "int8", "fp8_e4m3")}
    values, scales = config.kv_values_per_token, config.kv_scales_per_token
    assert per["bf16"] == 2 * values and per["int8"] == per["fp8_e4m3"] == values + 2 * scales
    engine = DecoderEngine(llama_tiny(), kv_dtype="int8")
    cache = engine.start([[1, 2, 3]], SamplingParams(max_new_tokens=5)).cache
    assert cache.nbytes == per["int8"] * (cache.num_blocks + 1) * cache.block_size  # batch 1, and the scratch block
    paged = engine.paged_cache(num_blocks=10, block_size=4)
    assert paged.nbytes == per["int8"] * 11 * 4  # the scratch block too


def test_bad_kv_dtypes_are_refused_naming_the_option(monkeypatch):
    with pytest.raises(InputError, match="kv_dtype='int3' is not one of"):
        parse_kv_dtype("int3")
    with pytest.raises(InputError, match="--kv-dtype 'q8_0' is not one of f32, f16, bf16, int8"):
        parse_kv_dtype("q8_0", option="--kv-dtype")
    monkeypatch.setattr(kv_format, "_fp8_works", lambda name: False)
    with pytest.raises(InputError, match="has no fp8_e4m3 on this machine; available: f32, f16, bf16, int8"):
        parse_kv_dtype("fp8_e4m3", option="--kv-dtype")
    with pytest.raises(InputError, match="kv_dtype"):
        DecoderEngine(llama_tiny(), kv_dtype="int4")


@pytest.mark.slow
def test_an_int8_cache_costs_smollm2_under_half_a_percent_of_nll(smollm2_gguf_path):
    """SmolLM2 from its Q4_1 file, the first 1,024 tokens of English fed through the cache in spans of
    128: mean token NLL with an int8 cache within 0.5% of the bf16 cache's (the issue's bar; `python -m
    benchmarks kv` measures all 2,068 tokens and the fp8 kinds)."""
    from pathlib import Path

    import anatomy
    from anatomy.inference.quality import cached_nll

    model = anatomy.load(smollm2_gguf_path)
    text = (Path(__file__).parents[2] / "data" / "english.txt").read_text()
    ids = anatomy.load_tokenizer(smollm2_gguf_path).encode(text)[:1024]
    base = cached_nll(DecoderEngine(model, kv_dtype="bf16"), ids, chunk=128)
    int8 = cached_nll(DecoderEngine(model, kv_dtype="int8"), ids, chunk=128)
    assert abs(int8 / base - 1) < 0.005, (base, int8)
