"""Reasoning in `anatomy serve`: the <think> block read out of the text (tags split anywhere across
pieces, no thinking, a block the prompt opened), the thinking budget in the serving loop (SmolLM2's
tokenizer, a tiny random model of its vocabulary, a grammar that makes it think: the budget holds,
the close is forced and fed to the model, the answer follows), the chat, Responses and Messages
renders, and the real server through the openai client (whole == streamed, the budget)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.serving.grammar import GrammarSpec
from anatomy.serving.loop import ServingLoop
from anatomy.serving.protocol import ChatRequest
from anatomy.serving.reasoning import ThinkSplitter, prompt_opens, read, split
from anatomy.serving.responses import ChatRender
from anatomy.serving.sequence import Event
from anatomy.inference.speculative.rounds import ServedSpeculation
from anatomy.serving.thinking import Thinking, ThinkingState, thinking_for

from .conftest import Server, run_all

CHAT = {"model": "m", "messages": [{"role": "user", "content": "2 + 2?"}]}
TEXTS = ["<think>Let me see: 2 < 3.</think>The answer is 3.", "\n <think>a</th</think>b</think>",
         "No thinking <think>here</think>", "<thin", "", "  ", "<think>cut short </thi"]


def streamed(text: str, cuts: list[int], *, opened: bool) -> tuple[str, str]:
    splitter = ThinkSplitter(opened=opened)
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    out = [read(splitter, piece, last=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    return "".join(r for r, _ in out), "".join(c for _, c in out)


# -- the text ------------------------------------------------------------------------------------

def test_whole_outputs_split_as_vllm_reads_them():
    assert split("<think>Let me see.</think>\n\nIt is 3.", opened=False) == ("Let me see.", "\n\nIt is 3.")
    assert split("\n<think>a</think>b", opened=False) == ("a", "b"), "whitespace before the tag is dropped"
    assert split("It is 3.", opened=False) == (None, "It is 3."), "an answer that does not think"
    assert split("Say <think>x</think>", opened=False) == (None, "Say <think>x</think>"), "only at the start"
    assert split("<thin", opened=False) == (None, "<thin")
    assert split("still thinking", opened=False) == (None, "still thinking")
    assert split("I see.</think>It is 3.", opened=True) == ("I see.", "It is 3."), "the prompt opened it"
    assert split("cut short </thi", opened=True) == ("cut short </thi", ""), "unclosed: all reasoning"
    assert split("", opened=True) == ("", "")


@pytest.mark.parametrize("opened", [False, True])
def test_every_way_of_cutting_the_text_streams_what_the_whole_gives(opened):
    for text in TEXTS:
        whole = split(text, opened=opened)
        whole = (whole[0] or "", whole[1])
        for a in range(len(text) + 1):
            for b in range(a, len(text) + 1):
                assert streamed(text, [a, b], opened=opened) == whole, (text, a, b)


def test_a_partial_closing_tag_is_held_back_until_decided():
    splitter = ThinkSplitter(opened=True)
    assert splitter.push("abc</th") == ("abc", "")
    assert splitter.push("e") == ("</the", "")
    assert splitter.push("</") == ("", "")
    assert splitter.push("think>ok") == ("", "ok") and not splitter.thinking


def test_the_opening_tag_is_read_only_once_the_start_shows_it():
    splitter = ThinkSplitter(opened=False)
    assert splitter.push(" \n<") == ("", "") and splitter.state == "start"
    assert splitter.push("think") == ("", "") and splitter.state == "start"
    assert splitter.push(">hm") == ("hm", "") and splitter.thinking and splitter.thought


@pytest.mark.parametrize("name, enable_thinking, opened", [
    ("Qwen-Qwen3-0.6B.jinja", None, False), ("Qwen-Qwen3-0.6B.jinja", False, False),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", True, True),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", False, False)])
def test_real_templates_open_the_block_or_not(name, enable_thinking, opened):
    """enable_thinking reaches the template from chat_template_kwargs: False writes an empty closed block
    (Qwen3's and llama.cpp's DeepSeek-R1 template), DeepSeek-R1's with True opens the block in the prompt;
    the server reads each as its template wrote it."""
    import tokenizers

    from anatomy.serving.chat_prompt import chat_text
    from anatomy.text.tokenizer import Tokenizer
    from benchmarks.llama_cpp import llama_sources

    try:
        template = (llama_sources() / "models" / "templates" / name).read_text(encoding="utf-8")
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"llama.cpp's templates are not here: {exc}")
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tokenizer = Tokenizer(backend, source="test", special_tokens={}, chat_template=template)
    req = ChatRequest.model_validate({**CHAT, "chat_template_kwargs": None if enable_thinking is None
                                      else {"enable_thinking": enable_thinking}})
    text = chat_text(tokenizer, req.messages, variables=req.chat_template_kwargs)
    assert prompt_opens(text) == opened, text[-40:]
    assert text.rstrip().endswith("</think>") == (enable_thinking is False)


def test_prompts_that_open_the_block():
    assert prompt_opens("<|im_start|>assistant\n<think>\n")
    assert prompt_opens("<｜Assistant｜><think>")
    assert not prompt_opens("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "Qwen3 with enable_thinking=False"
    assert not prompt_opens("<|im_start|>assistant\n")


# -- the budget, token by token ------------------------------------------------------------------

class Pieces:
    """A decoder whose token i is the text PIECES[i]."""

    def push(self, token: int) -> str:
        return PIECES[token]


PIECES = ["<", "think", ">", "a", " b", "\n</think>\n\n", "Yes", "</think>", "</th"]


def observe(state: ThinkingState, tokens: list[int]) -> list[tuple[bool, tuple[int, ...]]]:
    return [(state.observe(t), state.due()) for t in tokens]


def test_the_budget_counts_tokens_after_the_opening_tag_and_forces_the_close_once():
    state = ThinkingState(Thinking(opened=False, budget=2, close=(5,)), Pieces())
    assert observe(state, [0, 1, 2, 3]) == [(False, ())] * 3 + [(True, ())]
    assert observe(state, [4]) == [(True, (5,))], "the second token inside spends the budget"
    assert observe(state, [5, 6, 3]) == [(False, ())] * 3, "the forced close is not counted; then the answer"
    assert state.spent == 2


def test_a_block_closed_by_the_model_within_budget_is_left_alone():
    state = ThinkingState(Thinking(opened=True, budget=3, close=(5,)), Pieces())
    assert observe(state, [3, 7, 6, 4, 4, 4]) == [(True, ()), (True, ())] + [(False, ())] * 4
    assert ThinkingState(Thinking(opened=True, budget=0, close=(5,)), Pieces()).due() == (5,), \
        "a block the prompt opened with a budget of 0 closes before anything is sampled"


def test_a_closing_tag_the_model_began_is_finished_not_written_again():
    state = ThinkingState(Thinking(opened=True, budget=2, close=(5,)), Pieces(), {"ink>\n\n": [9, 10]}.get)
    assert observe(state, [3, 8]) == [(True, ()), (True, (9, 10))]


def test_no_budget_and_no_thinking_force_nothing():
    unlimited = ThinkingState(Thinking(opened=True, budget=None, close=(5,)), Pieces())
    assert all(due == () for _, due in observe(unlimited, [3] * 50)) and unlimited.spent == 50
    never = ThinkingState(Thinking(opened=False, budget=0, close=(5,)), Pieces())
    assert observe(never, [6, 0, 1, 2, 3]) == [(False, ())] * 5


# -- the budget in the serving loop --------------------------------------------------------------

THINK_THEN_ANSWER = r"<think>[a-z ]{0,300}\n?</think>\n*[A-Za-z ]{1,40}"


def think_run(model, tokenizer, grammars, *, budget, regex=THINK_THEN_ANSWER, seed=0, **submit):
    loop = ServingLoop(DecoderEngine(model), tokenizer, kv_bytes=10 ** 7, block_size=16, **submit)
    prompt = tokenizer.encode("Think, then answer:")
    params = SamplingParams(max_new_tokens=60, temperature=1.0, seed=seed, ignore_eos=True)
    constraint = grammars.compile(GrammarSpec("regex", regex, param="x"))
    return run_all(loop, [prompt], params, constraint=constraint, thinking=thinking_for(tokenizer, prompt, budget))[0]


def test_the_loop_closes_the_block_at_its_budget_and_the_answer_follows(vocab_model, smollm2_tokenizer, grammars):
    free = think_run(vocab_model, smollm2_tokenizer, grammars, budget=None)
    assert sum(e.reasoning for e in free) > 4, "without a budget this seed thinks longer"
    events = think_run(vocab_model, smollm2_tokenizer, grammars, budget=4)
    close = list(thinking_for(smollm2_tokenizer, [1], 4).close)
    inside = [i for i, e in enumerate(events) if e.reasoning]
    assert len(inside) == 4
    after = [e.token for e in events[inside[-1] + 1:inside[-1] + 1 + len(close)]]
    assert after == close
    text = "".join(e.text for e in events)
    assert re.fullmatch(THINK_THEN_ANSWER, text), "the forced close is within the grammar, the answer follows"
    reasoning, answer = split(text, opened=False)
    assert answer.strip() and reasoning.endswith("\n")


def test_a_grammar_that_does_not_allow_the_close_ends_at_the_budget(vocab_model, smollm2_tokenizer, grammars):
    events = think_run(vocab_model, smollm2_tokenizer, grammars, budget=3, regex=r"<think>[a-z ]{0,300}</think>")
    assert sum(e.reasoning for e in events) == 3 and events[-1].finish_reason == "length"


def test_a_block_the_prompt_opened_with_a_budget_of_0_is_closed_first(vocab_model, smollm2_tokenizer):
    loop = ServingLoop(DecoderEngine(vocab_model), smollm2_tokenizer, kv_bytes=10 ** 7, block_size=16)
    prompt = smollm2_tokenizer.encode("Question: why?\nAssistant: <think>\n")
    thinking = thinking_for(smollm2_tokenizer, prompt, 0)
    assert thinking.opened
    events = run_all(loop, [prompt], SamplingParams(max_new_tokens=12, ignore_eos=True), thinking=thinking)[0]
    assert [e.token for e in events[:len(thinking.close)]] == list(thinking.close)
    assert len(events) == 12 and not any(e.reasoning for e in events)
    plain = run_all(loop, [prompt + list(thinking.close)], SamplingParams(max_new_tokens=12 - len(thinking.close),
                                                                          ignore_eos=True))[0]
    assert [e.token for e in events[len(thinking.close):]] == [e.token for e in plain], \
        "the forced tokens were fed to the model: the answer is what follows them"


def test_an_output_that_never_thinks_is_unchanged(vocab_model, smollm2_tokenizer):
    loop = ServingLoop(DecoderEngine(vocab_model), smollm2_tokenizer, kv_bytes=10 ** 7, block_size=16)
    prompt = smollm2_tokenizer.encode("Hello")
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = run_all(loop, [prompt], params)[0]
    read_ = run_all(loop, [prompt], params, thinking=thinking_for(smollm2_tokenizer, prompt, 1))[0]
    assert [e.token for e in read_] == [e.token for e in plain] and not any(e.reasoning for e in read_)


def test_a_sequence_with_a_budget_does_not_speculate(vocab_model, smollm2_tokenizer):
    loop = ServingLoop(DecoderEngine(vocab_model), smollm2_tokenizer, kv_bytes=10 ** 7, block_size=16,
                       speculation=ServedSpeculation(num_speculative_tokens=3))
    prompt, params = smollm2_tokenizer.encode("Hi"), SamplingParams(max_new_tokens=2)
    budgeted = loop.submit(prompt, params, lambda e: None, thinking=thinking_for(smollm2_tokenizer, prompt, 5))
    unlimited = loop.submit(prompt, params, lambda e: None, thinking=thinking_for(smollm2_tokenizer, prompt, None))
    assert budgeted.speculation is None and unlimited.speculation is not None


def test_a_budget_needs_a_parser_and_a_request_overrides_the_servers(smollm2_tokenizer):
    from anatomy.serving.generation import thinking_of
    from anatomy.serving.protocol import RequestError
    from anatomy.serving.state import ServerState

    prompt = smollm2_tokenizer.encode("Hi")
    asked = ChatRequest.model_validate({**CHAT, "thinking_budget": 4})
    with pytest.raises(RequestError) as exc:
        thinking_of(ServerState(model_name="m", tokenizer=smollm2_tokenizer), asked, prompt)
    assert exc.value.param == "thinking_budget"
    assert thinking_of(ServerState(model_name="m", tokenizer=smollm2_tokenizer), ChatRequest.model_validate(CHAT),
                       prompt) is None, "no parser: the text is left as it is"
    state = ServerState(model_name="m", tokenizer=smollm2_tokenizer, reasoning_parser="qwen3", reasoning_budget=9)
    assert thinking_of(state, asked, prompt).budget == 4
    assert thinking_of(state, ChatRequest.model_validate(CHAT), prompt).budget == 9
    unlimited = ChatRequest.model_validate({**CHAT, "thinking_token_budget": -1})
    assert thinking_of(state, unlimited, prompt).budget is None


# -- the renders ---------------------------------------------------------------------------------

PIECED = ["\n<th", "ink>I add", " 2 and 2.</thi", "nk>\n\n", "It is ", "4."]


async def feed(pieces: list[str], inside: int = 3):
    for i, text in enumerate(pieces):
        yield 0, Event(i, text, reasoning=0 < i <= inside, finish_reason="stop" if i == len(pieces) - 1 else None)


def sse_bodies(chunks: list[bytes]) -> list[dict]:
    lines = b"".join(chunks).decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


async def gather(stream) -> list[bytes]:
    return [chunk async for chunk in stream]


def chat_render(**fields):
    req = ChatRequest.model_validate({**CHAT, **fields})
    render = ChatRender(req, None, usage_prompt=5, choices=1)
    render.read_thinking(opened=False)
    return render


def test_chat_reasoning_content_whole_and_streamed():
    whole = asyncio.run(chat_render().collect(feed(PIECED)))
    message = whole["choices"][0]["message"]
    assert message == {"role": "assistant", "reasoning_content": "I add 2 and 2.", "content": "\n\nIt is 4."}
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    chunks = sse_bodies(asyncio.run(gather(chat_render(stream=True, stream_options={"include_usage": True})
                                           .stream(feed(PIECED)))))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert not any("reasoning_content" in d for d in deltas[first_content:]), "reasoning comes first"
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


def test_responses_reasoning_item_whole_and_streamed():
    from anatomy.serving.responses_api import ResponsesRender, ResponsesRequest

    def render(stream: bool):
        req = ResponsesRequest.model_validate({"model": "m", "input": "2 + 2?", "stream": stream})
        out = ResponsesRender(req, req.chat(), prompt_tokens=5)
        out.read_thinking(opened=False)
        return out

    whole = asyncio.run(render(False).collect(feed(PIECED)))
    assert [item["type"] for item in whole["output"]] == ["reasoning", "message"]
    assert whole["output"][0]["content"] == [{"type": "reasoning_text", "text": "I add 2 and 2."}]
    assert whole["output"][1]["content"][0]["text"] == "\n\nIt is 4."
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == 3
    events = sse_bodies(asyncio.run(gather(render(True).stream(feed(PIECED)))))
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "I add 2 and 2."
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    final = events[-1]["response"]["output"]
    assert [(i["type"], i["content"][0]["text"]) for i in final] == [(i["type"], i["content"][0]["text"])
                                                                      for i in whole["output"]]


def test_messages_thinking_block_whole_and_streamed():
    from anatomy.serving.messages_api import MessageRender
    from anatomy.serving.messages_protocol import MessagesRequest

    def render():
        req = MessagesRequest.model_validate({"model": "m", "max_tokens": 20,
                                              "messages": [{"role": "user", "content": "2 + 2?"}]})
        out = MessageRender(req, req.chat(), prompt_tokens=5)
        out.read_thinking(opened=False)
        return out

    whole = asyncio.run(render().collect(feed(PIECED)))
    assert whole["content"] == [{"type": "thinking", "thinking": "I add 2 and 2.", "signature": ""},
                                {"type": "text", "text": "\n\nIt is 4."}]
    events = sse_bodies(asyncio.run(gather(render().stream(feed(PIECED)))))
    thinking = "".join(e["delta"]["thinking"] for e in events if e["type"] == "content_block_delta"
                       and e["delta"]["type"] == "thinking_delta")
    assert thinking == "I add 2 and 2."
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]


# -- the real server -----------------------------------------------------------------------------

MODEL = "smollm2-135m-instruct"
FORCED = r"<think>[a-z ]{1,80}\n?</think>\n*[A-Za-z ]{1,30}"


@pytest.fixture(scope="module")
def server():
    # no prefix cache: a cached prompt computes only its tail, whose rounding can flip a near-tie under the
    # grammar (the same question, whole and streamed, must take the same path)
    s = Server("--reasoning-parser", "qwen3", "--kv-memory", "192MiB", "--embedding-model", "none",
               "--no-prefix-cache")
    yield s
    s.close()


def ask(client, max_tokens=160, **options):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Why is the sky blue? Think first."}], temperature=0,
        max_tokens=max_tokens, **options)


def streamed_fields(client, **options) -> tuple[str, str, dict]:
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}, **options))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    return reasoning, "".join(d.content or "" for d in deltas), chunks[-1].usage.completion_tokens_details


@pytest.mark.slow
def test_server_reasoning_content_whole_and_streamed(server):
    client = server.client()
    r = ask(client, extra_body={"guided_regex": FORCED})
    message = r.choices[0].message
    assert message.reasoning_content and message.content and "think>" not in message.content
    assert re.fullmatch(FORCED, f"<think>{message.reasoning_content}</think>{message.content}")
    reasoning, content, details = streamed_fields(client, extra_body={"guided_regex": FORCED})
    assert (reasoning, content) == (message.reasoning_content, message.content)
    assert details.reasoning_tokens == r.usage.completion_tokens_details.reasoning_tokens > 0
    plain = ask(client, max_tokens=20).choices[0].message
    assert plain.reasoning_content is None and plain.content, "an answer that does not think is all content"


@pytest.mark.slow
def test_server_thinking_budget(server):
    client = server.client()
    for budget in (0, 3):
        body = {"guided_regex": r"<think>[a-z ]{0,300}\n?</think>\n*[A-Za-z ]{1,30}", "thinking_budget": budget}
        r = ask(client, extra_body=body)
        message, used = r.choices[0].message, r.usage.completion_tokens_details.reasoning_tokens
        assert used <= budget and message.content.strip() and r.choices[0].finish_reason == "stop"
        assert message.reasoning_content is not None
        assert streamed_fields(client, extra_body=body)[:2] == (message.reasoning_content, message.content)



def test_anthropic_thinking_becomes_the_budget_and_thinking_blocks_the_reasoning():
    from anatomy.serving.messages_protocol import MessagesRequest

    turns = [{"role": "user", "content": "2 + 2?"},
             {"role": "assistant", "content": [{"type": "thinking", "thinking": "Add them.", "signature": "s"},
                                               {"type": "redacted_thinking", "data": "..."},
                                               {"type": "text", "text": "4."}]},
             {"role": "user", "content": "And 3 + 3?"}]
    req = MessagesRequest.model_validate({"model": "m", "max_tokens": 50, "messages": turns,
                                          "thinking": {"type": "enabled", "budget_tokens": 20}})
    req.check()
    chat = req.chat()
    assert chat.thinking_budget == 20 and chat.chat_template_kwargs == {"enable_thinking": True}
    assistant = chat.messages[1]
    assert assistant.text() == "4." and assistant.model_extra["reasoning_content"] == "Add them."
    off = MessagesRequest.model_validate({"model": "m", "max_tokens": 50, "messages": turns[:1],
                                          "thinking": {"type": "disabled"}}).chat()
    assert off.thinking_budget is None and off.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.slow
def test_the_anthropic_sdk_sends_thinking_and_gets_its_blocks(server):
    """The SDK's thinking parameter and a history holding its own thinking block, on a server with a
    parser: the answer comes back (a thinking block first when the model thinks)."""
    import anthropic

    claude = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    first = claude.messages.create(model=MODEL, max_tokens=40, thinking={"type": "enabled", "budget_tokens": 8},
                                   messages=[{"role": "user", "content": "Why is the sky blue?"}])
    assert first.stop_reason in ("end_turn", "max_tokens") and first.content
    assert all(b.type in ("thinking", "text") for b in first.content)
    history = [{"role": "user", "content": "Why is the sky blue?"},
               {"role": "assistant", "content": [{"type": "thinking", "thinking": "Rayleigh.", "signature": ""},
                                                 {"type": "text", "text": "Scattering."}]},
               {"role": "user", "content": "Say more."}]
    again = claude.messages.create(model=MODEL, max_tokens=20, messages=history,
                                   thinking={"type": "enabled", "budget_tokens": 4})
    assert again.content and again.usage.output_tokens <= 20
