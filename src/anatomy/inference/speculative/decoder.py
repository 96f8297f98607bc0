"""Offline speculative generation: a client of the serving loop, as vLLM's `LLM.generate` is of its engine core.

The prompts become sequences of an in-process `ServingLoop` (stepped here, no thread) that speculates with
the rounds of rounds.py, each sequence under its own policy (AdaptiveK, or FixedK(k)); tokens are yielded
one position at a time as [B] tensors, like DecoderEngine.tokens. Each row speculates on its own, so its
output is exactly (greedy) or in distribution (sampling) what it would be alone.
Details: docs/speculative.md, "How it works".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import torch
from torch import Tensor

from anatomy.inference.engine import DecoderEngine, PagedKVCache
from anatomy.inference.sampling import SamplingParams
from anatomy.inference.speculative.draft import DraftProposer
from anatomy.inference.speculative.policy import AdaptiveK, FixedK
from anatomy.inference.speculative.proposal import Proposer
from anatomy.inference.speculative.rounds import ServedSpeculation
from anatomy.inference.speculative.stats import SpeculativeStats

BLOCK = 16  # tokens per KV block of the loop's cache, as a Run's
SPAN = 256  # a row's room is rounded up to this many tokens


class SpeculativeDecoder:
    """`for tokens in SpeculativeDecoder(engine, proposer, k=5).tokens(prompts, params)` yields [B]
    token tensors, as DecoderEngine.tokens does; `stats` counts what speculation did, `loop` is the
    latest generation's serving loop."""

    def __init__(self, engine: DecoderEngine, proposer: Proposer, *, k: int, adaptive: bool = True,
                 policy: Callable[[], AdaptiveK | FixedK] | None = None) -> None:
        """`policy` makes each sequence's policy (default: AdaptiveK, or FixedK(k) if not adaptive)."""
        self.engine, self.proposer, self.k = engine, proposer, k
        self.make_policy = policy or ((lambda: AdaptiveK(k, free=proposer.free)) if adaptive else (lambda: FixedK(k)))
        self.stats = SpeculativeStats(proposer.name, k)
        self.loop = None

    def tokens(self, prompts: list[list[int]], params: SamplingParams) -> Iterator[Tensor]:
        loop = self.loop = self._loop(prompts, params)
        outputs: list[list[int]] = [[] for _ in prompts]
        seeds = row_seeds(params.seed, len(prompts))
        seqs = [loop.submit(prompt, _row_params(params, seeds, i), lambda event, out=out: out.append(event.token))
                for i, (prompt, out) in enumerate(zip(prompts, outputs))]
        yielded = 0
        try:
            while yielded < params.max_new_tokens and loop.step():
                self._count(seqs, outputs)
                for j in range(yielded, min(map(len, outputs))):
                    yield torch.tensor([out[j] for out in outputs], device=self.engine.device)
                yielded = min(map(len, outputs))
        finally:  # also when the caller stops asking: the next generation of this shape replays its steps
            loop.release()

    def _loop(self, prompts: list[list[int]], params: SamplingParams):
        """A loop with room for every prompt, its new tokens and a round's k + 1, prefilled in one step."""
        from anatomy.serving.loop import ServingLoop  # serving imports this package: imported when a generation runs

        config, k = self.engine.config, self.k
        tokens = max(map(len, prompts)) + params.max_new_tokens + k + 1
        table = -(-tokens // SPAN) * SPAN // BLOCK  # few shapes: the engine lends a cache per shape
        blocks = table + 1  # (a block to spare: the scheduler reserves a verified row's blocks ahead)
        kv_bytes = len(prompts) * blocks * PagedKVCache.block_bytes(config, BLOCK, self.engine.kv_dtype)
        draft = isinstance(self.proposer, DraftProposer)
        speculation = ServedSpeculation(
            method="draft" if draft else "ngram", num_speculative_tokens=k,
            draft=self.proposer.engine if draft else None, policy=lambda _: self.make_policy(),
            guesser=None if draft else self.proposer.guesser)
        return ServingLoop(self.engine, kv_bytes=kv_bytes, block_size=BLOCK, max_seqs=len(prompts),
                           max_step_tokens=sum(map(len, prompts)) + len(prompts) * (k + 1), prefix_caching=False,
                           speculation=speculation, read_blocks=table)

    def _count(self, seqs: list, outputs: list[list[int]]) -> None:
        """The stats so far: the sequences' rounds summed, the loop's forwards after the prefill's."""
        loop, states = self.loop, [seq.speculation for seq in seqs]
        stats = self.stats = SpeculativeStats(self.proposer.name, self.k)
        stats.proposed = sum(s.proposed for s in states)
        stats.accepted = sum(s.accepted for s in states)
        stats.rejections = sum(s.rejections for s in states)
        stats.verifications = loop.verifications
        stats.target_forwards = loop.steps - 1
        stats.draft_forwards = loop.drafter.forwards if loop.drafter is not None else 0
        stats.tokens = round(sum(max(len(out) - 1, 0) for out in outputs) / len(outputs))


def _row_params(params: SamplingParams, seeds: list[int] | None, row: int) -> SamplingParams:
    """Row `row`'s parameters in the loop: every token to max_new_tokens (the caller stops rows on EOS,
    stop ids and stop strings, as for plain generation), its own random stream."""
    return replace(params, ignore_eos=True, stop=(), stop_ids=(), seed=seeds[row] if seeds else None)


def row_seeds(seed: int | None, rows: int) -> list[int] | None:
    """Each row's seed, drawn from `seed` (rows of one seed must not share a stream, nor calls of
    neighbouring seeds: seed + row would repeat one call's rows in the next)."""
    if seed is None:
        return None
    return torch.randint(2 ** 62, (rows,), generator=torch.Generator().manual_seed(int(seed))).tolist()
