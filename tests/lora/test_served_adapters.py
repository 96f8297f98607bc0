"""Many LoRA adapters served at once by the engine and the serving loop (lora/slots.py): rows with
different adapters in one step give each adapter's logits as HF PEFT computes them (fp32, 1e-4), in
prefill and in (captured) decode steps; the loop's greedy answers equal anatomy.generate's with the
adapter merged; the prefix cache never shares blocks across adapters; bad adapters are refused."""

from __future__ import annotations

import copy

import pytest
import torch

import anatomy
from anatomy.errors import InputError
from anatomy.inference.engine import Chunk, DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.lora import LoraConfig, apply_lora, merge_lora, save_adapter
from anatomy.serving.loop import ServingLoop

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
TOL = 1e-4
ADAPTERS = {  # name -> PEFT options (random A and B: init_lora_weights=False)
    "qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "mlp": dict(r=8, lora_alpha=4, target_modules=["o_proj", "gate_proj", "down_proj"], layers_to_transform=[1]),
    "all": dict(r=2, lora_alpha=6, use_rslora=True,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
}
PROMPTS = [[3, 17, 42, 5, 88, 61, 9, 30, 2, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [40, 41, 7, 7, 12],
           [9, 8, 7, 6, 5, 4, 3, 2, 1, 50, 51], [70, 71, 72]]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(the base's HF directory, {name: adapter directory}, {name: the PEFT model}) on a tiny LLaMA (GQA)."""
    root = tmp_path_factory.mktemp("served")
    torch.manual_seed(0)
    anatomy.save(anatomy.build_model(anatomy.get_preset("llama-7b", vocab_size=96, d_model=64, n_layers=2, n_heads=4,
                                                        n_kv_heads=2, d_ff=128, max_seq_len=64)), root / "base")
    paths, references = {}, {}
    for i, (name, options) in enumerate(ADAPTERS.items()):
        torch.manual_seed(10 + i)
        hf = transformers.AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32)
        references[name] = peft.get_peft_model(hf, peft.LoraConfig(init_lora_weights=False, **options)).eval()
        references[name].save_pretrained(root / name)
        paths[name] = root / name
    return root / "base", paths, references


def _engine(base, paths, **options):
    engine = DecoderEngine(anatomy.load(base, dtype="f32").eval(), **options)
    slots = engine.serve_adapters(max_loras=3, max_rank=8)
    refs = {name: slots.load(name, path) for name, path in paths.items()}
    return engine, refs


def _expected(references, name, prompt):
    """The next-token logits of `prompt` with adapter `name` (None: the base), by HF PEFT."""
    model = references[name or "qv"]
    with torch.no_grad():
        if name is None:
            with model.disable_adapter():
                return model(torch.tensor([prompt])).logits[0, -1]
        return model(torch.tensor([prompt])).logits[0, -1]


@pytest.mark.parametrize("capture", [True, False])
def test_rows_with_different_adapters_in_one_step_give_each_adapters_logits(made, capture):
    base, paths, references = made
    engine, refs = _engine(base, paths, capture=capture)
    cache = engine.paged_cache(num_blocks=32, block_size=8)
    engine.capture_decode(cache, [1, 4])  # a captured decode step must not serve rows with adapters
    names = ["qv", None, "mlp", "all"]
    tables = [[4 * i + j for j in range(4)] for i in range(4)]
    chunks = [Chunk(p, 0, t, adapter=refs[n].slot if n else 0) for p, t, n in zip(PROMPTS, tables, names)]
    logits = engine.step(cache, chunks)  # prefill, four rows, three adapters and the base
    for row, (prompt, name) in enumerate(zip(PROMPTS, names)):
        assert (logits[row] - _expected(references, name, prompt)).abs().max() < TOL, name
    nxt = [int(r.argmax()) for r in logits]
    decode = [Chunk([t], len(p), tb, adapter=c.adapter) for t, p, tb, c in zip(nxt, PROMPTS, tables, chunks)]
    logits = engine.step(cache, decode)  # one decode step of the same rows
    for row, (prompt, name) in enumerate(zip(PROMPTS, names)):
        assert (logits[row] - _expected(references, name, prompt + [nxt[row]])).abs().max() < TOL, name
    base_only = engine.step(cache, [Chunk([nxt[1]], len(PROMPTS[1]), tables[1])])  # the base alone: captured
    assert (base_only[0] - logits[1]).abs().max() < TOL
    assert (engine.captured_graphs > 0) == capture


def test_the_loop_answers_each_request_as_its_adapter_merged_does(made):
    base, paths, _ = made
    engine, refs = _engine(base, paths)
    loop = ServingLoop(engine, kv_bytes=2 ** 20, block_size=8, max_seqs=8)
    loop.capture_decode()
    params = SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)
    jobs = [(p, n) for n in (None, "qv", "mlp", "all") for p in PROMPTS[:2]]
    events = [[] for _ in jobs]
    for (prompt, name), sink in zip(jobs, events):
        loop.submit(prompt, params, sink.append, adapter=refs[name] if name else None)
    while loop.step():
        pass
    for (prompt, name), got in zip(jobs, events):
        model = anatomy.load(base, dtype="f32").eval()
        if name is not None:
            merge_lora(model, paths[name])
        expected = anatomy.generate(model, [prompt], max_new_tokens=6, temperature=0.0, ignore_eos=True)
        assert [e.token for e in got] == expected[0].token_ids, name


def test_the_prefix_cache_keeps_each_adapters_blocks_apart(made):
    base, paths, references = made
    engine, refs = _engine(base, paths)
    loop = ServingLoop(engine, kv_bytes=2 ** 20, block_size=4, max_seqs=4)
    params = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
    prompt = PROMPTS[0]

    def answer(name):
        got = []
        loop.submit(prompt, params, got.append, adapter=refs[name] if name else None)
        while loop.step():
            pass
        return got[0].token

    hits = []
    for name in ("qv", None, "all", "qv"):
        assert answer(name) == int(_expected(references, name, prompt).argmax()), name
        hits.append(loop.blocks.hit_tokens)
    assert hits[:3] == [0, 0, 0], "no block computed under one adapter is reused under another or the base"
    assert hits[3] == 16, "the same adapter's blocks are reused"


def test_bad_adapters_are_refused_with_one_error_each(made, tmp_path):
    base, paths, _ = made
    engine = DecoderEngine(anatomy.load(base, dtype="f32").eval())
    slots = engine.serve_adapters(max_loras=2, max_rank=4)
    with pytest.raises(InputError, match=r"rank r=8 is more than the server's --max-lora-rank 4"):
        slots.load("mlp", paths["mlp"])
    other = anatomy.build_model(anatomy.get_preset("llama-7b", vocab_size=96, d_model=32, n_layers=2, n_heads=4,
                                                   n_kv_heads=2, d_ff=128, max_seq_len=64))
    save_adapter(apply_lora(other, LoraConfig(rank=2)), tmp_path / "other")
    with pytest.raises(InputError, match=r"other.*has shape .* the model needs"):
        slots.load("other", tmp_path / "other")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (broken / name).write_bytes((paths["qv"] / name).read_bytes())
    data = (broken / "adapter_model.safetensors").read_bytes()
    (broken / "adapter_model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(InputError, match="broken"):
        slots.load("broken", broken)
    with pytest.raises(InputError, match="not a directory"):
        slots.load("missing", tmp_path / "nowhere")
    assert slots.loaded() == []
    slots.load("qv", paths["qv"])
    with pytest.raises(InputError, match="already loaded"):
        slots.load("qv", paths["qv"])
    slots.load("all", paths["all"])
    with pytest.raises(InputError, match="--max-loras"):
        slots.load("third", paths["qv"])


def test_an_unloaded_adapters_slot_is_reused_once_its_sequences_finish(made):
    base, paths, references = made
    engine = DecoderEngine(anatomy.load(base, dtype="f32").eval())
    slots = engine.serve_adapters(max_loras=1, max_rank=8)
    loop = ServingLoop(engine, kv_bytes=2 ** 20, block_size=8, max_seqs=4)
    qv = slots.load("qv", paths["qv"])
    got = []
    params = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    loop.submit(PROMPTS[1], params, got.append, adapter=qv)
    loop.step()  # the prompt runs: one token
    assert slots.unload("qv") and slots.get("qv") is None
    with pytest.raises(InputError, match="--max-loras"):
        slots.load("all", paths["all"])  # the running sequence still holds the only slot
    while loop.step():
        pass
    model = merge_lora(anatomy.load(base, dtype="f32").eval(), paths["qv"])
    expected = anatomy.generate(model, [PROMPTS[1]], max_new_tokens=4, temperature=0.0, ignore_eos=True)
    assert [e.token for e in got] == expected[0].token_ids
    assert slots.load("all", paths["all"]).slot == qv.slot


def test_adapters_on_int4_base_weights_add_to_the_plans_product(made):
    """The base product is the kernel plan's over int4 weights (bf16 branches): each row is within the
    plan's rounding of the model with the adapter's LoRA layers on the same int4 weights."""
    base, paths, _ = made
    engine = DecoderEngine(anatomy.load(base, weights="int4").eval(), native_blocks=False)
    slots = engine.serve_adapters(max_loras=2, max_rank=8)
    refs = {name: slots.load(name, paths[name]) for name in ("qv", "mlp")}
    cache = engine.paged_cache(num_blocks=16, block_size=8)
    names = ["qv", None, "mlp"]
    chunks = [Chunk(p, 0, [2 * i, 2 * i + 1, 2 * i + 10], adapter=refs[n].slot if n else 0)
              for i, (p, n) in enumerate(zip(PROMPTS[1:], names))]
    logits = engine.step(cache, chunks)
    plain = anatomy.load(base, weights="int4").eval()
    with torch.no_grad():
        for row, (prompt, name) in enumerate(zip(PROMPTS[1:], names)):
            model = apply_lora(anatomy.load(base, weights="int4").eval(), paths[name]) if name else plain
            expected = model(torch.tensor([prompt]))[0, -1]
            assert (logits[row] - expected).abs().max() < 1e-2, name
            if name:
                assert (logits[row] - plain(torch.tensor([prompt]))[0, -1]).abs().max() > 0.1


def test_a_steps_adapters_are_its_own_threads(made):
    """Another thread's pass on the same engine during a step with adapters (an embedding) runs the base."""
    import threading

    base, paths, references = made
    engine, refs = _engine(base, paths)
    seen = []
    with engine.lora.rows([refs["qv"].slot]):
        thread = threading.Thread(target=lambda: seen.append(engine.logits(torch.tensor([PROMPTS[1]]))[0, -1]))
        thread.start()
        thread.join()
    assert (seen[0] - _expected(references, None, PROMPTS[1])).abs().max() < TOL


def test_a_rows_scale_multiplies_its_adapters_update(made):
    """llama-server's per-request scale: a row at scale s == the adapter with alpha times s, in a step
    beside the same adapter at scale 1; its prefix-cache blocks are its own."""
    import json
    import shutil

    base, paths, references = made
    engine, refs = _engine(base, paths)
    cache = engine.paged_cache(num_blocks=16, block_size=8)
    chunks = [Chunk(PROMPTS[2], 0, [0, 1], adapter=refs["qv"].slot, adapter_scale=0.5),
              Chunk(PROMPTS[2], 0, [2, 3], adapter=refs["qv"].slot)]
    logits = engine.step(cache, chunks)
    assert (logits[1] - _expected(references, "qv", PROMPTS[2])).abs().max() < TOL
    half = paths["qv"].parent / "qv_half"
    shutil.copytree(paths["qv"], half, dirs_exist_ok=True)
    config = json.loads((half / "adapter_config.json").read_text())
    (half / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": config["lora_alpha"] / 2}))
    with torch.no_grad():
        expected = apply_lora(anatomy.load(base, dtype="f32").eval(), half)(torch.tensor([PROMPTS[2]]))[0, -1]
    assert (logits[0] - expected).abs().max() < TOL and (logits[0] - logits[1]).abs().max() > 0.01
    loop = ServingLoop(engine, kv_bytes=2 ** 20, block_size=4, max_seqs=4)
    params = SamplingParams(max_new_tokens=1, temperature=0.0, ignore_eos=True)
    for scale in (1.0, 0.5):
        loop.submit(PROMPTS[0], params, lambda e: None, adapter=refs["qv"], adapter_scale=scale)
        while loop.step():
            pass
    assert loop.blocks.hit_tokens == 0, "a scale's blocks are its own"


def test_speculative_rows_verify_with_their_adapter(made):
    """Prompt-lookup proposals of a sequence with an adapter are verified with it: the answer is the merged one."""
    base, paths, _ = made
    engine, refs = _engine(base, paths)
    loop = ServingLoop(engine, kv_bytes=2 ** 20, block_size=8, max_seqs=4)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    got = []
    loop.submit(prompt, params, got.append, adapter=refs["all"], speculative_tokens=3)
    while loop.step():
        pass
    model = merge_lora(anatomy.load(base, dtype="f32").eval(), paths["all"])
    expected = anatomy.generate(model, [prompt], max_new_tokens=12, temperature=0.0, ignore_eos=True)
    assert [e.token for e in got] == expected[0].token_ids
    assert loop.metrics.draft_tokens > 0
