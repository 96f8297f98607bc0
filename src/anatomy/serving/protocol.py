"""The OpenAI API's request bodies, validated: every known field typed and ranged.

A body is parsed from its JSON bytes in strict mode (a string is not a number, a number is not a
boolean); its first problem becomes one `RequestError` naming the field (`param`) and the rule, which
the app answers as OpenAI does: 400 with {"error": {"message", "type", "param", "code"}}. The vendor
extensions clients send are implemented; fields that would change the answer but are not implemented
are refused by name; any other field is ignored and logged (refused with --strict-fields).
Details: docs/serving.md, "Vendor extensions and unknown fields" and "Errors".
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Union

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from anatomy.errors import InputError
from anatomy.inference.sampling import SamplingParams
from anatomy.serving.grammar import GrammarSpec

MAX_N = 16  # choices per request
MAX_TOP_LOGPROBS = 20  # chat (OpenAI's limit)
MAX_COMPLETION_LOGPROBS = 5  # legacy completions (OpenAI's limit)
MAX_STOP = 4
MAX_LOGIT_BIAS = 300  # entries (OpenAI's limit)
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names


class RequestError(InputError):
    """Bad input at the HTTP edge: the status, the message and the field it is about."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.type = message, param, status, code, type
        self.headers = headers


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: the usage so far in every chunk


class TextPart(_Body):
    type: Literal["text", "input_text", "output_text"]
    text: str


class CalledFunction(_Body):
    name: str
    arguments: Union[str, dict[str, Any]] = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionDef(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: ChosenFunction


class JsonSchemaFormat(_Body):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Body):
    """vLLM's `structured_outputs` (the newer name of its guided_* fields): one of them."""

    json_: Union[dict[str, Any], str, None] = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class LoraScale(_Body):
    """One entry of llama-server's per-request `lora` list: the adapter of index `id` at `scale`."""

    id: int = Field(ge=0)
    scale: float = Field(default=1.0, ge=-1e4, le=1e4)


class _Sampling(_Body):
    """The fields chat and completions share: sampling (OpenAI's, and vLLM's top_k, min_p, min_tokens,
    repetition_penalty, ignore_eos), logit_bias, streaming, and the structured-output fields."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # 0 or -1: off
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    min_tokens: int = Field(default=0, ge=0)
    seed: int | None = Field(default=None, ge=-(2 ** 63), lt=2 ** 64)
    stop: Union[str, list[str], None] = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    user: str | None = None  # accepted, not used
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: Union[dict[str, Any], str, None] = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None  # accepted: the server has one engine
    # llama-server's per-request speculative decoding: at most n_max, at least n_min proposed tokens per
    # round (n_max 0: none); the server verifies prompt-lookup proposals (or its --speculative method)
    speculative_n_max: int | None = Field(default=None, ge=0, le=32, alias="speculative.n_max")
    speculative_n_min: int = Field(default=0, ge=0, le=32, alias="speculative.n_min")
    priority: int = Field(default=0, ge=-(2 ** 63), lt=2 ** 63)  # vLLM's: lower first (--scheduling-policy priority)
    lora: list[LoraScale] | None = None  # llama-server's: adapters by index with a scale (serving/adapters.py)

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
        return SamplingParams(max_new_tokens=max(max_new_tokens, 1), temperature=self.temperature,
                              top_k=max(self.top_k, 0), top_p=self.top_p, min_p=self.min_p,
                              repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty, seed=seed, stop=self.stops(),
                              ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and self.stream_options.continuous_usage_stats

    def bias(self, vocab_size: int) -> dict[int, float]:
        """logit_bias as {token id: bias}: ids in the vocabulary, biases in [-100, 100] (OpenAI's rules)."""
        if not self.logit_bias:
            return {}
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise RequestError(f"logit_bias has {len(self.logit_bias)} entries, at most {MAX_LOGIT_BIAS} are allowed",
                               param="logit_bias")
        bias = {}
        for key, value in self.logit_bias.items():
            if not key.strip().lstrip("-").isdigit() or not 0 <= int(key) < vocab_size:
                raise RequestError(f"logit_bias: {key!r} is not a token id in [0, {vocab_size})", param="logit_bias")
            if not -100.0 <= value <= 100.0:
                raise RequestError(f"logit_bias[{key!r}] = {value} is not in [-100, 100]", param="logit_bias")
            bias[int(key)] = float(value)
        return bias

    def structure(self) -> GrammarSpec | None:
        """The grammar the output must follow (response_format, structured_outputs or a guided_*
        field; at most one of them), or None."""
        given = [spec for spec in (self._response_format(), *self._structured(), *self._guided()) if spec is not None]
        if len(given) > 1:
            raise RequestError(f"{given[0].param} and {given[1].param} both constrain the output; give one of them",
                               param=given[1].param)
        return given[0] if given else None

    def _response_format(self) -> GrammarSpec | None:
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return GrammarSpec("json", {"type": "object"}, param="response_format")
        if fmt.json_schema is None:
            raise RequestError("response_format of type json_schema needs a json_schema", param="response_format")
        schema = fmt.json_schema.schema_
        return GrammarSpec("json", {"type": "object"} if schema is None else schema,
                           param="response_format.json_schema.schema")

    def _structured(self) -> list[GrammarSpec | None]:
        s = self.structured_outputs
        if s is None:
            return []
        return [_json_spec(s.json_, "structured_outputs.json"), _spec("regex", s.regex, "structured_outputs.regex"),
                _spec("choice", s.choice, "structured_outputs.choice"),
                _grammar_spec(s.grammar, "structured_outputs.grammar"),
                GrammarSpec("json", {"type": "object"}, param="structured_outputs.json_object") if s.json_object
                else None]

    def _guided(self) -> list[GrammarSpec | None]:
        return [_json_spec(self.guided_json, "guided_json"), _spec("regex", self.guided_regex, "guided_regex"),
                _spec("choice", self.guided_choice, "guided_choice"),
                _grammar_spec(self.guided_grammar, "guided_grammar")]


def _spec(kind: str, value: Any, param: str) -> GrammarSpec | None:
    if value is None:
        return None
    if kind == "choice" and (not value or any(not c for c in value)):
        raise RequestError(f"{param} must be a non-empty list of non-empty strings", param=param)
    return GrammarSpec(kind, value, param=param)


def _json_spec(value: Any, param: str) -> GrammarSpec | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RequestError(f"{param} is not valid JSON: {exc}", param=param) from None
        if not isinstance(value, dict):
            raise RequestError(f"{param} must be a JSON schema (an object)", param=param)
    return _spec("json", value, param)


def _grammar_spec(value: str | None, param: str) -> GrammarSpec | None:
    """A grammar: llama.cpp's GBNF (rules written with ::=) or a Lark grammar."""
    if value is None:
        return None
    return GrammarSpec("gbnf" if "::=" in value else "lark", value, param=param)


class ChatRequest(_Sampling):
    messages: list[Message]
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: extra variables for the chat template
    add_generation_prompt: bool = True
    # the most tokens generated inside a thinking block (-1: no limit; unset: the server's --reasoning-budget)
    thinking_budget: int | None = Field(default=None, ge=-1,
                                        validation_alias=AliasChoices("thinking_budget", "thinking_token_budget"))
    # OpenAI fields not implemented here: refused if set
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    prediction: Any = None
    modalities: list[str] | None = None

    def check(self) -> None:
        if not self.messages:
            raise RequestError("messages must hold at least one message", param="messages")
        if self.top_logprobs is not None and not self.logprobs:
            raise RequestError("top_logprobs needs logprobs to be true", param="top_logprobs")
        if self.max_tokens is not None and self.max_completion_tokens is not None \
                and self.max_tokens != self.max_completion_tokens:
            raise RequestError("max_tokens and max_completion_tokens differ; give one of them", param="max_tokens")
        _unsupported(self, ("functions", "function_call", "audio", "prediction"))
        reserved = sorted(set(self.chat_template_kwargs or {}) & {"messages", "add_generation_prompt", "tools"})
        if reserved:
            raise RequestError(f"chat_template_kwargs must not set {', '.join(reserved)} (request fields of their own)",
                               param="chat_template_kwargs")
        if self.modalities not in (None, ["text"]):
            raise RequestError("modalities other than ['text'] are not supported by this server", param="modalities")
        self._check_tools()

    def _check_tools(self) -> None:
        names = []
        for i, tool in enumerate(self.tools or []):
            name = tool.function.name
            if not TOOL_NAME.fullmatch(name):
                raise RequestError(f"tools[{i}].function.name {name!r} must be 1-64 letters, digits, _ or -",
                                   param=f"tools.{i}.function.name")
            if name in names:
                raise RequestError(f"tools[{i}].function.name {name!r} is given twice", param=f"tools.{i}.function.name")
            names.append(name)
        choice = self.tool_choice
        if choice in ("required",) or isinstance(choice, NamedToolChoice):
            if not names:
                raise RequestError("tool_choice needs tools", param="tool_choice")
            if self.structure() is not None:
                raise RequestError(f"tool_choice {self.tool_choice_name} and {self.structure().param} both constrain "
                                   "the output; give one of them", param="tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise RequestError(f"tool_choice names the function {choice.function.name!r}, which is not in tools "
                               f"({', '.join(names)})", param="tool_choice")

    @property
    def tool_choice_name(self) -> str:
        """'none', 'auto', 'required' or the named function ('auto' when tools are given, else 'none')."""
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return choice.function.name
        return choice or ("auto" if self.tools else "none")

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def check(self) -> None:
        if self.best_of not in (None, 1, self.n):
            raise RequestError("best_of other than n is not supported by this server", param="best_of")
        if self.echo and self.n > 1:
            raise RequestError("echo with n > 1 is not supported by this server (send n requests)", param="n")
        if self.echo and self.stream:
            raise RequestError("echo with stream is not supported by this server", param="echo")
        _unsupported(self, ("suffix",))
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

    @property
    def prompt_logprob_count(self) -> int | None:
        """Top logprobs per prompt token (echo with logprobs), or None."""
        return self.logprobs if self.echo else None


class EmbeddingRequest(_Body):
    model: str
    input: Union[str, list[str], list[int], list[list[int]]]  # texts or token ids, as OpenAI takes them
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)  # Matryoshka: the first d values, normalised again
    user: str | None = None

    def inputs(self) -> list[str] | list[list[int]]:
        """The texts, or the lists of token ids (one list of ints is one input)."""
        value = self.input
        inputs = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else list(value)
        if not inputs or any(not x for x in inputs):
            raise RequestError("input must be a non-empty string, a non-empty list of non-empty strings, or "
                               "token ids (a non-empty list of ints, or a list of such lists)", param="input")
        return inputs


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False  # vLLM's: also each token's string

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("give either prompt or messages", param="prompt")
        if self.messages is not None and not self.messages:
            raise RequestError("messages must hold at least one message", param="messages")


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


class LoadLoraRequest(_Body):
    """POST /v1/load_lora_adapter (vLLM's): serve the adapter at lora_path (PEFT or GGUF) as lora_name."""

    lora_name: str
    lora_path: str


class UnloadLoraRequest(_Body):
    """POST /v1/unload_lora_adapter (vLLM's)."""

    lora_name: str
    lora_int_id: int | None = None  # vLLM's, ignored: the name says which


def parse(model: type[_Body], body: bytes, *, strict: bool = False) -> Any:
    """The validated request of JSON `body`, or a RequestError about its first problem. Unknown
    fields are kept in the models' `model_extra` (see ignored_fields), or refused when `strict`."""
    try:
        request = model.model_validate_json(body)
    except ValidationError as exc:
        raise _request_error(exc) from None
    if strict and (extra := ignored_fields(request)):
        raise RequestError(f"unrecognized request argument supplied: {extra[0]}", param=extra[0])
    if hasattr(request, "check"):
        request.check()
    return request


def validated(model: type[_Body], fields: dict[str, Any]) -> Any:
    """The checked request of `fields` (one request rewritten as another), or a RequestError."""
    try:
        request = model.model_validate(fields)
    except ValidationError as exc:
        raise _request_error(exc) from None
    request.check()
    return request


def ignored_fields(value: Any, path: str = "") -> list[str]:
    """The dotted paths of the unknown fields of a parsed request (nested models and lists included)."""
    found = []
    if isinstance(value, BaseModel):
        found += [f"{path}{name}" for name in (value.model_extra or {})]
        for name in type(value).model_fields:
            found += ignored_fields(getattr(value, name), f"{path}{name}.")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += ignored_fields(item, f"{path}{i}.")
    return found


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
    if kind == "missing":
        return RequestError(f"{param} is required", param=param)
    value = error.get("input")
    return RequestError(f"{param}: {error['msg']} (got {_short(value)})", param=param)


def _is_type_name(part: str) -> bool:
    return part in ("str", "int", "list[str]", "list[int]", "list[list[int]]", "list[TextPart]", "none",
                    "NamedToolChoice", "dict[str,any]") or part.startswith(("list[", "literal[", "dict["))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unsupported(request: _Body, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(request, name) not in (None, {}, []):
            raise RequestError(f"{name} is not supported by this server", param=name)
