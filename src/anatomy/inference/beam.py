"""Sequence-to-sequence decoding for EncoderDecoder: greedy (or sampled) and beam search.

The source is encoded, and each layer's cross-attention keys and values projected, once (the
engine's Seq2SeqRun). Beam search keeps the K best partial targets by summed log-probability; an
ended target (EOS among the K best of its step) scores sum(log p) / len ** length_penalty, and the
search stops once K have ended and no running beam beats the worst of them (HF's heuristic), or at
max_new_tokens. TTFT follows inference/metrics.py: greedy's first token comes after the encoder and
one step; beam search knows none before it ends. docs/inference.md has the options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from anatomy.errors import InputError
from anatomy.inference.engine import Seq2SeqEngine
from anatomy.inference.metrics import StepClock
from anatomy.inference.result import GenerationResult
from anatomy.inference.sampling import SamplingParams, make_generator, next_tokens


@dataclass
class _Hypothesis:
    ids: list[int]
    score: float
    ended: bool


def seq2seq_generate(engine: Seq2SeqEngine, sources: list[list[int]], params: SamplingParams, *,
                     eos_ids: frozenset[int], num_beams: int = 1, length_penalty: float = 1.0,
                     decode: Callable[[list[int]], str] = lambda ids: "") -> list:
    """One GenerationResult per source: beam search when num_beams > 1, else greedy / sampled."""
    if not isinstance(num_beams, int) or num_beams < 1:
        raise InputError(f"num_beams={num_beams!r} must be an integer >= 1")
    results = []
    for source in sources:
        clock = StepClock()
        clock.start()
        if num_beams == 1:
            hyp = greedy_search(engine, source, params, eos_ids=eos_ids, clock=clock)
            ttft = clock.ttft_s
        else:
            hyp = beam_search(engine, source, params, eos_ids=eos_ids, num_beams=num_beams,
                              length_penalty=length_penalty, clock=clock)
            ttft = clock.ttft_s + clock.decode_s  # no token is known before the search ends
        results.append(GenerationResult(text=decode(hyp.ids), token_ids=hyp.ids, prompt_tokens=len(source),
                                        finish_reason="stop" if hyp.ended else "length", ttft_s=ttft,
                                        tpot_s=clock.tpot_s, tokens_per_s=clock.tokens_per_s))
    return results


@torch.inference_mode()
def greedy_search(engine: Seq2SeqEngine, source: list[int], params: SamplingParams, *,
                  eos_ids: frozenset[int], clock: StepClock | None = None) -> _Hypothesis:
    """The most likely next token at each step (or a sampled one when params.temperature > 0)."""
    dec = engine.start(source, rows=1, max_new_tokens=params.max_new_tokens)
    generator = make_generator(params.seed, engine.device)
    token = torch.tensor([dec.start_id], device=engine.device)
    ids, score = [], 0.0
    for slot in range(params.max_new_tokens):
        logprobs = dec.step(token, slot)  # [1, V]
        token = next_tokens(logprobs, params, generator=generator)  # [1]
        if clock is not None:
            clock.tick()
        score += float(logprobs[0, token[0]])
        if int(token) in eos_ids:
            return _Hypothesis(ids, score, ended=True)
        ids.append(int(token))
    return _Hypothesis(ids, score, ended=False)


@torch.inference_mode()
def beam_search(engine: Seq2SeqEngine, source: list[int], params: SamplingParams, *, eos_ids: frozenset[int],
                num_beams: int, length_penalty: float = 1.0, clock: StepClock | None = None) -> _Hypothesis:
    K = num_beams
    dec = engine.start(source, rows=K, max_new_tokens=params.max_new_tokens)
    device = engine.device
    tokens = torch.full((K,), dec.start_id, dtype=torch.long, device=device)
    scores = torch.full((K,), float("-inf"), device=device)
    scores[0] = 0.0  # all beams start identical: expand only the first at step one
    beams: list[list[int]] = [[] for _ in range(K)]
    ended: list[_Hypothesis] = []
    for slot in range(params.max_new_tokens):
        candidates = (scores[:, None] + dec.step(tokens, slot)).flatten()  # [K * V]
        top_scores, top = candidates.topk(2 * K)
        parents, next_beams, next_tokens_, next_scores = [], [], [], []
        for rank, (score, index) in enumerate(zip(top_scores.tolist(), top.tolist())):
            parent, token = divmod(index, candidates.numel() // K)
            if token in eos_ids:
                if rank < K:  # an ending counts only if it would have been one of the K beams
                    n = len(beams[parent]) + 1
                    ended.append(_Hypothesis(beams[parent], score / n ** length_penalty, ended=True))
                continue
            parents.append(parent)
            next_beams.append(beams[parent] + [token])
            next_tokens_.append(token)
            next_scores.append(score)
            if len(next_beams) == K:
                break
        ended = sorted(ended, key=lambda h: h.score, reverse=True)[:K]
        if clock is not None:
            clock.tick()
        if len(ended) == K and max(next_scores) / (slot + 1) ** length_penalty <= ended[-1].score:
            break  # no running beam is expected to beat the K ended ones any more
        rows = torch.tensor(parents, device=device)
        dec.reorder(rows)
        beams, tokens = next_beams, torch.tensor(next_tokens_, device=device)
        scores = torch.tensor(next_scores, device=device)
    else:  # max_new_tokens reached: the unfinished beams compete with the ended ones
        ended += [_Hypothesis(b, s / max(len(b), 1) ** length_penalty, ended=False)
                 for b, s in zip(beams, scores.tolist())]
    return max(ended, key=lambda h: h.score)
