"""Where a decoder's parts live on a grid of tensor-parallel x pipeline-parallel ranks.

    rank = stage * tp + tp_rank          stage 0 holds the embeddings, the last stage the final norm and head

Each stage holds a contiguous range of blocks; each tp rank a range of query heads, kv heads
(replicated when H_kv < N, as vLLM does), FFN columns and vocabulary rows (the last shard padded,
so any vocabulary splits); docs/parallel.md, "What each rank holds". `check_layout` refuses, naming
the field, its value and the rule, every split that does not go evenly; `local_config` is the
config of one rank's shard.
"""

from __future__ import annotations

from dataclasses import dataclass

from anatomy.config import ModelConfig
from anatomy.errors import InputError

TP_OPTION = "--tensor-parallel-size"
PP_OPTION = "--pipeline-parallel-size"


@dataclass(frozen=True)
class Layout:
    """tp ranks per stage, pp stages: tp * pp ranks in all."""

    tp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for option, value in ((TP_OPTION, self.tp), (PP_OPTION, self.pp)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{option} {value!r} must be a positive integer")

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def coords(self, rank: int) -> tuple[int, int]:
        """(stage, tp_rank) of a global rank."""
        return divmod(rank, self.tp)

    def rank(self, stage: int, tp_rank: int) -> int:
        return stage * self.tp + tp_rank

    def describe(self) -> str:
        return f"tensor-parallel {self.tp} x pipeline-parallel {self.pp} = {self.world} ranks"


def check_layout(config: ModelConfig, layout: Layout) -> None:
    """InputError unless `config` splits evenly over `layout` (a mixture's experts each split by their
    width: docs/parallel.md says why not whole experts per rank)."""
    if not config.is_decoder:
        raise InputError(f"tensor and pipeline parallelism run decoder-only models; this one has "
                         f"architecture={config.architecture!r}")
    tp, pp = layout.tp, layout.pp
    if pp > config.n_layers:
        raise InputError(f"n_layers={config.n_layers} cannot be split into {PP_OPTION} {pp} stages "
                         "(each stage needs at least one block)")
    if tp == 1:
        return
    _divides(config.n_heads, tp, "n_heads", "each rank computes n_heads / N query heads")
    H_kv = config.n_kv_heads
    if H_kv >= tp:
        _divides(H_kv, tp, "n_kv_heads", "each rank keeps n_kv_heads / N kv heads")
    elif tp % H_kv:
        raise InputError(f"n_kv_heads={H_kv} is fewer than {TP_OPTION} {tp} and does not divide it: each kv head "
                         f"is replicated on N / n_kv_heads ranks, so N must be a multiple of n_kv_heads")
    if any(not config.layer_is_moe(i) for i in range(config.n_layers)):
        _divides(config.d_ff, tp, "d_ff", "each rank computes d_ff / N columns of the FFN")
    if config.n_experts:
        _divides(config.d_ff_expert, tp, "d_ff_expert", "each rank computes d_ff_expert / N columns of every expert")
        if config.d_ff_shared_expert:
            _divides(config.d_ff_shared_expert, tp, "d_ff_shared_expert",
                     "each rank computes d_ff_shared_expert / N columns of the shared expert")
    if config.vocab_size < tp:
        raise InputError(f"vocab_size={config.vocab_size} is smaller than {TP_OPTION} {tp}: every rank holds a "
                         "slice of the vocabulary")


def _divides(value: int, tp: int, field: str, rule: str) -> None:
    if value % tp:
        raise InputError(f"{field}={value} is not divisible by {TP_OPTION} {tp}: {rule}")


# -- what one rank holds -------------------------------------------------------------------------

def stage_layers(n_layers: int, pp: int, stage: int) -> range:
    """The blocks of stage `stage`: L blocks in pp runs as even as they go."""
    return range(round(stage * n_layers / pp), round((stage + 1) * n_layers / pp))


def query_heads(config: ModelConfig, tp: int, tp_rank: int) -> range:
    per = config.n_heads // tp
    return range(tp_rank * per, (tp_rank + 1) * per)


def kv_heads(config: ModelConfig, tp: int, tp_rank: int) -> range:
    """The kv heads a rank keeps: its share, or the one its query heads read (replicated)."""
    H, H_kv = config.n_heads, config.n_kv_heads
    if H_kv >= tp:
        per = H_kv // tp
        return range(tp_rank * per, (tp_rank + 1) * per)
    first = query_heads(config, tp, tp_rank).start // (H // H_kv)
    return range(first, first + 1)


def columns(width: int, tp: int, tp_rank: int) -> range:
    """A rank's share of `width` columns (d_ff, an expert's width)."""
    per = width // tp
    return range(tp_rank * per, (tp_rank + 1) * per)


def vocab_rows(vocab_size: int, tp: int, tp_rank: int) -> tuple[range, int]:
    """(the real vocabulary rows of a rank, the padded shard size V_r = ceil(V / N))."""
    per = -(-vocab_size // tp)
    start = min(vocab_size, tp_rank * per)
    return range(start, min(vocab_size, start + per)), per


def local_config(config: ModelConfig, layout: Layout, rank: int) -> ModelConfig:
    """The config of rank `rank`'s shard: its stage's blocks, its heads and widths; the full
    vocabulary and d_model (the residual stream is whole on every rank)."""
    stage, _ = layout.coords(rank)
    tp = layout.tp
    local = config.with_layers(stage_layers(config.n_layers, layout.pp, stage))
    changes = dict(n_heads=config.n_heads // tp, n_kv_heads=len(kv_heads(config, tp, 0)), head_dim=config.head_dim,
                   d_ff=max(1, config.d_ff // tp))
    if config.n_experts:
        changes["d_ff_expert"] = config.d_ff_expert // tp
        changes["d_ff_shared_expert"] = config.d_ff_shared_expert // tp
    return local.replace(**changes)


def shard_config(config: ModelConfig, layout: Layout, rank: int) -> ModelConfig:
    """The local config with the vocabulary shard's padded rows as its vocabulary: the structure a
    rank's tensors have (its special token ids, which may lie beyond those rows, cleared)."""
    local = local_config(config, layout, rank)
    _, per = vocab_rows(config.vocab_size, layout.tp, layout.coords(rank)[1])
    return local.replace(vocab_size=per, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                         decoder_start_token_id=None)


def stage_holds(name: str, *, first: bool, last: bool, tied: bool) -> bool:
    """Does a stage hold the tensor `name` of a DecoderLM (the others' stage modules stand in for it)?
    The first stage holds the embeddings, the last the final norm and the LM head (and, tied, the
    token table it reads as the head)."""
    if name.startswith("stack.embed."):
        return first or (tied and last and name == "stack.embed.tokens.weight")
    if name.startswith("stack.final_norm.") or name.startswith("lm_head."):
        return last
    return True
