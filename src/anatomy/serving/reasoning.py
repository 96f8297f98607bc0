"""Reasoning: a chat answer's `<think>...</think>` block read out of its text, as vLLM's reasoning parsers
(deepseek_r1, qwen3) read it: the text inside goes to `reasoning_content`, the rest to `content`.

The block opens with `<think>` at the start of the output (whitespace before it dropped), or in the
prompt (a template that ends with `<think>`: DeepSeek-R1, Qwen3's thinking models); it ends at
`</think>`, or with the output (cut short while thinking: all of it is reasoning). An output that
starts otherwise never thinks. Text that may still turn out to be part of a tag is held back, so the
streamed pieces join to what the whole text gives (tools.ToolStream and text/stops.py do the same).
"""

from __future__ import annotations

from anatomy.serving.tools import partial_marker

OPEN, CLOSE = "<think>", "</think>"
PARSERS = ("deepseek_r1", "qwen3", "think")  # --reasoning-parser names: all read the <think> convention


def prompt_opens(prompt: str) -> bool:
    """Whether the prompt text ends inside a thinking block (the template opened it)."""
    return prompt.rstrip().endswith(OPEN)


class ThinkSplitter:
    """push(text) -> (reasoning, content) safe to show now; finish() -> what was held back.
    `thought`: whether the output has a thinking block at all."""

    def __init__(self, *, opened: bool) -> None:
        self.state = "thinking" if opened else "start"  # start -> thinking -> answer, or start -> answer
        self.thought = opened
        self.buffer = ""  # text held back

    @property
    def thinking(self) -> bool:
        return self.state == "thinking"

    def push(self, text: str) -> tuple[str, str]:
        self.buffer += text
        if self.state == "start":
            self._start()
        if self.state == "thinking":
            return self._think()
        if self.state == "answer":
            text, self.buffer = self.buffer, ""
            return "", text
        return "", ""

    def finish(self) -> tuple[str, str]:
        text, self.buffer = self.buffer, ""
        return (text, "") if self.state == "thinking" else ("", text)

    def _start(self) -> None:
        """Decide, once the output's first characters show it, whether it opens a block."""
        head = self.buffer.lstrip()
        if head.startswith(OPEN):
            self.state, self.thought, self.buffer = "thinking", True, head[len(OPEN):]
        elif head and not OPEN.startswith(head):
            self.state = "answer"

    def _think(self) -> tuple[str, str]:
        end = self.buffer.find(CLOSE)
        if end >= 0:
            reasoning, content = self.buffer[:end], self.buffer[end + len(CLOSE):]
            self.state, self.buffer = "answer", ""
            return reasoning, content
        keep = partial_marker(self.buffer, CLOSE)
        reasoning, self.buffer = self.buffer[:len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
        return reasoning, ""


def read(splitter: ThinkSplitter, text: str, *, last: bool) -> tuple[str, str]:
    """(reasoning, content) of one event's text; at the `last` event, all that was held back too."""
    reasoning, content = splitter.push(text)
    if last:
        more = splitter.finish()
        reasoning, content = reasoning + more[0], content + more[1]
    return reasoning, content


def split(text: str, *, opened: bool) -> tuple[str | None, str]:
    """A whole output -> (its reasoning, None if it never thinks; its content)."""
    splitter = ThinkSplitter(opened=opened)
    reasoning, content = read(splitter, text, last=True)
    return (reasoning if splitter.thought else None), content
