"""The decode engine on tiny random models: batching with left padding gives each prompt's tokens
alone, sampling is reproducible with a seed, the cache is sized to prompt + new tokens; and the
bytes it holds of the shipped file, against the file's own tensor sizes."""

from __future__ import annotations

import pytest
import torch

from anatomy import build_model, get_preset
from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams

from ..conftest import llama_tiny

PROMPTS = [[5, 17, 33, 2, 9, 41, 8], [60, 3], [11, 12, 13, 14]]


def run(engine: DecoderEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    steps = torch.stack(list(engine.tokens(prompts, params)), dim=1)  # [B, max_new_tokens]
    return steps.tolist()


def test_greedy_batch_equals_each_prompt_alone(decoder_tiny):
    engine = DecoderEngine(decoder_tiny)
    params = SamplingParams(max_new_tokens=12)
    batched = run(engine, PROMPTS, params)
    alone = [run(engine, [p], params)[0] for p in PROMPTS]
    assert batched == alone


def test_greedy_tokens_are_the_argmax_of_a_full_forward():
    model = llama_tiny()
    out = run(DecoderEngine(model), [PROMPTS[0]], SamplingParams(max_new_tokens=6))[0]
    ids = list(PROMPTS[0])
    with torch.no_grad():
        for token in out:
            assert token == int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(token)


@pytest.mark.parametrize("fields", [
    dict(sliding_window=3, sliding_window_layers=(0,)),  # prompts longer than the window, one windowed layer
    dict(rope_scaling=dict(kind="dynamic", factor=2.0, original_max_seq_len=6)),  # angles grow with the length
    dict(n_experts=4, n_experts_per_token=2, qk_norm=True),
], ids=["sliding-window", "dynamic-ntk", "moe"])
def test_engine_decodes_the_new_parts_as_a_full_forward_does(fields):
    """Each decode step's context (window mask, RoPE angles of the pass length) equals what the model's
    own forward builds: greedy tokens are the argmax of a full forward over the prefix."""
    torch.manual_seed(0)
    model = build_model(get_preset("llama-7b", vocab_size=97, d_model=64, n_heads=4, max_seq_len=64, n_layers=2,
                                   n_kv_heads=2, d_ff=96, **fields)).eval()
    prompts = [[5, 9, 2, 7, 11, 3, 8], [4, 6]]
    out = run(DecoderEngine(model), prompts, SamplingParams(max_new_tokens=6))
    for prompt, tokens in zip(prompts, out):
        ids = list(prompt)
        with torch.no_grad():
            for token in tokens:
                assert token == int(model(torch.tensor([ids]))[0, -1].argmax())
                ids.append(token)


def test_seeded_sampling_reproduces_and_differs_by_seed():
    engine = DecoderEngine(llama_tiny())
    sample = lambda seed: run(engine, PROMPTS, SamplingParams(max_new_tokens=10, temperature=1.0, seed=seed))
    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def test_repetition_penalty_avoids_repeats():
    engine = DecoderEngine(llama_tiny())
    plain = run(engine, [PROMPTS[1]], SamplingParams(max_new_tokens=20))[0]
    penalised = run(engine, [PROMPTS[1]], SamplingParams(max_new_tokens=20, repetition_penalty=1e6))[0]
    assert len(set(plain)) < len(plain)  # the random model repeats itself greedily
    assert len(set(penalised)) == len(penalised) and not set(penalised) & set(PROMPTS[1])


@pytest.mark.slow
def test_compiled_step_gives_the_eager_tokens_and_compiles_once_per_shape():
    model = llama_tiny()
    eager, compiled = DecoderEngine(model), DecoderEngine(model, compile=True)
    params = SamplingParams(max_new_tokens=10)
    for prompts in (PROMPTS[:2], PROMPTS[:1], PROMPTS[:2]):
        assert run(compiled, prompts, params) == run(eager, prompts, params)
    assert len(compiled._caches) == 2  # (B=2, T=256) and (B=1, T=256), reused


def test_held_bytes_of_a_loaded_file_are_the_files_tensor_bytes(smollm2_gguf_path):
    """The Q4_1 file loaded as it is holds exactly its tensors' bytes (as the gguf package reads them:
    Q4_1's 20 and Q8_0's 34 bytes per 32 weights are anatomy's codes plus scales), plus RoPE's 32
    inverse frequencies; a model and its engine hold the storages they share once."""
    import gguf

    import anatomy
    from anatomy.inference.engine import engine_for, held_bytes

    model = anatomy.load(smollm2_gguf_path)
    tensors = gguf.GGUFReader(smollm2_gguf_path).tensors
    in_file = sum(int(t.n_bytes) for t in tensors)
    assert held_bytes(model) == in_file + 32 * 4
    assert held_bytes(model, model) == held_bytes(model)
    engine = engine_for(model)
    assert held_bytes(engine.model) == engine.weight_bytes
    # the engine's view reads the embedding (the tied head's weight) and the norms as they are, and
    # holds its own layouts of the blocks' products
    products = sum(int(t.n_bytes) for t in tensors if t.name.startswith("blk.") and "norm" not in t.name)
    shared = held_bytes(model) + engine.weight_bytes - held_bytes(model, engine.model)
    assert shared == in_file + 32 * 4 - products


def test_an_engine_that_takes_the_weights_holds_them_once(smollm2_gguf_path, forced_timings):
    """take_weights=True: each block product's format is given back once its layout is built, so the
    model and its engine hold no more than the engine alone (the tied token table is read from the
    head's layout where it can give rows, else kept for the embedding); the logits are those of an engine over a model that keeps its formats, and
    the emptied model refuses to compute again, naming why."""
    import anatomy
    from anatomy.inference.engine import engine_for, held_bytes
    from anatomy.kernels.layout_embedding import LayoutEmbedding

    kept, taken = anatomy.load(smollm2_gguf_path), anatomy.load(smollm2_gguf_path)
    reference = DecoderEngine(kept)
    engine = engine_for(taken, take_weights=True)
    assert engine_for(taken, take_weights=True) is engine
    assert held_bytes(taken, engine.model) == held_bytes(engine.model) == engine.weight_bytes
    products = held_bytes(kept, reference.model) - held_bytes(reference.model)
    assert products > 0.9 * sum(m.compact.nbytes for name, m in kept.named_modules()
                                if name.startswith("stack.blocks.") and hasattr(m, "compact"))
    # the tied table: read from the head's q8 tiles where the plan holds them (its format given back), else kept
    from_head = isinstance(engine.model.token_embedding, LayoutEmbedding)
    assert taken.stack.embed.tokens.compact.released == from_head
    assert from_head == ("q8t" in engine.model.lm_head.layouts)
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 47, 2]])
    assert torch.equal(engine.logits(ids), reference.logits(ids))
    with pytest.raises(InputError, match=r"blocks\.0\.attn\.qkv.*take_weights=True.*load the model again"):
        taken.stack.blocks[0].attn.qkv.compact.dequantize()
    with pytest.raises(InputError, match="given to an engine's layout"):
        engine_for(taken)  # another engine of the emptied model


def test_a_named_model_whose_weights_an_engine_took_is_loaded_again(smollm2_gguf_path):
    """The commands load a model by name and let its engine take the weights; asking for the name again
    (another engine's options, a second command in one process) loads it again instead of the emptied one."""
    from anatomy.inference.loading import load_named
    from anatomy.weights.modules import weights_held

    first = load_named(str(smollm2_gguf_path))
    first.engine(take_weights=True)
    assert not weights_held(first.model)
    again = load_named(str(smollm2_gguf_path))
    assert again.model is not first.model and weights_held(again.model)
    assert load_named(str(smollm2_gguf_path)) is again


@pytest.mark.parametrize("policy, warned", [("PASSIVE", True), ("passive", True), ("ACTIVE", False), (None, False)])
def test_an_engine_on_sleeping_openmp_threads_says_so(monkeypatch, recwarn, policy, warned):
    if policy is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", policy)
    DecoderEngine(llama_tiny(), plan_cache=False)
    messages = [str(w.message) for w in recwarn if "OMP_WAIT_POLICY" in str(w.message)]
    assert messages == (["OMP_WAIT_POLICY=PASSIVE: OpenMP's threads sleep between the ~150 parallel regions of a "
                         "decode step (measured ~3x slower decode); unset it or set it to ACTIVE"] if warned else [])
