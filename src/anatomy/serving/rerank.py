"""The scorers behind /v1/rerank and /v1/score: each turns (query, document) pairs into one logit a pair.

    CrossEncoder   a BERT-style sequence classifier of one label (HF BertForSequenceClassification,
                   ms-marco-MiniLM's shape): [CLS] query [SEP] document [SEP] -> its logit
    YesNoReranker  the served decoder as Qwen3-Reranker is used: the pair in its prompt, then
                   logit("yes") - logit("no") at the last position (vLLM's classifier_from_token)

`activation` maps a logit to sigmoid(logit), unless the model names Identity (docs/serving.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from anatomy.errors import CheckpointError, InputError
from anatomy.inference.embed import pad_right
from anatomy.serving.pooling import BATCH, DecoderPasses
from anatomy.serving.protocol import RequestError

# Qwen3-Reranker's prompt (its model card): the system turn, the pair, an empty thinking block
SYSTEM = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the '
          'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
PAIR = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
ANSWER = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
ACTIVATIONS = {"Sigmoid": True, "Identity": False}  # sentence-transformers' names -> apply sigmoid


def activated(logits: Tensor, activation: bool) -> Tensor:
    return torch.sigmoid(logits) if activation else logits


class CrossEncoder:
    """A one-label sequence classifier read from an HF checkpoint, with its tokenizer."""

    def __init__(self, name: str) -> None:
        import anatomy
        from anatomy.checkpoints.source import find_model
        from anatomy.models import SequenceClassifier

        path = find_model(name).checkpoint("reranking")
        self.model = anatomy.load(path)
        if not isinstance(self.model, SequenceClassifier) or self.model.config.n_labels != 1:
            raise InputError(f"--rerank-model {name}: a cross-encoder is a sequence classifier of one label "
                             f"(HF BertForSequenceClassification, num_labels=1), got {type(self.model).__name__}")
        self.tokenizer = anatomy.load_tokenizer(path)
        self.activation = _default_activation(path)
        self.context = self.model.config.max_seq_len

    def scores(self, pairs: list[tuple[str, str]], instruction: str | None = None, *,
               param: str = "documents") -> tuple[Tensor, int]:
        """(logits [N], tokens read) of (query, document) pairs."""
        if instruction is not None:
            raise RequestError("instruction is for a decoder reranker (--rerank-model self)", param="instruction")
        encodings = self.tokenizer.backend.encode_batch(pairs)
        for i, e in enumerate(encodings):
            if len(e.ids) > self.context:
                raise RequestError(f"{param} {i}: the pair has {len(e.ids):,} tokens, more than the model's "
                                   f"{self.context:,}", param=param)
        out = torch.empty(len(pairs))
        for start in range(0, len(pairs), BATCH):
            chunk = encodings[start:start + BATCH]
            ids, mask = pad_right([e.ids for e in chunk], pad_id=self.tokenizer.pad_id or 0)
            segments, _ = pad_right([e.type_ids for e in chunk], pad_id=0)
            with torch.inference_mode():
                out[start:start + len(chunk)] = self.model(ids, mask, segments)[:, 0].float()
        return out, sum(len(e.ids) for e in encodings)


def _default_activation(path: Path) -> bool:
    """Sigmoid unless config.json names Identity (sentence_transformers.activation_fn, or the older
    sbert_ce_default_activation_function), as vLLM reads it."""
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    named = (config.get("sentence_transformers") or {}).get("activation_fn") or \
        config.get("sbert_ce_default_activation_function")
    if named is None:
        return True
    short = str(named).rsplit(".", 1)[-1]
    if short not in ACTIVATIONS:
        raise CheckpointError(f"{path / 'config.json'}: activation {named!r} is not one of "
                              f"{', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[short]


class YesNoReranker:
    """The served decoder scoring a pair by its answer's first token: "yes" against "no"."""

    activation = True

    def __init__(self, engine: Any, tokenizer: Any, *, instruction: str = INSTRUCTION,
                 tokens: tuple[str, str] = ("yes", "no")) -> None:
        self.passes = DecoderPasses(engine, tokenizer)
        self.tokenizer, self.instruction = tokenizer, instruction
        ids = [tokenizer.token_to_id(t) for t in tokens]
        if None in ids:
            missing = tokens[ids.index(None)]
            raise InputError(f"--rerank-tokens: {missing!r} is not one token of the served model's vocabulary")
        self.yes, self.no = ids
        self.prefix = tokenizer.encode(SYSTEM, add_special_tokens=False)
        self.suffix = tokenizer.encode(ANSWER, add_special_tokens=False)

    def prompt(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        """Qwen3-Reranker's input: its prefix, the pair's text (tokenized alone), its suffix."""
        text = PAIR.format(instruction=instruction or self.instruction, query=query, document=document)
        return self.prefix + self.tokenizer.encode(text) + self.suffix

    def scores(self, pairs: list[tuple[str, str]], instruction: str | None = None, *,
               param: str = "documents") -> tuple[Tensor, int]:
        """(logit("yes") - logit("no") [N], tokens read) of (query, document) pairs."""
        batch = [self.prompt(q, d, instruction) for q, d in pairs]
        self.passes.check(batch, param=param)
        logits = self.passes.last_logits(batch)  # [N, V]
        return logits[:, self.yes] - logits[:, self.no], sum(map(len, batch))
