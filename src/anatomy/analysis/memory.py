"""Memory: weights by dtype, the KV cache, training state and activations, the attention score matrix.

Weights and the KV cache follow from the ledger and the config. Training activations are
measured, not modelled: the model runs forward on the meta device under
`torch.autograd.graph.saved_tensors_hooks`, and every tensor autograd keeps for the backward pass
is recorded once per storage (views of one buffer count once; parameters are not activations).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from anatomy import dtypes, kv_format
from anatomy.config import ModelConfig


def check_dtype(name: str, *, option: str = "--dtype") -> str:
    """The canonical name of a dtype sizes can be computed for (f32, f16, bf16, int8, int4)."""
    return dtypes.parse(name, option=option, choices=dtypes.ALL).name


def compute_dtype(weight_dtype: str) -> str:
    """Activations and matmuls run in f32 for f32 weights, in the float type itself for bf16/f16,
    and in bf16 for int8/int4 weights (weight-only quantization dequantizes before the matmul)."""
    dtype = dtypes.parse(weight_dtype, choices=dtypes.ALL)
    return dtype.name if dtype.is_float else "bf16"


def weights_bytes(n_params: int, dtype: str) -> int:
    """Bytes of n_params at `dtype`; int8/int4 without the per-group scales real formats add
    (GGUF Q4_1, for one, stores 5 bits per weight)."""
    return dtypes.parse(dtype, choices=dtypes.ALL).nbytes(n_params)


@dataclass(frozen=True)
class TrainingState:
    """Bytes AdamW training keeps besides the activations: weights, gradients, an f32 master copy
    of 16-bit weights (mixed precision only), and the f32 moments m and v."""

    weights: int
    gradients: int
    master_weights: int
    adam_moments: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.master_weights + self.adam_moments


def training_state(n_params: int, *, dtype: str) -> TrainingState:
    """What training n_params parameters in `dtype` keeps: f32 training has f32 weights, gradients
    and moments (4 + 4 + 8 B/param); bf16/f16 mixed precision 16-bit weights and gradients, an f32
    master copy and f32 moments (2 + 2 + 4 + 8). Both come to 16 B/param."""
    compute = dtypes.parse(dtype, choices=dtypes.FLOATS)
    half = compute != dtypes.F32
    return TrainingState(weights=compute.nbytes(n_params), gradients=compute.nbytes(n_params),
                         master_weights=4 * n_params if half else 0, adam_moments=8 * n_params)


def kv_bytes_per_token(config: ModelConfig, kv_dtype: str) -> int:
    """config.kv_values_per_token (2 * cached layers * H_kv * d_h) at `kv_dtype`, an 8-bit cache's
    scales included (anatomy/kv_format.py)."""
    return kv_format.kv_bytes_per_token(config, dtypes.parse(kv_dtype, option="--kv-dtype", choices=dtypes.ALL).name)


def kv_cache_bytes(config: ModelConfig, *, batch: int, tokens: int, kv_dtype: str, windowed: bool = True) -> int:
    """K and V of `tokens` positions for B sequences; a sliding-window layer keeps at most its window
    of them (`windowed`: what a window-capped cache holds; False: every position, as a cache
    addressed by absolute slots, like anatomy's static cache, allocates)."""
    if config.kv_values_per_token == 0:
        return 0  # an encoder keeps no cache
    kept = config.kv_values(tokens) if windowed else tokens * config.kv_values_per_token  # values held
    return batch * kept * kv_bytes_per_token(config, kv_dtype) // config.kv_values_per_token


def naive_scores_bytes(config: ModelConfig, *, batch: int, seq: int, dtype: str) -> int:
    """The [B, H, S, S] score matrix an unfused attention writes out, for one layer."""
    return dtypes.parse(dtype, choices=dtypes.FLOATS).nbytes(batch * config.n_heads * seq * seq)


def fused_attention_bytes(config: ModelConfig, *, batch: int, seq: int) -> int:
    """What a fused (flash) attention keeps instead, for one layer: the row log-sum-exp [B, H, S]
    in f32, so the backward pass can recompute the scores tile by tile."""
    return batch * config.n_heads * seq * 4


@dataclass(frozen=True)
class Activations:
    """Saved-for-backward bytes of one training forward (with its loss): the whole model, the
    largest block, and with every block checkpointed (each block keeps only its input; one
    block's activations are live again while it is recomputed)."""

    total: int
    per_block: int
    block_input: int
    blocks: int
    rest: int  # outside the blocks: embeddings, final norm, head, loss

    @property
    def checkpointed(self) -> int:
        return self.rest + self.blocks * self.block_input + self.per_block


MEASURED_LAYERS = 2  # per stack: every later block of a stack saves what the second one does


def training_activations(config: ModelConfig, *, batch: int, seq: int, dtype: str = "bf16",
                         backend: str = "sdpa", head: str = "auto") -> Activations:
    """Measure the activations a training step saves, running the real model on the meta device.
    backend "eager" materialises the score matrix; "sdpa" is the fused attention; head "mlm" gives
    an encoder the MLM head it trains with. Two blocks of each stack run; the others save what the
    second one saves (the first may also be the first to save a tensor the stack shares, like a
    seq2seq decoder's encoder output)."""
    from anatomy.models import build_model

    dtype = dtypes.parse(dtype, choices=dtypes.FLOATS)
    kinds = _layer_kinds(config)
    measured_layers = sorted({0, *kinds.values()}) if len(kinds) > 1 else list(range(min(config.n_layers,
                                                                                          MEASURED_LAYERS)))
    shallow = config.with_layers(measured_layers).replace(n_decoder_layers=min(config.n_decoder_layers,
                                                                               MEASURED_LAYERS))
    model = build_model(shallow, device="meta", dtype=dtype.torch, attention=backend, head=head).to("meta").train()
    recorder = _SavedTensors({id(p) for p in model.parameters()}, _blocks(model))
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t), _FusedAttention(recorder):
        _training_forward(model, config, ids)
    measured = [recorder.by_block.get(i, 0) for i in range(len(recorder.blocks))]
    if len(kinds) > 1:  # layers differ (windows, experts): each layer saves what the one of its kind measured saves
        by_layer = dict(zip(measured_layers, measured))
        blocks_total = by_layer[0] + sum(by_layer[kinds[_kind(config, i)]] for i in range(1, config.n_layers))
    else:
        stacks = [(measured[:shallow.n_layers], config.n_layers)]
        if config.is_seq2seq:
            stacks.append((measured[shallow.n_layers:], config.n_decoder_layers))
        blocks_total = sum(sum(m) + (full - len(m)) * m[-1] for m, full in stacks)
    rest = recorder.total - sum(measured)
    return Activations(total=rest + blocks_total, per_block=max(measured),
                       block_input=dtype.nbytes(batch * seq * config.d_model),
                       blocks=config.n_layers + config.n_decoder_layers, rest=rest)


def _kind(config: ModelConfig, layer: int) -> tuple[int | None, bool]:
    return config.layer_window(layer), config.layer_is_moe(layer)


def _layer_kinds(config: ModelConfig) -> dict[tuple[int | None, bool], int]:
    """The kinds of block of a decoder-only stack (window, mixture) and a layer of each after the first."""
    kinds: dict[tuple[int | None, bool], int] = {}
    for i in range(1, config.n_layers if config.is_decoder else 0):
        kinds.setdefault(_kind(config, i), i)
    return kinds


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    from anatomy.layers import Block

    return [m for m in model.modules() if isinstance(m, Block)]


def _training_forward(model: torch.nn.Module, config: ModelConfig, ids: torch.Tensor) -> None:
    if config.is_seq2seq:
        logits = model(ids, ids)
    else:
        logits = model(ids)
    if logits.shape[-1] == config.vocab_size:  # an LM head: the loss keeps its log-softmax too
        F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())


class _SavedTensors:
    """saved_tensors_hooks pack function: bytes of each distinct non-parameter storage, by block."""

    def __init__(self, param_ids: set[int], blocks: list[torch.nn.Module]) -> None:
        self.param_ids, self.seen, self.keep, self.blocks = param_ids, set(), [], blocks
        self.total, self.by_block, self.current, self.suppress = 0, {}, None, False
        for i, block in enumerate(blocks):
            block.register_forward_pre_hook(lambda *_, i=i: setattr(self, "current", i))
            block.register_forward_hook(lambda *_: setattr(self, "current", None))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        if self.suppress or id(t) in self.param_ids or (t._base is not None and id(t._base) in self.param_ids):
            return t
        storage = t.untyped_storage()
        if storage._cdata not in self.seen:
            self.seen.add(storage._cdata)
            self.keep.append(storage)  # keep it alive so its address is not reused
            self.add(storage.nbytes())
        return t

    def add(self, nbytes: int) -> None:
        self.total += nbytes
        if self.current is not None:
            self.by_block[self.current] = self.by_block.get(self.current, 0) + nbytes


class _FusedAttention(TorchFunctionMode):
    """On the meta device sdpa falls back to its math path, which saves f32 score matrices no
    fused kernel keeps. Record instead what a fused (flash) kernel saves for its backward: q, k, v,
    the output and the row log-sum-exp [B, H, S] in f32."""

    def __init__(self, recorder: _SavedTensors) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.recorder.suppress = True
        try:
            out = func(*args, **kwargs)
        finally:
            self.recorder.suppress = False
        for t in (*args[:3], out):
            self.recorder.pack(t)
        self.recorder.add(out.shape[0] * out.shape[1] * out.shape[2] * 4)  # log-sum-exp [B, H(_kv), S] f32
        return out
