"""What a generation call returns for each prompt."""

from __future__ import annotations

from dataclasses import dataclass

from anatomy.inference.speculative.stats import SpeculativeStats


@dataclass
class GenerationResult:
    """One prompt's continuation. `token_ids` are the new tokens (an ending EOS/stop id excluded);
    finish_reason is "stop" (EOS, a stop id or a stop string) or "length" (max_new_tokens).
    The timings follow anatomy.inference.metrics: TTFT, time per output token, decode tokens/s;
    `speculative` has what speculative decoding did (the whole batch's), None without it."""

    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    tokens_per_s: float = 0.0
    speculative: SpeculativeStats | None = None
