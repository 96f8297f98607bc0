"""One request's generation on the serving loop: its sequences (n per prompt) submitted with their
grammar constraints, logit bias and thinking budget, their events gathered into a response or streamed
as SSE, the client's disconnect cancelling them; and the shutdown's drain of the requests in flight."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from anatomy.serving import responses
from anatomy.serving.adapters import requested
from anatomy.serving.chat_prompt import chat_text
from anatomy.serving.grammar import GrammarError, GrammarSpec
from anatomy.serving.protocol import ChatRequest, CompletionRequest, RequestError
from anatomy.serving.sequence import Event
from anatomy.serving.state import ServerState
from anatomy.serving.thinking import Thinking, thinking_for
from anatomy.serving.tools import choice_grammar


async def generate(state: ServerState, request: Request, req: ChatRequest | CompletionRequest,
                   prompts: list[list[int]], *, chat: bool, spec: GrammarSpec | None = None,
                   render: Any = None) -> Response:
    """Run the prompts (n choices each) on the loop; the response whole, or streamed as SSE."""
    loop = state.serving()
    limits = [token_limit(len(ids), req.token_limit, loop.context, chat=chat) for ids in prompts]
    thinking = thinking_of(state, req, prompts[0]) if chat else None
    if req.priority and loop.scheduler.policy != "priority":  # as vLLM refuses it
        raise RequestError(f"priority {req.priority} needs a server started with --scheduling-policy priority",
                           param="priority")
    count = len(prompts) * req.n
    state.admit(count)
    constraints = await compile_constraints(state, spec, count)
    bias = req.bias(loop.engine.config.vocab_size)
    run = RequestRun(state, prompts, req, limits, constraints=constraints, bias=bias, thinking=thinking)
    if render is None:
        render = responses.ChatRender(req, state.tokenizer, usage_prompt=sum(map(len, prompts)), choices=count) \
            if chat else responses.CompletionRender(req, state.tokenizer, usage_prompt=sum(map(len, prompts)),
                                                    choices=count, prompts=echoed(state.tokenizer, req, prompts))
    if thinking is not None:
        render.read_thinking(opened=thinking.opened)
    if req.stream:
        return EventStream(render.stream(run.events()), on_disconnect=run.cancel)
    gathered = asyncio.ensure_future(render.collect(run.events()))
    gone = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait({gathered, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not gathered.done():  # the client left: free its sequences now
        run.cancel()
        gathered.cancel()
        return Response(status_code=499)
    gone.cancel()
    return JSONResponse(gathered.result())


def chat_inputs(tokenizer: Any, req: ChatRequest, prefill: str = "") -> tuple[list[int], GrammarSpec | None]:
    """A chat request's prompt ids (its tools in it unless tool_choice is "none"; `prefill`, the start
    of the answer, after it) and the grammar its output must follow (response_format and the like, or
    tool_choice required / named), if any."""
    tools = req.tools if req.tool_choice_name != "none" else None
    text = chat_text(tokenizer, req.messages, tools=tools, add_generation_prompt=req.add_generation_prompt,
                     variables=req.chat_template_kwargs)
    ids = tokenizer.encode(text + prefill, add_special_tokens=False)
    spec = req.structure() or choice_grammar(req.tools or [], req.tool_choice_name, parallel=req.parallel_tool_calls)
    return ids, spec


def thinking_of(state: ServerState, req: ChatRequest, prompt: list[int]) -> Thinking | None:
    """A chat request's thinking block, read when the server has a --reasoning-parser (else None), with
    the request's budget or the server's."""
    asked = req.thinking_budget
    if state.reasoning_parser is None:
        if asked is not None:
            raise RequestError("thinking_budget needs a server started with --reasoning-parser",
                               param="thinking_budget")
        return None
    budget = state.reasoning_budget if asked is None else asked
    return thinking_for(state.tokenizer, prompt, None if budget < 0 else budget)


async def compile_constraints(state: ServerState, spec: GrammarSpec | None, count: int) -> list:
    """One Constraint per sequence (the grammar compiled once, off the event loop), or Nones."""
    if spec is None:
        return [None] * count
    engine = await asyncio.to_thread(state.grammars)
    try:
        first = await asyncio.to_thread(engine.compile, spec)
    except GrammarError as exc:
        raise RequestError(exc.message, param=exc.param) from None
    return [first] + [engine.compile(spec) for _ in range(count - 1)]  # copies of the cached grammar


def echoed(tokenizer: Any, req: CompletionRequest, prompts: list[list[int]]) -> list[tuple[str, list[int]]] | None:
    """echo: each prompt's text (as sent, or its ids decoded) and ids."""
    if not req.echo:
        return None
    given = req.prompts()
    return [(p if isinstance(p, str) else tokenizer.decode(ids), ids) for p, ids in zip(given, prompts)]


async def drain(state: ServerState, deadline_s: float) -> None:
    """Shutdown: new requests get 503 from now on; the runs in flight have up to `deadline_s` seconds
    to finish, then the rest are aborted (a stream ends with an error event and [DONE])."""
    state.draining = True
    end = time.monotonic() + deadline_s
    while state.runs and time.monotonic() < end:
        await asyncio.sleep(0.05)
    for run in list(state.runs):
        run.abort(f"the server shut down before this request finished ({deadline_s:g} s after the signal)")
    await asyncio.sleep(0.2)  # the streams write their last events


def token_limit(prompt: int, asked: int | None, context: int, *, chat: bool) -> int:
    """max_tokens of a prompt of `prompt` tokens: as asked if prompt + it fits the context, else a
    400 saying both numbers; unset: whatever room the context leaves."""
    where = "messages" if chat else "prompt"
    if prompt >= context:
        raise RequestError(f"this model's maximum context length is {context} tokens, and the {where} alone "
                           f"has {prompt} tokens", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
    if asked is None:
        return context - prompt
    if prompt + asked > context:
        raise RequestError(f"this model's maximum context length is {context} tokens; you requested "
                           f"{prompt + asked} tokens ({prompt} in the {where}, {asked} in the completion)",
                           param="max_tokens", code="context_length_exceeded")
    return asked


class RequestRun:
    """The sequences of one HTTP request (n per prompt) and the queue their events arrive on; while
    it runs it is in state.runs (the admission limit counts its open choices; shutdown aborts it)."""

    def __init__(self, state: ServerState, prompts: list[list[int]], req: ChatRequest | CompletionRequest,
                 limits: list[int], *, constraints: list, bias: dict[int, float],
                 thinking: Thinking | None = None) -> None:
        self.state, self.loop = state, state.loop
        self.queue: asyncio.Queue[tuple[int, Event] | None] = asyncio.Queue()
        aio = asyncio.get_running_loop()
        self.seqs = []
        prompt_logprobs = getattr(req, "prompt_logprob_count", None)
        adapter, scale = requested(state, req)  # the LoRA adapter its rows run with (serving/adapters.py)
        for p, (ids, limit) in enumerate(zip(prompts, limits)):
            for j in range(req.n):
                index = p * req.n + j
                sink = _sink(aio, self.queue, index)
                self.seqs.append(self.loop.submit(
                    ids, req.sampling(limit, choice=j), sink, logprobs=req.logprob_count,
                    prompt_logprobs=prompt_logprobs, constraint=constraints[index], bias=bias,
                    min_tokens=req.min_tokens, generate=limit > 0, speculative_tokens=req.speculative_n_max,
                    speculative_min=req.speculative_n_min, thinking=thinking, priority=req.priority,
                    adapter=adapter, adapter_scale=scale))
        self.open = len(self.seqs)
        self.cancelled = False
        self.aborted: str | None = None
        state.runs.add(self)

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        """(choice index, event) until every choice has finished (or the run is cancelled); a
        RequestError (503) if the server's shutdown ended it first."""
        try:
            while self.open:
                item = await self.queue.get()
                if item is None:
                    break
                if item[1].finish_reason is not None:
                    self.open -= 1
                yield item
        finally:
            self.state.runs.discard(self)
        if self.aborted:
            raise RequestError(self.aborted, status=503, type="server_error", code="shutting_down")

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        self.open = 0
        for seq in self.seqs:
            if not seq.finished:
                self.loop.cancel(seq)
        self.queue.put_nowait(None)
        self.state.runs.discard(self)

    def abort(self, message: str) -> None:
        """End the run now (shutdown): its sequences are cancelled, its response ends with `message`."""
        self.aborted = message
        self.cancel()


def _sink(aio: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int) -> Callable[[Event], None]:
    def sink(event: Event) -> None:  # called on the serving loop's thread
        if aio.is_closed():  # the server has stopped: nobody is listening
            return
        try:
            aio.call_soon_threadsafe(queue.put_nowait, (index, event))
        except RuntimeError:  # closed between the check and the call
            pass
    return sink


class EventStream(Response):
    """A server-sent-events response that stops, and cancels the generation, as soon as the client
    disconnects (not only when the next write fails)."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], *, on_disconnect: Callable[[], None]) -> None:
        self.chunks, self.on_disconnect = chunks, on_disconnect
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope, receive, send) -> None:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.on_disconnect()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the client went away mid-write
            self.on_disconnect()
        finally:
            watcher.cancel()
            await self.chunks.aclose()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
