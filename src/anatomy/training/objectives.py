"""What a model learns from, by family (docs/training.md, "What it does"):

- causal LM (decoder): predict token t+1 from tokens <= t on windows of the token stream (plus the
  routers' load-balancing loss of a mixture-of-experts model, while training);
- masked LM (encoder): BERT's 15% of the non-special tokens, 80/10/10; loss on those positions only;
- seq2seq (encoder-decoder): teacher forcing, [start] + target -> target + [eos]; padding ignored.

Each objective's `draw` picks the random choices of a whole global batch at once, `batch` turns a
slice of rows into tensors and `loss` returns (sum of token losses, number of target tokens).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.layers.moe import load_balancing_loss
from anatomy.training.data import Dataset, PairSplit, TokenSplit
from anatomy.text.tokenizer import Tokenizer

IGNORE = -100
OBJECTIVES = ("auto", "clm", "mlm", "seq2seq")
Draws = dict[str, np.ndarray]


class Objective(Protocol):
    """`draw` picks the random choices of a whole global batch at once, so any split of its rows over
    ranks and micro-steps sees the same choices."""

    name: str

    def draw(self, rng: np.random.Generator, rows: int, split: TokenSplit | PairSplit) -> Draws: ...

    def batch(self, split: TokenSplit | PairSplit, draws: Draws) -> dict[str, Tensor]: ...

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0
             ) -> tuple[Tensor, Tensor]: ...


def token_loss(logits: Tensor, labels: Tensor, *, label_smoothing: float = 0.0) -> tuple[Tensor, Tensor]:
    """Summed cross-entropy over the positions whose label is not IGNORE, and their count."""
    total = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE,
                            reduction="sum", label_smoothing=label_smoothing)  # [B*S, V] -> scalar
    return total, (labels != IGNORE).sum()


def _windows(split: TokenSplit, starts: np.ndarray, length: int) -> np.ndarray:
    return np.stack([np.asarray(split.tokens[s:s + length], dtype=np.int64) for s in starts])  # [B, length]


class CausalLM:
    """Predict token t+1 from tokens <= t. A model with mixture-of-experts layers adds, while training,
    router_aux_loss_coef x the load-balancing loss of its routers (Switch / Mixtral), per target token
    so that the mean loss gains coef x aux."""

    name = "clm"

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len

    def draw(self, rng: np.random.Generator, rows: int, split: TokenSplit) -> Draws:
        return {"start": rng.integers(0, len(split) - self.seq_len, size=rows)}

    def batch(self, split: TokenSplit, draws: Draws) -> dict[str, Tensor]:
        w = torch.from_numpy(_windows(split, draws["start"], self.seq_len + 1))  # [B, T+1]
        return {"input_ids": w[:, :-1], "labels": w[:, 1:]}  # [B, T] each

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0
             ) -> tuple[Tensor, Tensor]:
        config = getattr(model, "module", model).config  # DDP wraps the model in .module
        if not (model.training and config.n_experts and config.router_aux_loss_coef):
            return token_loss(model(batch["input_ids"]), batch["labels"], label_smoothing=label_smoothing)
        router_logits: list[Tensor] = []
        logits = model(batch["input_ids"], router_logits=router_logits)
        total, count = token_loss(logits, batch["labels"], label_smoothing=label_smoothing)
        aux = load_balancing_loss(router_logits, config.n_experts, config.n_experts_per_token)
        return total + config.router_aux_loss_coef * aux * count, count


def mask_tokens(ids: np.ndarray, *, select: np.ndarray, action: np.ndarray, replacement: np.ndarray,
                mask_id: int, special_ids: np.ndarray, prob: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masking of ids [B, S] from uniform draws select/action [B, S] and replacement ids.

    Returns (inputs, labels): labels hold the original id where chosen, IGNORE elsewhere.
    """
    chosen = (select < prob) & ~np.isin(ids, special_ids)
    inputs = ids.copy()
    inputs[chosen & (action < 0.8)] = mask_id
    randomized = chosen & (action >= 0.8) & (action < 0.9)
    inputs[randomized] = replacement[randomized]
    return inputs, np.where(chosen, ids, IGNORE)


class MaskedLM:
    name = "mlm"

    def __init__(self, seq_len: int, tok: Tokenizer, prob: float = 0.15) -> None:
        if tok.mask_id is None:
            raise InputError(f"the tokenizer {tok.source!r} has no mask token ([MASK] or <mask>): MLM needs one")
        self.seq_len, self.prob, self.mask_id = seq_len, prob, tok.mask_id
        self.special = np.asarray(tok.special_ids, dtype=np.int64)
        self.ordinary = np.setdiff1d(np.arange(tok.vocab_size), self.special)  # random replacements

    def draw(self, rng: np.random.Generator, rows: int, split: TokenSplit) -> Draws:
        shape = (rows, self.seq_len)
        return {"start": rng.integers(0, len(split) - self.seq_len + 1, size=rows),
                "select": rng.random(shape), "action": rng.random(shape),
                "replacement": self.ordinary[rng.integers(0, len(self.ordinary), size=shape)]}

    def batch(self, split: TokenSplit, draws: Draws) -> dict[str, Tensor]:
        ids = _windows(split, draws["start"], self.seq_len)  # [B, T]
        inputs, labels = mask_tokens(ids, select=draws["select"], action=draws["action"],
                                     replacement=draws["replacement"], mask_id=self.mask_id,
                                     special_ids=self.special, prob=self.prob)
        return {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0
             ) -> tuple[Tensor, Tensor]:
        return token_loss(model(batch["input_ids"]), batch["labels"], label_smoothing=label_smoothing)


class Seq2Seq:
    name = "seq2seq"

    def __init__(self, seq_len: int, *, pad_id: int, start_id: int, eos_id: int) -> None:
        self.seq_len, self.pad_id, self.start_id, self.eos_id = seq_len, pad_id, start_id, eos_id

    def draw(self, rng: np.random.Generator, rows: int, split: PairSplit) -> Draws:
        return {"pair": rng.integers(0, len(split), size=rows)}

    def batch(self, split: PairSplit, draws: Draws) -> dict[str, Tensor]:
        pairs = [split.pair(int(i)) for i in draws["pair"]]
        return self.collate([(s, t) for s, t in pairs])

    def collate(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Tensor]:
        """Pad a list of (source ids, target ids) to the longest of the batch (at most seq_len)."""
        T = self.seq_len
        src = [np.asarray(s[:T], dtype=np.int64) for s, _ in pairs]
        tgt = [np.asarray(t[:T - 1], dtype=np.int64) for _, t in pairs]
        S_src, S_tgt = max(max(map(len, src)), 1), max(map(len, tgt)) + 1
        src_ids = np.full((len(pairs), S_src), self.pad_id, dtype=np.int64)  # [B, S_src]
        tgt_in = np.full((len(pairs), S_tgt), self.pad_id, dtype=np.int64)  # [B, S_tgt]
        labels = np.full((len(pairs), S_tgt), IGNORE, dtype=np.int64)
        for row, (s, t) in enumerate(zip(src, tgt)):
            src_ids[row, :len(s)] = s
            tgt_in[row, :len(t) + 1] = [self.start_id, *t]
            labels[row, :len(t) + 1] = [*t, self.eos_id]
        lengths = np.array([len(s) for s in src])
        src_mask = np.arange(S_src)[None, :] < lengths[:, None]  # [B, S_src]
        return {"src_ids": torch.from_numpy(src_ids), "src_mask": torch.from_numpy(src_mask),
                "tgt_ids": torch.from_numpy(tgt_in), "labels": torch.from_numpy(labels)}

    def loss(self, model: nn.Module, batch: dict[str, Tensor], *, label_smoothing: float = 0.0
             ) -> tuple[Tensor, Tensor]:
        logits = model(batch["src_ids"], batch["tgt_ids"], batch["src_mask"])  # [B, S_tgt, V]
        return token_loss(logits, batch["labels"], label_smoothing=label_smoothing)


def make_objective(name: str, *, config: ModelConfig, data: Dataset, seq_len: int) -> Objective:
    """The objective a model family calls for ("auto"), or the named one if it fits model and data."""
    family = {"decoder": "clm", "encoder": "mlm", "encoder-decoder": "seq2seq"}[config.architecture]
    chosen = family if name == "auto" else name
    if chosen not in OBJECTIVES[1:]:
        raise InputError(f"--objective {name!r} is not one of {', '.join(OBJECTIVES)}")
    if chosen != family:
        raise InputError(f"--objective {chosen} does not fit a model with architecture={config.architecture!r} "
                         f"(it trains with {family})")
    wants_pairs = chosen == "seq2seq"
    if wants_pairs != (data.kind == "pairs"):
        raise InputError("seq2seq trains on a .tsv of source<TAB>target lines" if wants_pairs else
                         f"--objective {chosen} trains on plain text, not on a .tsv of pairs")
    if chosen == "clm":
        return CausalLM(seq_len)
    if chosen == "mlm":
        return MaskedLM(seq_len, data.tokenizer)
    tok = data.tokenizer
    pad = config.pad_token_id if config.pad_token_id is not None else tok.pad_id
    start = config.decoder_start_token_id if config.decoder_start_token_id is not None else tok.bos_id
    eos = config.eos_token_id if config.eos_token_id is not None else tok.eos_id
    if None in (pad, start, eos):
        raise InputError(f"seq2seq needs pad, start and eos token ids; the tokenizer {tok.source!r} and the "
                         f"config give pad={pad}, start={start}, eos={eos}")
    return Seq2Seq(seq_len, pad_id=pad, start_id=start, eos_id=eos)
