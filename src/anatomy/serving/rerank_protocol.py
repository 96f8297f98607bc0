"""Request bodies of /v1/rerank (Cohere's and Jina's shape, as vLLM takes it) and /v1/score (vLLM's).

    rerank: {model?, query, documents: [str | {"text"}], top_n?, return_documents?, instruction?, activation?}
    score:  {model?, text_1: str | [str], text_2: str | [str], instruction?, activation?}
            one text_1 against every text_2, or the lists pairwise (equal lengths)
`instruction` (anatomy's) replaces the yes/no reranker's default instruction; `activation` (vLLM's,
also `use_activation`) false returns raw logits rather than sigmoid scores.
"""

from __future__ import annotations

from typing import Union

from pydantic import AliasChoices, Field

from anatomy.serving.protocol import RequestError, _Body


class TextDocument(_Body):
    text: str


class _Scoring(_Body):
    model: str | None = None
    instruction: str | None = None
    activation: bool | None = Field(default=None, validation_alias=AliasChoices("activation", "use_activation"))


class RerankRequest(_Scoring):
    query: str
    documents: list[Union[str, TextDocument]]
    top_n: int | None = None
    return_documents: bool = True  # vLLM and Jina return them; Cohere's v2 asks for them

    def check(self) -> None:
        if not self.documents:
            raise RequestError("documents must hold at least one document", param="documents")
        if self.top_n is not None and self.top_n < 1:
            raise RequestError(f"top_n={self.top_n} must be >= 1", param="top_n")
        _check_text(self.query, "query")
        for i, text in enumerate(self.texts()):
            _check_text(text, f"documents.{i}")

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class ScoreRequest(_Scoring):
    text_1: Union[str, list[str]]
    text_2: Union[str, list[str]]

    def check(self) -> None:
        for name in ("text_1", "text_2"):
            texts = self._list(name)
            if not texts:
                raise RequestError(f"{name} must be a string or a non-empty list of strings", param=name)
            for i, text in enumerate(texts):
                _check_text(text, name if isinstance(getattr(self, name), str) else f"{name}.{i}")
        first, second = self._list("text_1"), self._list("text_2")
        if len(first) > 1 and len(first) != len(second):
            raise RequestError(f"text_1 has {len(first)} texts and text_2 {len(second)}: give one text_1, or as "
                               "many as text_2 (scored pairwise)", param="text_1")

    def pairs(self) -> list[tuple[str, str]]:
        first, second = self._list("text_1"), self._list("text_2")
        return list(zip(first * len(second) if len(first) == 1 else first, second))

    def _list(self, name: str) -> list[str]:
        value = getattr(self, name)
        return [value] if isinstance(value, str) else list(value)


def _check_text(text: str, param: str) -> None:
    """Text the tokenizer can read: valid Unicode (JSON may carry a lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{param} is not valid Unicode: {exc.reason} at {exc.start}", param=param) from None
