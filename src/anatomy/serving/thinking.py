"""A sequence's thinking block as the serving loop sees it, token by token, and its budget (llama-server's
--reasoning-budget).

Each output token's text (before stop strings are applied) goes through a reasoning.ThinkSplitter of
the sequence's own. A token sampled while the block is open counts against the budget; once `budget`
of them are in and the block is still open, `due()` gives the ids that close it ("\\n</think>\\n\\n", or
the rest of a closing tag the model had begun), which the loop appends as if sampled, so the next
step feeds them to the model and the answer follows: no more than `budget` tokens are ever
generated inside the block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from anatomy.serving.reasoning import CLOSE, ThinkSplitter, prompt_opens

AFTER = "\n\n"  # what follows the closing tag
CLOSING = f"\n{CLOSE}{AFTER}"  # what a forced close writes (llama-server's and Qwen3's own spacing)
PROMPT_TAIL = 8  # prompt tokens decoded to see whether the template opened the block


@dataclass(frozen=True)
class Thinking:
    """One request's thinking: whether its prompt opened the block, its budget in tokens (None: no
    limit), and the ids that close it."""

    opened: bool
    budget: int | None
    close: tuple[int, ...]


def thinking_for(tokenizer: Any, prompt: list[int], budget: int | None) -> Thinking:
    """The Thinking of a chat prompt (its ids) with `budget`."""
    opened = prompt_opens(tokenizer.decode(prompt[-PROMPT_TAIL:]))
    return Thinking(opened, budget, tuple(tokenizer.encode(CLOSING, add_special_tokens=False)))


class ThinkingState:
    """One sequence's position in its thinking block; `decoder` turns its token ids into text
    (an incremental decoder: push(id) -> text), `encode` text into ids (to finish a begun closing tag)."""

    def __init__(self, thinking: Thinking, decoder: Any, encode: Callable[[str], list[int]] | None = None) -> None:
        self.budget, self.close = thinking.budget, thinking.close
        self.splitter = ThinkSplitter(opened=thinking.opened)
        self.decoder, self.encode = decoder, encode
        self.spent = 0  # tokens generated inside the block
        self.closed = False  # the close was forced: nothing more is counted or forced

    def observe(self, token: int) -> bool:
        """Take the next token of the output; whether it was generated inside the block."""
        inside = self.splitter.thinking and not self.closed
        self.splitter.push(self.decoder.push(token))
        self.spent += inside
        return inside

    def due(self) -> tuple[int, ...]:
        """The ids to append now: the close, once the budget is spent in an open block; else (). A closing
        tag the model has begun (held back by the splitter) is finished rather than written again."""
        if self.budget is None or self.closed or not self.splitter.thinking or self.spent < self.budget:
            return ()
        self.closed = True
        begun = self.splitter.buffer
        if begun and self.encode is not None:
            return tuple(self.encode(CLOSE[len(begun):] + AFTER))
        return self.close
