"""anatomy::decode_block (kernels/native/block.cpp) against the block it stands for, and the decode
attention reading a paged pool through its block tables against the same rows gathered by torch."""

import numpy as np
import pytest
import torch

import anatomy
from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.inference.engine.kv_cache import KVCache
from anatomy.inference.sampling import SamplingParams
from anatomy.kernels import native
from anatomy.kernels.decode_block import LINEARS, ROWS, NativeBlock, fusable

@pytest.fixture(scope="module")
def q4_model(smollm2_gguf_path):
    return anatomy.load(smollm2_gguf_path)  # the file's Q4_1 blocks: the native layouts' formats


@pytest.mark.skipif(not native.loaded(), reason="the native library is built by make")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_paged_attention_reads_the_pool_as_the_gathered_rows(dtype):
    torch.manual_seed(0)
    N, bs, H_kv, d, B, nb = 12, 16, 3, 64, 2, 4
    k, v = (torch.randn(N, bs, H_kv, d).to(dtype) for _ in range(2))
    tables = torch.tensor([[3, 7, 1, 0], [11, 2, 5, 9]])
    q = torch.randn(B, H_kv, 3, d)
    mask = torch.zeros(B, 1, 1, nb * bs)
    mask[1, ..., 50:] = float("-inf")
    gathered = [x[tables.flatten()].view(B, nb * bs, H_kv, d).transpose(1, 2) for x in (k, v)]  # [B, H_kv, T, d]
    want = torch.ops.anatomy.decode_attention(q, *gathered, None, None, mask, None, 0.125)
    got = torch.ops.anatomy.decode_attention(q, k, v, None, None, mask, None, 0.125, tables=tables)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    with pytest.raises(RuntimeError, match="outside the pool"):
        torch.ops.anatomy.decode_attention(q, k, v, None, None, mask, None, 0.125, tables=tables + N)


def test_native_blocks_decode_as_the_blocks_do(q4_model, smollm2_tokenizer, native_forced):
    """Greedy tokens of the README's prompt equal the torch blocks' for 32 tokens; over a paged cache the
    logits of every step agree within 10% of their largest (the operator computes in float32 with int8
    activations where the plan passed them, the blocks in bfloat16), and so does every token that is
    not a near-tie."""
    plain, fused = DecoderEngine(q4_model, native_blocks=False), DecoderEngine(q4_model)  # fused by default
    blocks = fused.model.stack.blocks
    assert fused.native_blocks == len(blocks) and all(isinstance(b, NativeBlock) for b in blocks)
    assert {b.max_rows for b in blocks} == {ROWS[-1]}  # the operator won (forced) at every row count
    assert not any(isinstance(b, NativeBlock) for b in plain.model.stack.blocks) and fusable(plain.model.stack.blocks[0])
    prompt = smollm2_tokenizer.encode("What is the capital of France?")
    params = SamplingParams(max_new_tokens=32)
    assert [int(t) for t in fused.tokens([prompt], params)] == [int(t) for t in plain.tokens([prompt], params)]
    caches = [e.paged_cache(num_blocks=16, block_size=16) for e in (plain, fused)]
    blocks = list(range(16))
    logits = [e.step(c, [Chunk(prompt, 0, blocks)]) for e, c in zip((plain, fused), caches)]
    for j in range(40):  # past PAGED_RECORD_AFTER: the captured paged step holds the operator
        token = int(logits[0].argmax())
        top = logits[0][0].topk(2).values
        if top[0] - top[1] > 1.0:  # not a near-tie (the logits differ by ~0.5 of ~25 here)
            assert token == int(logits[1].argmax())
        logits = [e.step(c, [Chunk([token], len(prompt) + j, blocks)]) for e, c in zip((plain, fused), caches)]
        assert (logits[1] - logits[0]).abs().max() < 0.1 * logits[0].abs().max()


def test_a_float16_cache_is_written_and_read_by_the_operator(q4_model, smollm2_tokenizer, fused_steps, native_forced):
    """kv_dtype f16 (llama.cpp's default cache) decodes through the operator as float32 and bfloat16 do,
    and its logits stay within 10% of their largest of the same engine's over a float32 cache, the bound
    the operator is held to against the blocks (the cache's float16 rounding moves the int8 activations'
    rounding: ~6% here, as a bfloat16 cache does; the attention over float16 is checked to 1e-3 in
    test_native_attention_and_norm.py); the tokens fed are the float32 run's greedy ones, 24 steps."""
    engines = [DecoderEngine(q4_model, kv_dtype=kind) for kind in ("f32", "f16")]
    assert all(e.native_blocks == q4_model.config.n_layers for e in engines)
    computed = fused_steps
    prompt = smollm2_tokenizer.encode("What is the capital of France?")
    runs = [e.start([prompt], SamplingParams(max_new_tokens=24)) for e in engines]
    logits = [run.prefill() for run in runs]
    for _ in range(23):
        token = logits[0].argmax(-1)
        computed.clear()
        logits = [run.decode(token) for run in runs]
        assert computed and all(computed)  # every block of both engines' step went through the operator
        assert (logits[1] - logits[0]).abs().max() < 0.1 * logits[0].abs().max()


# GGUF types whose blocks the operator reads in their own layouts: (type, bytes per block, where d sits)
BLOCKS = {"Q5_0": (32, 22, 0), "Q6_K": (256, 210, 208), "Q8_0": (32, 34, 0)}


def random_format(kind: str, N: int, K: int, seed: int):
    """Random blocks of GGUF type `kind` (codes uniform, float16 d ~ 3e-5 or 1e-3) in anatomy's format."""
    from anatomy.checkpoints.gguf_types import TENSOR_TYPES_BY_NAME
    from anatomy.weights.gguf_blocks import format_from_gguf

    per, size, at = BLOCKS[kind]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(N * K // per, size), dtype=np.uint8)
    scale = 3e-5 if kind == "Q6_K" else 2e-3
    blocks[:, at:at + 2] = (rng.standard_normal((N * K // per, 1)) * scale).astype(np.float16).view(np.uint8)
    return format_from_gguf(blocks.reshape(-1), TENSOR_TYPES_BY_NAME[kind], (N, K), label=f"w{seed}")


def random_model(kind: str, max_seq_len: int = 32):
    """A tiny decoder whose every block matrix holds random blocks of GGUF type `kind`."""
    from anatomy import build_model, get_preset
    from anatomy.weights.choice import install, matrices

    torch.manual_seed(0)
    model = build_model(get_preset("llama-7b", vocab_size=96, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512,
                                   n_layers=2, max_seq_len=max_seq_len)).eval()
    formats = {name: random_format(kind, *m.weight.shape, seed=i)
               for i, (name, m) in enumerate(matrices(model).items()) if name.startswith("stack.blocks.")}
    install(model, formats, dtype=torch.float32)
    return model


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_the_operator_runs_int5_int6_and_int8_tiles(kind, fused_steps, native_forced):
    """A tiny decoder whose every block matrix is Q5_0 (int5), Q6_K (int6) or Q8_0 (int8g, on q8 tiles
    where the plan holds them): every block is one operator, also when the engine took the weights (it
    fuses on the layouts the plan holds), and its paged decode steps give the model's own forward (the
    exact products of the stored weights) to the activations' int8 rounding."""
    from anatomy.kernels.candidates import relative_error

    model = random_model(kind)
    tokens = [5, 17, 33, 2, 9, 41, 8, 60]
    with torch.no_grad():
        reference = model(torch.tensor([tokens]))[0]  # [S, V]
    engine = DecoderEngine(model, take_weights=True)
    assert engine.native_blocks == 2
    cache = engine.paged_cache(num_blocks=2, block_size=16)
    fused_steps.clear()
    logits = torch.stack([engine.step(cache, [Chunk([t], i, [0, 1])])[0] for i, t in enumerate(tokens)])
    assert len(fused_steps) == 2 * len(tokens) and all(fused_steps)  # every one-token step's every block
    # each of the 8 block products on a token's path may round its input to int8 (~0.5% rms): sqrt(8), 2x slack
    assert relative_error(logits, reference.double()) < 2 * 3 * 5e-3


@torch.no_grad()
def test_the_operator_decodes_over_a_static_cache(q4_model, smollm2_tokenizer, fused_steps, native_forced):
    """A static KVCache called directly (the paged cache with one block table per row, blocks of 12 slots
    here): the operator writes and reads it at each decode step, within 10% of the blocks' largest logit."""
    plain, fused = DecoderEngine(q4_model, native_blocks=False), DecoderEngine(q4_model)
    prompt = smollm2_tokenizer.encode("What is the capital of France?")
    ids = torch.tensor([prompt + [260, 1345, 30, 2]])
    P = len(prompt)
    logits = []
    for model in (plain.model, fused.model):
        cache = KVCache(model.config, batch=1, max_len=36, dtype=torch.float32)
        steps = [model(ids[:, :P], cache=cache, input_pos=torch.arange(P), last_only=True)[:, -1]]
        steps += [model(ids[:, t:t + 1], cache=cache, input_pos=torch.tensor([t]), last_only=True)[:, -1]
                  for t in range(P, ids.shape[1])]
        logits.append(torch.stack(steps).float())
    assert cache.paged.block_size == 12 and any(fused_steps)
    assert (logits[1] - logits[0]).abs().max() < 0.1 * logits[0].abs().max()


def eight_row_errors(plain, fused, prompts, blocks, token, fused_steps) -> list[float]:
    """Each prompt's prefill alone (`blocks` blocks of 16 slots each), then one step of `token` for the 8
    sequences together: through the torch blocks (`plain`), through the operator as planned (asserted to
    run it), and through the operator with int16 activations at every row count (as before the batch
    phase's choice); the last two's distances from the first, relative to its norm."""
    tables = [[blocks * i + j for j in range(blocks)] for i in range(len(prompts))]

    def eight_rows(engine):
        cache = engine.paged_cache(num_blocks=blocks * len(prompts), block_size=16)
        for p, t in zip(prompts, tables):
            engine.step(cache, [Chunk(p, 0, t)])
        return engine.step(cache, [Chunk([token], len(p), t) for p, t in zip(prompts, tables)])  # [8, V]

    want = eight_rows(plain)
    fused_steps.clear()
    planned = eight_rows(fused)
    assert fused_steps[-1] is True  # the 8-row step ran as the operator
    for b in fused.model.stack.blocks:
        b.routes = [(None, b.int8)]
    int16 = eight_rows(fused)
    return [float((got - want).norm() / want.norm()) for got in (planned, int16)]


def test_past_decodes_rows_the_tiles_take_the_plans_batch_activations(q4_model, smollm2_tokenizer, fused_steps,
                                                                       native_forced):
    """At decode's rows the q4 tiles' products round x to int16; past them each takes the activations of
    the plan's phase for that row count (8 sequences: the batch phase, int8 where the plan chose the int8
    tile kernel; more: the prompt phase's int16), as the torch blocks' products do there. An 8-sequence
    step through the operator then lies closer to the torch blocks' step than the same operator with int16
    activations (measured: 1.8% against 3.7% of the logits' norm; the blocks' attention and norms round on
    their own paths)."""
    from anatomy.kernels.candidates import Q4T
    from anatomy.kernels.decode_block import INT8_TILE_KERNELS

    plain, fused = DecoderEngine(q4_model, native_blocks=False), DecoderEngine(q4_model)
    for engine in (plain, fused):  # the prompts' attention SDPA's: this one comparison moves with its rounding
        engine._attend_prompts(None)
    block = fused.model.stack.blocks[0]
    choices = [fused.plan.for_layer(f"stack.blocks.0.{n}.weight").choices for n in LINEARS]
    assert all(c["batch"] == INT8_TILE_KERNELS[Q4T.name] for c in choices)  # forced: the int8 tiles win
    assert block.routes == [(4, 0), (8, 0b1111), (None, 0)] and block.max_rows >= 8
    texts = ("What is the capital of France?", "Hello", "1 2 3 4", "The sky is", "Water boils at",
             "Once upon a time", "def f(x):", "Paris")
    error = eight_row_errors(plain, fused, [smollm2_tokenizer.encode(t) for t in texts], 4, 7, fused_steps)
    assert error[0] < 0.75 * error[1], error


@pytest.mark.skipif(not native.runs("avx512-vnni"), reason="q8 tiles need AVX-512 VNNI, which this CPU lacks")
def test_past_decodes_rows_the_q8_tiles_take_the_plans_int8_choice(fused_steps, native_forced, monkeypatch):
    """Q8_0 weights on q8 tiles, the plan's int8 tile kernel (q8t) ranked first: the routes give int8 to the
    batch phase only (the prompt phase keeps int16: PROMPT_ERROR), and an 8-sequence step through the
    operator lies closer to the torch blocks' step (their products int8 as well) than with int16 activations."""
    from anatomy.kernels import timing

    forced = timing._time
    monkeypatch.setattr(timing, "_time", lambda entries, repeats: {
        k: ((0.5e-6, 0.0) if k == "q8t" else t) for k, t in forced(entries, repeats).items()})
    model = random_model("Q8_0", max_seq_len=64)
    plain, fused = DecoderEngine(model, native_blocks=False), DecoderEngine(model)
    block = fused.model.stack.blocks[0]
    assert [fused.plan.for_layer(f"stack.blocks.0.{n}.weight").choices["batch"] for n in LINEARS] == ["q8t"] * 4
    assert block.routes == [(4, 0), (8, 0b1111), (None, 0)] and block.max_rows >= 8
    prompts = [[(7 * i + j) % 90 + 1 for j in range(3 + i)] for i in range(8)]
    error = eight_row_errors(plain, fused, prompts, 1, 5, fused_steps)
    assert error[0] < 0.5 * error[1], error
