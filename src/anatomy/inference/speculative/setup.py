"""generate()'s speculative options, checked once, as a Speculation.

    anatomy.generate(model, prompt, speculative="ngram", num_speculative_tokens=5)
    anatomy.generate(model, prompt, speculative="draft", draft_model="<small model>")
    anatomy.generate(model, prompt, speculative=Speculation(method="ngram", adaptive=False, ngram=(2, 4)))

Bad input is an InputError naming the value and the rule: an unknown method, k < 1 or not below
the context, a draft for "ngram" or none for "draft", a model that is not decoder-only, a draft
whose vocabulary differs from the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from anatomy.config import ModelConfig
from anatomy.deprecation import deprecated
from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine, engine_for
from anatomy.inference.loading import load_named
from anatomy.inference.speculative.decoder import SpeculativeDecoder
from anatomy.inference.speculative.draft import DraftProposer
from anatomy.inference.speculative.ngram import NgramProposer

METHODS = ("ngram", "draft")
DEFAULT_K = 5


@dataclass(frozen=True, kw_only=True)
class Speculation:
    """How to speculate: `method` "ngram" (prompt lookup, n-grams of ngram = (min_n, max_n) tokens)
    or "draft" (the `draft` engine's model); at most `num_speculative_tokens` per round; `adaptive`
    lets the policy shrink k and fall back to plain steps (False: always k)."""

    method: str
    num_speculative_tokens: int = DEFAULT_K
    draft: DecoderEngine | None = None
    adaptive: bool = True
    ngram: tuple[int, int] = (1, 3)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError(f"speculative={self.method!r} is not one of {', '.join(map(repr, METHODS))}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"num_speculative_tokens={k!r} must be an integer >= 1")
        if self.method == "draft" and self.draft is None:
            raise InputError("speculative='draft' needs a draft_model (a model, an engine or a model name)")
        if self.method == "ngram" and self.draft is not None:
            raise InputError("a draft_model is for speculative='draft'; 'ngram' proposes from the text itself")
        NgramProposer(min_n=self.ngram[0], max_n=self.ngram[1])  # checks the sizes

    def decoder(self, engine: DecoderEngine) -> SpeculativeDecoder:
        """A decoder for one generation with `engine` as the target."""
        if self.method == "draft":
            proposer = DraftProposer(self.draft)
        else:
            proposer = NgramProposer(min_n=self.ngram[0], max_n=self.ngram[1])
        return SpeculativeDecoder(engine, proposer, k=self.num_speculative_tokens, adaptive=self.adaptive)

    def check_sampling(self, presence_penalty: float, frequency_penalty: float) -> None:
        """Deprecated: every penalty applies along the proposals now (acceptance.verify); nothing to check."""
        deprecated("Speculation.check_sampling is deprecated: speculation applies every penalty")

    def check(self, target: ModelConfig, *, prompt_len: int = 0, max_new_tokens: int = 0) -> None:
        """The target and draft can do this: both decoder-only, k below the context, one vocabulary,
        the generation within the draft's context too."""
        decoder_only(target, "the target")
        k = self.num_speculative_tokens
        if k >= target.max_seq_len:
            raise InputError(f"num_speculative_tokens={k} is beyond the model's context of {target.max_seq_len} "
                             "tokens (max_seq_len): a round verifies k + 1 tokens")
        if self.draft is None:
            return
        draft = self.draft.model.config
        decoder_only(draft, "the draft")
        if draft.vocab_size != target.vocab_size:
            raise InputError(f"the draft model's vocabulary ({draft.vocab_size} tokens) differs from the target's "
                             f"({target.vocab_size}): speculative decoding needs one tokenizer for both")
        if prompt_len + max_new_tokens > draft.max_seq_len:
            raise InputError(f"the draft model's context of {draft.max_seq_len} tokens (max_seq_len) is shorter "
                             f"than the {prompt_len}-token prompt + {max_new_tokens} new tokens")


def speculation_of(speculative: Any = None, *, draft_model: Any = None, num_speculative_tokens: int | None = None,
                   tokenizer: Any = None) -> Speculation | None:
    """generate()'s three options -> a Speculation (None: no speculation). A draft given by name is
    loaded once (anatomy.loaded_models); its tokenizer must have the target's vocabulary."""
    if speculative is None:
        if draft_model is not None or num_speculative_tokens is not None:
            raise InputError("draft_model and num_speculative_tokens need speculative='ngram' or 'draft'")
        return None
    if isinstance(speculative, Speculation):
        if draft_model is not None or num_speculative_tokens is not None:
            raise InputError("give draft_model and num_speculative_tokens inside the Speculation, not next to it")
        return speculative
    if speculative not in METHODS:
        raise InputError(f"speculative={speculative!r} is not one of {', '.join(map(repr, METHODS))}")
    draft = draft_engine(draft_model, tokenizer) if draft_model is not None else None
    k = DEFAULT_K if num_speculative_tokens is None else num_speculative_tokens
    return Speculation(method=speculative, num_speculative_tokens=k, draft=draft)


def draft_engine(draft: Any, tokenizer: Any = None) -> DecoderEngine:
    """An engine of a draft given as an engine, a model or a name / .gguf path / HF directory."""
    if isinstance(draft, DecoderEngine):
        return draft
    if isinstance(draft, (str, Path)):
        named = load_named(str(draft))
        if tokenizer is not None and named.tokenizer is not None and not same_vocabulary(tokenizer, named.tokenizer):
            raise InputError(f"the draft model {str(draft)!r} has another tokenizer vocabulary than the target's: "
                             "speculative decoding needs one tokenizer for both")
        decoder_only(named.model.config, f"the draft {str(draft)!r}")
        return engine_for(named.model)
    if not isinstance(draft, nn.Module) or not hasattr(draft, "config"):
        raise InputError(f"draft_model must be an anatomy model, a DecoderEngine or a model name/path, "
                         f"got {type(draft).__name__}")
    decoder_only(draft.config, "the draft")
    return engine_for(draft)


def same_vocabulary(a: Any, b: Any) -> bool:
    """Do two tokenizers map the same tokens to the same ids?"""
    return a.backend.get_vocab(with_added_tokens=True) == b.backend.get_vocab(with_added_tokens=True)


def decoder_only(config: ModelConfig, what: str) -> None:
    if not config.is_decoder:
        raise InputError(f"speculative decoding needs decoder-only models; {what} has architecture="
                         f"{config.architecture!r}")
