"""`anatomy serve --api-key` on the default weights: every path but /health and /metrics needs the
key (as a Bearer token or Anthropic's x-api-key); the start-up report names the weights and their kernels; and the app's loading state (503) on
a server whose model never arrives."""

from __future__ import annotations

import asyncio
import re
import threading

import anthropic
import openai
import pytest

from anatomy.serving.app import ServerState, create_app

from .conftest import Server, free_port

MODEL = "smollm2-135m-instruct"
KEY = "s3cret-key"


@pytest.fixture(scope="module")
def server():
    s = Server("--api-key", KEY, "--kv-memory", "64MiB", "--embedding-model", "none", "--strict-fields")
    yield s
    s.close()


@pytest.mark.slow
def test_the_key_is_required(server):
    with pytest.raises(openai.AuthenticationError) as exc:
        server.client(api_key="wrong").models.list()
    assert exc.value.body["code"] == "invalid_api_key"
    status, body = server.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert status == 401 and set(body["error"]) == {"message", "type", "param", "code"}
    assert server.post("/tokenize", {"prompt": "x"})[0] == 401
    assert server.post("/tokenize", {"prompt": "x"}, headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    assert server.get("/health") == (200, '{"status":"ok"}') and server.get("/metrics")[0] == 200
    client = server.client(api_key=KEY)
    assert [m.id for m in client.models.list().data] == [MODEL], "--embedding-model none: no encoder listed"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert r.usage.completion_tokens == 2
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="all-minilm-l6-v2", input="x")


@pytest.mark.slow
def test_anthropics_x_api_key_is_taken_and_401_is_in_anthropics_shape(server):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    status, answer = server.post("/v1/messages", body)
    assert status == 401 and answer["type"] == "error" and answer["error"]["type"] == "authentication_error"
    assert server.post("/v1/messages", body, headers={"x-api-key": "wrong"})[0] == 401
    status, answer = server.post("/v1/messages", body, headers={"x-api-key": KEY})
    assert status == 200 and answer["usage"]["output_tokens"] <= 2
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(**body)
    r = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0).messages.create(**body)
    assert r.content[0].type == "text" and r.usage.output_tokens <= 2


@pytest.mark.slow
def test_strict_fields_refuse_unknown_fields_as_openai_does(server):
    """--strict-fields: an unknown field gets OpenAI's 400 (the default, as vLLM, ignores and logs it)."""
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    status, answer = server.post("/v1/chat/completions", {**body, "frobnicate": 1}, headers=headers)
    assert status == 400 and answer["error"]["param"] == "frobnicate"
    assert "unrecognized request argument supplied: frobnicate" in answer["error"]["message"]
    status, answer = server.post("/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "x",
                                                                                "mood": "happy"}]}, headers=headers)
    assert status == 400 and answer["error"]["param"] == "messages.0.mood"
    assert server.post("/v1/chat/completions", body, headers=headers)[0] == 200


@pytest.mark.slow
def test_the_start_up_report_names_the_weights_and_their_kernels(server):
    """The default load keeps the GGUF's own blocks (weights auto) and says which kernels run them per
    phase and how many bytes a decode step reads: the fast path is never taken silently (or missed)."""
    report = re.search(r"\(weights auto, f32, branches (f32|bf16)\) ready in .* s; kernels (decode: .*; batch: .*; "
                       r"prefill: .*); a decode step reads ([0-9,]+) MB of weights", server.output())
    assert report, server.output()
    assert int(report.group(3).replace(",", "")) < 538, "every matrix in f32 (134.5 M weights) would read 538 MB"


@pytest.mark.slow
def test_a_request_alone_gets_the_engines_answer_on_the_default_weights(server, smollm2_tokenizer):
    """The engine on the same default load (anatomy.load's weights="auto", its planned view) is the
    reference: a greedy request alone, shorter than a block (so no cached prefix changes how many
    rows its prefill runs), gets the engine's tokens from the server."""
    import anatomy

    prompt = smollm2_tokenizer.encode("The three longest rivers in the world are")
    assert len(prompt) < 16
    local = anatomy.generate(MODEL, prompt, tokenizer=smollm2_tokenizer, max_new_tokens=12)
    status, body = server.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 12,
                                                   "temperature": 0}, headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and body["choices"][0]["text"] == local.text


def test_a_loading_server_answers_503_and_health_says_so():
    import json
    import urllib.error
    import urllib.request

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ServerState(model_name=MODEL)), host="127.0.0.1", port=port,
                                           log_level="error"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        while not server.started:
            threading.Event().wait(0.02)

        def call(path: str, body: dict | None = None) -> tuple[int, dict]:
            data = json.dumps(body).encode() if body is not None else None
            try:
                with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read())

        assert call("/health") == (503, {"status": "loading"})
        status, body = call("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert status == 503 and body["error"]["code"] == "loading"
        assert call("/v1/models")[0] == 200
    finally:
        server.should_exit = True
        thread.join(10)
