"""How well a model predicts a text: the mean negative log-likelihood of each token given the
ones before it, from one causal forward. Comparing two ways of running the same weights (fp32
against the engine's planned kernels, say) on the same text tells what the faster one costs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anatomy.inference.engine import DecoderEngine

CHUNK = 256  # rows of the LM head at a time: [S, V] logits of a long text would be large


@torch.inference_mode()
def mean_nll(runner: DecoderEngine | nn.Module, ids: list[int]) -> float:
    """Mean of -log p(token_i | tokens_<i) over i = 1..n-1, in nats, through an engine (its planned
    kernels: what it costs) or a DecoderLM (its reference forward); the logits come from the model's
    one LM head, soft cap included."""
    x = torch.tensor([ids])  # [1, n]
    if isinstance(runner, DecoderEngine):
        hidden, head = runner.hidden_states(x)[0, :-1], runner.head  # [n-1, D]: position i predicts token i + 1
    else:
        hidden, head = runner.stack(x)[0, :-1], runner.logits
    targets = x[0, 1:]
    total = 0.0
    for start in range(0, len(targets), CHUNK):
        logits = head(hidden[start:start + CHUNK]).float()  # [c, V]
        total += F.cross_entropy(logits, targets[start:start + CHUNK], reduction="sum").item()
    return total / len(targets)


@torch.inference_mode()
def cached_nll(engine: DecoderEngine, ids: list[int], *, chunk: int = 64) -> float:
    """The same mean NLL, with every token's keys and values going through the engine's KV cache
    first: the text is fed in spans of `chunk` tokens (run.verify), each attending over the cache as
    it holds the tokens before (its kv_dtype's precision: what an 8-bit cache costs)."""
    from anatomy.inference.sampling import SamplingParams

    run = engine.start([ids[:1]], SamplingParams(max_new_tokens=len(ids) - 1))
    logits = [run.prefill()[:, None]]  # [1, 1, V]
    for start in range(1, len(ids) - 1, chunk):
        logits.append(run.verify(torch.tensor([ids[start:min(start + chunk, len(ids) - 1)]])))
    logprobs = torch.cat(logits, dim=1)[0].float().log_softmax(dim=-1)  # [n-1, V]
    targets = torch.tensor(ids[1:])
    return float(-logprobs[torch.arange(len(targets)), targets].mean())