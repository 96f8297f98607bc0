"""Proposals from a draft model: a smaller or cheaper decoder with the target's vocabulary.

    prompts -> the draft's own prefill (its own engine's Run over its own cache)
    propose(k): the tokens the draft has not seen yet (1, or 2 after a round that kept all k) in
                one pass, then k - 1 single steps -> k tokens, and the distributions they were drawn from
    advance(emitted, n): the draft's cache holds the sequence and its first k - 1 guesses; of those
                only the n kept are still right, so its write position moves back to after them

Any decoder sharing the tokenizer works: a smaller model of the same family, the target's first
few blocks (`first_layers`: self-speculation, sharing the final norm and LM head), or the target
itself with cheaper weights (a float16 copy; an int8/int4 one).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from anatomy.errors import InputError
from anatomy.inference.engine import DecoderEngine, Run
from anatomy.inference.sampling import greedy, penalized, sampling_probs
from anatomy.inference.speculative.proposal import Proposal


class DraftProposer:
    """Proposals drawn from a draft engine's model (greedy: its argmax)."""

    name = "draft"
    free = False

    def __init__(self, engine: DecoderEngine) -> None:
        self.engine = engine
        self.forwards = 0

    def start(self, target: Run) -> None:
        batch, params = target.batch, target.params
        B, P = batch.ids.shape
        self.params, self.generator = params, target.generator
        prompts = [row[pad:] for row, pad in zip(batch.ids.tolist(), batch.padding.tolist())]
        self.run = self.engine.start(prompts, params)  # the same left padding: the same slots as the target's
        self.sequence = torch.zeros(B, P + params.max_new_tokens, dtype=torch.long, device=batch.ids.device)
        self.sequence[:, :P] = batch.ids
        self.length = P  # tokens in the sequence; the draft's cache holds the first run.slot of them
        self.run.prefill()  # the target chooses the first token: these logits are not needed
        self.forwards = 1

    def propose(self, k: int) -> Proposal:
        run = self.run
        pending = self.sequence[:, run.slot:self.length]  # [B, m]: emitted, not yet seen by the draft
        logits = run.verify(pending)[:, -1]  # [B, V]
        tokens, probs = [], []
        for i in range(k):
            if i:
                logits = run.decode(tokens[-1])
            token, q = self._draw(logits)
            tokens.append(token)
            probs.append(q)
        self.forwards += k  # the sequence and the guesses but the last are in the cache now
        return Proposal(torch.stack(tokens, dim=1), None, None if self.params.greedy else torch.stack(probs, dim=1))

    def advance(self, emitted: Tensor, accepted: int) -> None:
        self.run.rewind(min(self.run.slot, self.length + accepted))  # the guesses after the kept ones are stale
        m = emitted.shape[1]
        self.sequence[:, self.length:self.length + m] = emitted
        self.length += m

    @torch.inference_mode()
    def _draw(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        """(token [B], the distribution it was drawn from [B, V] or None for greedy). The draft uses
        the target's temperature and filters but not its repetition penalty."""
        logits = penalized(logits, self.params)
        if self.params.greedy:
            return greedy(logits), None
        q = sampling_probs(logits, self.params)
        return torch.multinomial(q, 1, generator=self.generator)[:, 0], q


def first_layers(model: nn.Module, n_layers: int) -> nn.Module:
    """Self-speculation's draft: a view of a decoder's first `n_layers` blocks with its own final
    norm and LM head (the same tensors, nothing copied; the model itself is not changed)."""
    config = model.config
    if not config.is_decoder:
        raise InputError(f"a layer-skipping draft needs a decoder model, got architecture={config.architecture!r}")
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or not 1 <= n_layers <= config.n_layers:
        raise InputError(f"draft layers={n_layers!r} must be an integer in [1, {config.n_layers}] "
                         f"(the target has {config.n_layers} blocks)")
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    draft = copy.deepcopy(model, memo=shared)
    draft.stack.blocks = nn.ModuleList(list(draft.stack.blocks)[:n_layers])
    draft.config = draft.stack.config = config.replace(n_layers=n_layers)
    return draft
