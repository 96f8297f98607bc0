"""`anatomy serve --lora` through the openai client (tiny random LLaMA with SmolLM2's tokenizer, f32,
greedy): 3 adapters made by HF PEFT (random A and B) answer 16 concurrent requests spread over them
and the base, each as anatomy.generate answers with that adapter merged (and picked by llama-server's
per-request `lora` list); adapters are loaded and
unloaded while requests run; an unknown adapter is a 404 naming it; a bad adapter is one 400 at
/v1/load_lora_adapter, and stops the server at start-up under --lora."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import anatomy
from anatomy.lora import merge_lora

from ..conftest import tiny_chat_model
from .conftest import Server

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.slow

ADAPTERS = {
    "qv": dict(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    "mlp": dict(r=8, lora_alpha=16, target_modules=["o_proj", "gate_proj", "down_proj"]),
    "all": dict(r=2, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]),
    "late": dict(r=4, lora_alpha=16, target_modules=["k_proj", "up_proj"]),  # loaded at run time
    "wide": dict(r=32, lora_alpha=16, target_modules=["q_proj"]),  # over --max-lora-rank
}
PROMPTS = [[1, 504, 3012, 314, 253], [1, 9690, 28, 4403], [1, 378, 1345, 282, 260, 1834, 30], [1, 2683]]
TOKENS = 8


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(the base's HF directory, {name: PEFT adapter directory})."""
    root = tmp_path_factory.mktemp("served_lora")
    tiny_chat_model(root / "hf", root / "tiny.gguf", d_model=64)
    paths = {}
    for i, (name, options) in enumerate(ADAPTERS.items()):
        torch.manual_seed(20 + i)
        hf = transformers.AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32)
        peft.get_peft_model(hf, peft.LoraConfig(init_lora_weights=False, **options)).save_pretrained(root / name)
        paths[name] = root / name
    return root / "hf", paths


def _expected(base, paths, name, prompt) -> list[int]:
    """anatomy.generate's greedy tokens with the adapter merged (None: the base)."""
    model = anatomy.load(base, dtype="f32").eval()
    if name is not None:
        merge_lora(model, paths[name])
    return anatomy.generate(model, [prompt], max_new_tokens=TOKENS, temperature=0.0, ignore_eos=True)[0].token_ids


def _ask(server, model, prompt) -> str:
    answer = server.client(timeout=120).completions.create(model=model, prompt=prompt, max_tokens=TOKENS,
                                                           temperature=0, extra_body={"ignore_eos": True})
    assert answer.model == model and answer.usage.completion_tokens == TOKENS
    return answer.choices[0].text


def test_many_adapters_served_at_once_loaded_and_unloaded_at_run_time(made, tmp_path):
    base, paths = made
    tok = anatomy.load_tokenizer(str(base))
    server = Server("--model", str(base), "--weights", "f32", "--embedding-model", "none", "--kv-memory", "16MiB",
                    "--lora", *(f"{n}={paths[n]}" for n in ("qv", "mlp", "all")), "--max-loras", "4",
                    "--max-lora-rank", "8", "--allow-runtime-lora")
    try:
        names = [str(base), "qv", "mlp", "all"]
        jobs = [(names[i % 4], PROMPTS[i // 4]) for i in range(16)]
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda job: _ask(server, *job), jobs))
        assert len(set(answers)) >= 12, "the adapters change the answers"
        for (name, prompt), text in zip(jobs, answers):
            expected = _expected(base, paths, None if name == str(base) else name, prompt)
            assert text == tok.decode(expected, skip_special_tokens=True), name

        by_index = server.client(timeout=120).completions.create(  # llama-server's per-request list: qv is id 0
            model=str(base), prompt=PROMPTS[1], max_tokens=TOKENS, temperature=0,
            extra_body={"ignore_eos": True, "lora": [{"id": 0, "scale": 1.0}, {"id": 2, "scale": 0.0}]})
        assert by_index.choices[0].text == answers[5]  # jobs[5] is qv on PROMPTS[1]
        status, body = server.post("/v1/completions", {"model": "qv", "prompt": "hi", "lora": [{"id": 1}]})
        assert status == 400 and body["error"]["param"] == "lora"
        status, body = server.post("/v1/completions", {"model": str(base), "prompt": "hi", "lora": [{"id": 7}]})
        assert status == 400 and "lora id 7" in body["error"]["message"] and "0: 'qv'" in body["error"]["message"]

        _, listed = server.get("/v1/models")
        entries = {e["id"]: e for e in json.loads(listed)["data"]}
        assert {n: entries[n]["parent"] for n in ("qv", "mlp", "all")} == dict.fromkeys(("qv", "mlp", "all"), str(base))

        with ThreadPoolExecutor(4) as pool:  # requests run while adapters come and go
            running = [pool.submit(_ask, server, "qv", p) for p in PROMPTS]
            assert _post_text(server, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(paths["late"])}) \
                == (200, "Success: LoRA adapter 'late' added successfully.")
            assert _post_text(server, "/v1/unload_lora_adapter", {"lora_name": "mlp"}) \
                == (200, "Success: LoRA adapter 'mlp' removed successfully.")
            late = _ask(server, "late", PROMPTS[0])
            for future, prompt in zip(running, PROMPTS):
                assert future.result() == tok.decode(_expected(base, paths, "qv", prompt), skip_special_tokens=True)
        assert late == tok.decode(_expected(base, paths, "late", PROMPTS[0]), skip_special_tokens=True)

        status, body = server.post("/v1/completions", {"model": "mlp", "prompt": "hi", "max_tokens": 2})
        assert status == 404 and "'mlp'" in body["error"]["message"] and body["error"]["param"] == "model"
        status, body = server.post("/v1/unload_lora_adapter", {"lora_name": "nope"})
        assert status == 404 and "'nope'" in body["error"]["message"]
        assert server.post("/v1/load_lora_adapter", {"lora_name": "qv", "lora_path": str(paths["qv"])})[0] == 400
        for bad, message in _bad_adapters(paths, tmp_path).items():
            status, body = server.post("/v1/load_lora_adapter", {"lora_name": bad, "lora_path": str(tmp_path / bad)})
            assert status == 400 and message in body["error"]["message"], (bad, body)
        _, listed = server.get("/v1/models")
        assert {e["id"] for e in json.loads(listed)["data"]} == {str(base), "qv", "all", "late"}
    finally:
        server.close()


def _post_text(server, path: str, body: dict) -> tuple[int, str]:
    """(status, text) of a POST whose success is plain text (vLLM's adapter endpoints)."""
    import urllib.request

    request = urllib.request.Request(f"{server.url}{path}", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return r.status, r.read().decode()


def _bad_adapters(paths, root) -> dict[str, str]:
    """{directory name under root: what the error says} of one broken adapter per problem."""
    from safetensors.torch import load_file, save_file

    import shutil

    cases = {"wide": "more than the server's --max-lora-rank 8", "missing": "is missing",
             "truncated": "adapter_model.safetensors", "mismatch": "the model needs"}
    shutil.copytree(paths["wide"], root / "wide")
    for name in ("missing", "truncated", "mismatch"):
        shutil.copytree(paths["qv"], root / name)
    weights = root / "missing" / "adapter_model.safetensors"
    tensors = load_file(weights)
    del tensors[next(k for k in tensors if k.endswith("lora_B.weight"))]
    save_file(tensors, weights)
    weights = root / "truncated" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    weights = root / "mismatch" / "adapter_model.safetensors"
    save_file({k: torch.cat([v, v], dim=-1) if "lora_A" in k else v for k, v in load_file(weights).items()}, weights)
    return cases


def test_a_bad_adapter_stops_the_server_before_it_serves(made):
    base, paths = made
    with pytest.raises(RuntimeError) as failed:
        Server("--model", str(base), "--weights", "f32", "--embedding-model", "none", "--kv-memory", "16MiB",
               "--lora", f"qv={paths['qv']}", f"wide={paths['wide']}", "--max-lora-rank", "8", timeout=120)
    assert "exited with 2" in str(failed.value) and "rank r=32 is more than the server's --max-lora-rank 8" \
        in str(failed.value)
