"""`anatomy serve` with the default model, in a subprocess on a free port, through the official
`openai` client: every endpoint and parameter, streaming, concurrency, the prefix cache,
cancellation, and bad input (after which the server still serves).

The server runs the model's weights in f32 (--weights f32), where greedy and seeded output is the
same whatever the batch or the prefix cache (the identity tests below, and the comparison with
the fp32 engine); the default weights (the GGUF's own Q4_1 blocks, whose kernels depend on a step's
number of rows) are served in test_server_key.py."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest

from .conftest import Server

MODEL = "smollm2-135m-instruct"
EMBEDDER = "all-minilm-l6-v2"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    s = Server("--weights", "f32", "--kv-memory", "256MiB", "--max-body-bytes", "200000")
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def context(server) -> int:
    """The tokens one sequence can hold: 256 MiB of KV blocks at the bytes per token the server
    reports (its KV dtype), in whole blocks of 16, at most the model's 8192."""
    bytes_per_token = int(re.search(r"\(([0-9,]+) B per token\)", server.output()).group(1).replace(",", ""))
    return min(8192, 2 ** 28 // (16 * bytes_per_token) * 16)


def chat(client, messages=FRANCE, **options):
    return client.chat.completions.create(model=MODEL, messages=messages, **options)


def streamed(client, endpoint: str = "chat", **options) -> tuple[list, str]:
    """(every chunk, the joined text) of a streamed request."""
    create = client.chat.completions.create if endpoint == "chat" else client.completions.create
    chunks = list(create(model=MODEL, stream=True, **options))
    text = "".join((c.choices[0].delta.content or "") if endpoint == "chat" else c.choices[0].text
                   for c in chunks if c.choices)
    return chunks, text


# -- endpoints -----------------------------------------------------------------------------------

def test_health_and_models(server, client, context):
    assert server.get("/health") == (200, '{"status":"ok"}')
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {MODEL, EMBEDDER}
    assert models[MODEL].model_extra["max_model_len"] == context


def test_chat_answers_with_usage(server, client):
    r = chat(client, temperature=0)
    assert r.choices[0].message.content == "The capital of France is Paris."
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    status, tokenized = server.post("/tokenize", {"model": MODEL, "messages": FRANCE})
    assert status == 200 and r.usage.prompt_tokens == tokenized["count"]
    with_logprobs = chat(client, temperature=0, logprobs=True)
    assert r.usage.completion_tokens == len(with_logprobs.choices[0].logprobs.content) + 1, "its tokens and the EOS"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL


def test_streaming_equals_non_streaming(client):
    options = dict(messages=[{"role": "user", "content": "Write two sentences about rivers."}], temperature=0,
                   max_tokens=40)
    whole = chat(client, **options)
    chunks, text = streamed(client, stream_options={"include_usage": True}, **options)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant", "the first delta carries the role"
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in chunks[:-1] if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage, "include_usage: a last chunk with usage"
    assert all(c.usage is None for c in chunks[:-1])
    chunks, _ = streamed(client, **options)
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks), "no usage chunk unasked"


def test_completions_stream_and_prompt_forms(server, client):
    prompt = "The three primary colors are"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    _, text = streamed(client, "completions", prompt=prompt, max_tokens=12, temperature=0)
    assert text == whole.choices[0].text
    ids = server.post("/tokenize", {"prompt": prompt})[1]["tokens"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, temperature=0)
    assert by_ids.choices[0].text == whole.choices[0].text and by_ids.usage.prompt_tokens == len(ids)
    batch = client.completions.create(model=MODEL, prompt=[prompt, "One, two,"], max_tokens=6, temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text == whole.choices[0].text[:len(batch.choices[0].text)]
    assert batch.usage.prompt_tokens == len(ids) + len(server.post("/tokenize", {"prompt": "One, two,"})[1]["tokens"])


def test_max_tokens_and_max_completion_tokens(client):
    for options in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        r = chat(client, temperature=0, **options)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
        assert r.choices[0].message.content == "The capital of"


def test_stop_strings(client):
    r = chat(client, temperature=0, stop=[" Paris", "zzz"])
    assert r.choices[0].message.content == "The capital of France is" and r.choices[0].finish_reason == "stop"
    _, text = streamed(client, messages=FRANCE, temperature=0, stop=" Paris")
    assert text == "The capital of France is"


def test_seed_reproduces_and_n_gives_choices(client):
    options = dict(messages=[{"role": "user", "content": "Tell me a story."}], temperature=1.0, max_tokens=16)
    a = chat(client, seed=42, **options)
    b = chat(client, seed=42, **options)
    c = chat(client, seed=43, **options)
    assert a.choices[0].message.content == b.choices[0].message.content != c.choices[0].message.content
    several = chat(client, seed=42, n=3, **options)
    assert [ch.index for ch in several.choices] == [0, 1, 2]
    assert several.choices[0].message.content == a.choices[0].message.content, "choice i uses seed + i"
    assert len({ch.message.content for ch in several.choices}) == 3
    assert several.usage.completion_tokens == 48 and several.usage.prompt_tokens == a.usage.prompt_tokens
    chunks, _ = streamed(client, seed=42, n=2, **options)
    assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}


def test_filters_that_leave_one_token_are_greedy(client):
    greedy = chat(client, temperature=0, max_tokens=8).choices[0].message.content
    for options in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-6}):
        r = chat(client, temperature=1.5, seed=1, max_tokens=8, extra_body=options)
        assert r.choices[0].message.content == greedy, options


def test_penalties_match_the_engine(client, smollm2, smollm2_tokenizer):
    import anatomy

    messages = [{"role": "user", "content": "Repeat the word cat ten times."}]
    options = dict(presence_penalty=0.8, frequency_penalty=0.6, repetition_penalty=1.2)
    r = chat(client, messages=messages, temperature=0, max_tokens=24, presence_penalty=0.8, frequency_penalty=0.6,
             extra_body={"repetition_penalty": 1.2})
    local = anatomy.generate(smollm2, messages, tokenizer=smollm2_tokenizer, max_new_tokens=24, **options)
    assert r.choices[0].message.content == local.text
    plain = chat(client, messages=messages, temperature=0, max_tokens=24).choices[0].message.content
    assert plain != local.text, "the penalties changed the answer"


def test_chat_logprobs(client):
    r = chat(client, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 6 and "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token, "greedy: the chosen is the top"
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob) and t.logprob <= 0
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
        assert t.bytes == list(t.token.encode())
    assert chat(client, temperature=0, max_tokens=2).choices[0].logprobs is None
    chunks, _ = streamed(client, messages=FRANCE, temperature=0, max_tokens=6, logprobs=True, top_logprobs=2)
    streamed_tokens = [t.token for c in chunks if c.choices and c.choices[0].logprobs
                       for t in c.choices[0].logprobs.content]
    assert streamed_tokens == [t.token for t in content]


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert all(len(top) == 2 and max(top.values()) == pytest.approx(v) for top, v in zip(lp.top_logprobs,
                                                                                        lp.token_logprobs))


def test_embeddings_equal_anatomy_embed(client):
    import anatomy

    texts = ["I like cats", "Cats are nice"]
    expected = anatomy.embed(EMBEDDER, texts).numpy()
    as_floats = client.embeddings.create(model=EMBEDDER, input=texts, encoding_format="float")
    assert np.allclose([d.embedding for d in as_floats.data], expected, atol=1e-6)
    by_default = client.embeddings.create(model=EMBEDDER, input=texts)  # the client asks for base64
    assert np.allclose([d.embedding for d in by_default.data], expected, atol=1e-6)
    assert as_floats.usage.prompt_tokens == 2 * 5 and [d.index for d in as_floats.data] == [0, 1]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=MODEL, input="x")


def test_tokenize_detokenize(server, context):
    status, body = server.post("/tokenize", {"prompt": "Hello world"})
    assert status == 200 and body["count"] == len(body["tokens"]) and body["max_model_len"] == context
    assert server.post("/detokenize", {"tokens": body["tokens"]}) == (200, {"prompt": "Hello world"})
    assert server.post("/detokenize", {"tokens": [10 ** 9]})[0] == 400


# -- the scheduler seen from outside ---------------------------------------------------------------

QUESTIONS = ["What is the capital of France?", "Name three rivers.", "What is 7 times 8?", "Say hello.",
             "What color is the sky?", "Who wrote Hamlet?", "Define gravity.", "What is Python?",
             "Count to five.", "What is a cat?", "Why is the sea salty?", "What is the moon?",
             "Give me a fruit.", "What is rain?", "Name a planet.", "What is music?"]


def test_sixteen_concurrent_streams_each_equal_their_solo_output(client):
    def ask(question: str, stream: bool) -> tuple[str, str]:
        messages = [{"role": "user", "content": question}]
        if stream:
            chunks, text = streamed(client, messages=messages, temperature=0, max_tokens=16)
            return chunks[0].id, text
        r = chat(client, messages=messages, temperature=0, max_tokens=16)
        return r.id, r.choices[0].message.content

    solo = [ask(q, False)[1] for q in QUESTIONS]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda q: ask(q, True), QUESTIONS))
    assert [text for _, text in together] == solo
    assert len({rid for rid, _ in together}) == 16, "one answer per request, none answered twice"


def test_no_request_is_lost_under_load(client):
    prompts = [f"Number {i}: the next number is" for i in range(40)]
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda p: client.completions.create(model=MODEL, prompt=p, max_tokens=4,
                                                                     temperature=0), prompts))
    assert len({a.id for a in answers}) == 40 and all(a.usage.completion_tokens == 4 for a in answers)
    again = [client.completions.create(model=MODEL, prompt=p, max_tokens=4, temperature=0) for p in prompts[:5]]
    assert [a.choices[0].text for a in answers[:5]] == [a.choices[0].text for a in again]


def test_prefix_cache_hits_are_counted(server, client):
    system = {"role": "system", "content": "You are a helpful assistant who answers briefly. " * 12}
    before = server.metric("anatomy_prefix_cache_hits_total")
    first = chat(client, messages=[system, {"role": "user", "content": "What is tea?"}], temperature=0, max_tokens=8)
    second = chat(client, messages=[system, {"role": "user", "content": "What is coffee?"}], temperature=0,
                  max_tokens=8)
    gained = server.metric("anatomy_prefix_cache_hits_total") - before
    assert gained >= 16 * ((first.usage.prompt_tokens - 8) // 16), "the shared system prompt's full blocks hit"
    assert second.usage.prompt_tokens > 0 and 0 < server.metric("anatomy_prefix_cache_hit_rate") <= 1


def test_metrics_in_prometheus_format(server, client):
    generated = server.metric("anatomy_generation_tokens_total")
    chat(client, temperature=0, max_tokens=3)
    assert server.metric("anatomy_generation_tokens_total") == generated + 3
    status, text = server.get("/metrics")
    assert status == 200
    for name in ("anatomy_requests_running", "anatomy_requests_waiting", "anatomy_kv_blocks_used",
                 "anatomy_kv_blocks_free", "anatomy_prefix_cache_hit_rate", "anatomy_prompt_tokens_per_second",
                 "anatomy_generation_tokens_per_second", "anatomy_time_to_first_token_seconds_bucket",
                 "anatomy_inter_token_latency_seconds_bucket", "anatomy_e2e_request_latency_seconds_count"):
        assert f"\n{name}{{" in text, name
    assert "# TYPE anatomy_time_to_first_token_seconds histogram" in text
    assert server.metric("anatomy_kv_blocks_used") == 0 and server.metric("anatomy_requests_running") == 0
    assert server.metric("anatomy_time_to_first_token_seconds_bucket", le="+Inf") == \
        server.metric("anatomy_time_to_first_token_seconds_count")


def test_a_client_that_goes_away_frees_its_slot(server, client):
    long = dict(messages=[{"role": "user", "content": "Write a very long story."}], max_tokens=4000,
                temperature=0, extra_body={"ignore_eos": True})
    aborted = server.metric("anatomy_requests_finished_total", reason="abort")
    stream = client.chat.completions.create(model=MODEL, stream=True, **long)
    next(iter(stream))  # the first chunk, then the client hangs up
    stream.close()
    server.wait_idle(10.0)
    impatient = server.client(timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model=MODEL, **long)  # non-streaming: times out, disconnects
    server.wait_idle(10.0)
    assert server.metric("anatomy_requests_finished_total", reason="abort") == aborted + 2
    assert server.metric("anatomy_kv_blocks_used") == 0
    start = time.monotonic()
    assert chat(client, temperature=0, max_tokens=4).choices[0].message.content == "The capital of France"
    assert time.monotonic() - start < 10, "a new request completes promptly"


# -- bad input -------------------------------------------------------------------------------------

GOOD = {"model": MODEL, "messages": FRANCE, "max_tokens": 2}


@pytest.mark.parametrize("body, param, words", [
    (b'{"model": "x", "messages": [', None, "not valid JSON"),
    (b"[1, 2]", None, "JSON object"),
    ({**GOOD, "max_tokens": "5"}, "max_tokens", "valid integer"),
    ({**GOOD, "temperature": "hot"}, "temperature", "valid number"),
    ({**GOOD, "stream": "yes"}, "stream", "valid boolean"),
    ({**GOOD, "max_tokens": -1}, "max_tokens", "greater than or equal to 1"),
    ({**GOOD, "max_tokens": 10 ** 12}, "max_tokens", "maximum context length is"),
    ({**GOOD, "n": 0}, "n", "greater than or equal to 1"),
    ({**GOOD, "n": 17}, "n", "less than or equal to 16"),
    ({**GOOD, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
    ({**GOOD, "top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({**GOOD, "messages": []}, "messages", "at least one message"),
    ({**GOOD, "messages": [{"role": "user"}] * 0 + [{"role": "wizard", "content": "x"}]}, "messages.0.role", "'user'"),
    ({**GOOD, "temperature": 3}, "temperature", "less than or equal to 2"),
    ({**GOOD, "top_p": 0}, "top_p", "greater than 0"),
    ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({**GOOD, "tools": [{"type": "function"}]}, "tools.0.function", "required"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools.0.function.name",
     "letters, digits"),
    ({"messages": FRANCE}, "model", "required"),
    ({**GOOD, "priority": 1}, "priority", "--scheduling-policy priority"),  # as vLLM refuses it under fcfs
])
def test_bad_chat_requests_get_400_and_the_server_still_serves(server, body, param, words):
    status, answer = server.post("/v1/chat/completions", body)
    assert status == 400, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"], error
    assert server.post("/v1/chat/completions", GOOD)[0] == 200


def test_prompt_plus_max_tokens_over_the_context_says_both_numbers(server, context):
    prompt = context - 100
    status, answer = server.post("/v1/completions", {"model": MODEL, "prompt": [100] * prompt, "max_tokens": 900})
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    message = answer["error"]["message"]
    assert f"maximum context length is {context} tokens; you requested {prompt + 900} tokens ({prompt} in the " \
           f"prompt, 900 in the completion)" in message
    status, answer = server.post("/v1/chat/completions", {**GOOD, "max_tokens": context - 20})
    assert status == 400 and f"{context - 20} in the completion" in answer["error"]["message"]


def test_unknown_model_path_and_method(server, client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-17", messages=FRANCE)
    assert exc.value.body["code"] == "model_not_found" and "gpt-17" in exc.value.body["message"]
    assert server.post("/v1/nothing", GOOD)[0] == 404
    assert server.get("/v1/chat/completions")[0] == 405


def test_body_over_the_limit_gets_413(server):
    status, answer = server.post("/v1/completions", {"model": MODEL, "prompt": "x" * 300_000})
    assert status == 413 and "limit is 200,000" in answer["error"]["message"]
    assert server.post("/v1/chat/completions", GOOD)[0] == 200


def test_bad_input_through_the_client(client):
    with pytest.raises(openai.BadRequestError) as exc:
        chat(client, max_tokens=-3)
    assert exc.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[10 ** 8], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=EMBEDDER, input="")


def test_bench_serve_measures_the_server(server):
    from anatomy.loadgen import make_prompts, run_benchmark

    generated = server.metric("anatomy_generation_tokens_total")
    start = time.perf_counter()
    result = run_benchmark(server.url, model=MODEL, prompts=make_prompts(6, 12), max_tokens=8, concurrency=3,
                           extra={"ignore_eos": True})
    wall = time.perf_counter() - start  # this test's own clock around the run
    assert result.failed == 0 and result.output_tokens == 48 and result.input_tokens >= 6 * 12
    assert server.metric("anatomy_generation_tokens_total") == generated + 48  # the server counted them too
    assert 0 < result.ttft_ms["median"] < result.e2el_ms["median"] and result.tpot_ms["median"] > 0
    assert result.e2el_ms["p99"] <= 1e3 * result.duration_s <= 1e3 * wall  # the run spans its slowest request
    assert result.output_throughput >= 48 / wall
    poisson = run_benchmark(server.url, model=MODEL, prompts=make_prompts(3, 5, seed=1), max_tokens=4,
                            concurrency=2, rate=20.0, chat=True, extra={"ignore_eos": True})
    assert poisson.failed == 0 and poisson.output_tokens == 12 and "Poisson" in poisson.report()


GROUNDED = ("Repeat this list exactly, one item per line: alpha, bravo, charlie, delta, echo, foxtrot, golf, "
            "hotel, india, juliet.")


def test_speculative_requests_give_plain_greedy_answers(client):
    """llama-server's per-request `speculative.n_max`: prompt-lookup drafts verified in the step; the
    greedy answer (fp32 weights) is the plain one, streamed or not, and n_max 0 turns it off."""
    messages = [{"role": "user", "content": GROUNDED}]
    plain = chat(client, messages, max_tokens=48, temperature=0).choices[0].message.content
    fast = chat(client, messages, max_tokens=48, temperature=0, extra_body={"speculative.n_max": 5})
    assert fast.choices[0].message.content == plain
    _, text = streamed(client, messages=messages, max_tokens=48, temperature=0, extra_body={"speculative.n_max": 4})
    assert text == plain
    off = chat(client, messages, max_tokens=48, temperature=0, extra_body={"speculative.n_max": 0})
    assert off.choices[0].message.content == plain


def test_a_bad_speculative_field_is_a_400(server):
    status, body = server.post("/v1/chat/completions", {"model": MODEL, "messages": FRANCE, "speculative.n_max": -1})
    assert status == 400 and "speculative.n_max" in body["error"]["message"]
