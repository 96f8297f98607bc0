"""The OpenAI API's request bodies, validated: every field typed and ranged, unknown fields refused.

A body is parsed from its JSON bytes in strict mode (a string is not a number, a number is not a
boolean); the first problem becomes one `RequestError` naming the field (`param`) and the rule,
which the app answers as OpenAI does: 400 with {"error": {"message", "type", "param", "code"}}.
Fields OpenAI has and this server does not implement (tools, response_format, logit_bias, echo,
suffix, best_of > 1, ...) are refused by name rather than silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from anatomy.errors import InputError
from anatomy.inference.sampling import SamplingParams

MAX_N = 16  # choices per request
MAX_TOP_LOGPROBS = 20  # chat (OpenAI's limit)
MAX_COMPLETION_LOGPROBS = 5  # legacy completions (OpenAI's limit)
MAX_STOP = 4


class RequestError(InputError):
    """Bad input at the HTTP edge: the status, the message and the field it is about."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = message, param, status, code, type


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _Sampling(_Body):
    """The sampling fields chat and completions share (OpenAI's, and vLLM's top_k, min_p,
    repetition_penalty, ignore_eos)."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # 0 or -1: off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2 ** 63), lt=2 ** 64)
    stop: Union[str, list[str], None] = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = None  # accepted, not used
    # llama-server's per-request speculative decoding: at most n_max, at least n_min proposed tokens per
    # round (n_max 0: none); the server verifies prompt-lookup proposals (or its --speculative method)
    speculative_n_max: int | None = Field(default=None, ge=0, le=32, alias="speculative.n_max")
    speculative_n_min: int = Field(default=0, ge=0, le=32, alias="speculative.n_min")

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise RequestError(f"stop has {len(stops)} strings, at most {MAX_STOP} are allowed", param="stop")
        if any(not s for s in stops):
            raise RequestError("stop strings must not be empty", param="stop")
        return tuple(stops)

    def sampling(self, max_new_tokens: int, choice: int = 0) -> SamplingParams:
        """The SamplingParams of choice `choice` (a seeded request's choices use seed, seed + 1, ...)."""
        seed = None if self.seed is None else (self.seed + choice) % 2 ** 63
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=self.temperature, top_k=max(self.top_k, 0),
                              top_p=self.top_p, min_p=self.min_p, repetition_penalty=self.repetition_penalty,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              seed=seed, stop=self.stops(), ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(_Sampling):
    messages: list[Message]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # OpenAI fields not implemented here: refused if set to anything but their "off" value
    tools: Any = None
    tool_choice: Any = None
    response_format: Any = None
    logit_bias: Any = None
    functions: Any = None

    def check(self) -> None:
        if not self.messages:
            raise RequestError("messages must hold at least one message", param="messages")
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs to be true", param="top_logprobs")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise RequestError("max_tokens and max_completion_tokens differ; give one of them", param="max_tokens")
        _unsupported(self, ("tools", "tool_choice", "functions", "logit_bias"))
        if self.response_format not in (None, {"type": "text"}):
            raise RequestError("response_format other than {'type': 'text'} is not supported by this server",
                               param="response_format")

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    logit_bias: Any = None

    def check(self) -> None:
        if self.echo:
            raise RequestError("echo is not supported by this server", param="echo")
        if self.best_of not in (None, 1, self.n):
            raise RequestError("best_of other than n is not supported by this server", param="best_of")
        _unsupported(self, ("suffix", "logit_bias"))
        if not self.prompts():
            raise RequestError("prompt must not be empty", param="prompt")

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the request: a string, a list of token ids, or a list of either."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p] if p else []
        return list(p)

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    @property
    def logprob_count(self) -> int | None:
        return self.logprobs


class EmbeddingRequest(_Body):
    model: str
    input: Union[str, list[str]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None

    def texts(self) -> list[str]:
        texts = [self.input] if isinstance(self.input, str) else list(self.input)
        if not texts or any(not t for t in texts):
            raise RequestError("input must be a non-empty string or a non-empty list of non-empty strings",
                               param="input")
        if self.dimensions is not None:
            raise RequestError("dimensions is not supported by this server", param="dimensions")
        return texts


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("give either prompt or messages", param="prompt")
        if self.messages is not None and not self.messages:
            raise RequestError("messages must hold at least one message", param="messages")


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def parse(model: type[_Body], body: bytes) -> Any:
    """The validated request of JSON `body`, or a RequestError about its first problem."""
    try:
        request = model.model_validate_json(body)
    except ValidationError as exc:
        raise _request_error(exc) from None
    if hasattr(request, "check"):
        request.check()
    return request


def _request_error(exc: ValidationError) -> RequestError:
    error = exc.errors(include_url=False)[0]
    kind = error["type"]
    if kind in ("json_invalid", "json_type"):
        return RequestError(f"the request body is not valid JSON: {error['msg']}", code="invalid_json")
    loc = [str(part) for part in error["loc"] if not str(part).startswith(("function-", "union["))]
    # a union reports one error per member type: keep the field's own path
    param = ".".join(p for p in loc if not _is_type_name(p)) or None
    if not loc:
        return RequestError(f"the request body must be a JSON object, got {_short(error.get('input'))}")
    if kind == "extra_forbidden":
        return RequestError(f"unrecognized request argument supplied: {param}", param=param)
    if kind == "missing":
        return RequestError(f"{param} is required", param=param)
    value = error.get("input")
    return RequestError(f"{param}: {error['msg']} (got {_short(value)})", param=param)


def _is_type_name(part: str) -> bool:
    return part in ("str", "int", "list[str]", "list[int]", "list[list[int]]", "list[TextPart]", "none") or \
        part.startswith(("list[", "literal["))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unsupported(request: _Body, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(request, name) not in (None, {}, []):
            raise RequestError(f"{name} is not supported by this server", param=name)
