"""The body of every model: embeddings -> position context -> blocks -> final norm.

    input_ids [B, S] --embed--> x [B, S, D] --L blocks (one PassInputs shared)--> final norm --> [B, S, D]

DecoderLM is a causal Stack plus an LM head; Encoder a bidirectional Stack (plus BERT's pooler);
EncoderDecoder a bidirectional encoder Stack and a causal decoder Stack with cross-attention,
both reading one shared token table. The prologue every pass needs (which slots the queries and
keys occupy, their positions, the masks) is built here once, in `prepare` (docs/foundation.md).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from anatomy.config import ModelConfig
from anatomy.deprecation import deprecated
from anatomy.errors import InputError
from anatomy.layers import Block, make_norm
from anatomy.layers.attention import LayerCache
from anatomy.layers.pass_inputs import PassInputs
from anatomy.models.position_rules import PositionRules
from anatomy.models.embedding import Embeddings, check_input_ids, check_positions


class Stack(nn.Module):
    """`n_layers` blocks between the embeddings and the final norm.

    Fields a caller may set: `activation_checkpointing` (default False) recomputes each block's
    activations during the backward pass instead of keeping them (training only).
    """

    def __init__(self, config: ModelConfig, *, causal: bool, n_layers: int, cross: bool = False,
                 tokens: nn.Embedding | None = None, backend: str = "sdpa",
                 names: tuple[str, str] = ("input_ids", "attention_mask")) -> None:
        super().__init__()
        self.config, self.causal = config, causal
        self.ids_name, self.mask_name = names  # what the model's callers call them, for messages
        self.embed = Embeddings(config, tokens=tokens)
        self.position_rules = PositionRules(config, causal=causal)
        self.blocks = nn.ModuleList(Block(config, causal=causal, cross=cross, backend=backend, layer=i)
                                    for i in range(n_layers))
        self.final_norm = make_norm(config) if config.final_norm else nn.Identity()
        self.activation_checkpointing = False

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        cache: Sequence[LayerCache] | None = None,
        input_pos: Tensor | None = None,
        memory_kv: Sequence[tuple[Tensor, Tensor]] | None = None,
        memory_mask: Tensor | None = None,
        weights: list[Tensor] | None = None,
        router_logits: list[Tensor] | None = None,
    ) -> Tensor:
        """input_ids [B, S] -> final-normed hidden states [B, S, D], every input checked first.

        memory_kv: each block's cross-attention keys/values of the encoder output (`memory_kv()`),
        memory_mask [B, S_m] its real positions. A `weights` list receives every block's attention
        weights (see Block.forward), a `router_logits` list every mixture-of-experts layer's router
        logits [B*S, E].
        """
        self.check(input_ids, token_type_ids=token_type_ids, cache=cache, input_pos=input_pos,
                   memory_kv=memory_kv, memory_mask=memory_mask)
        ctx, position_ids = self.prepare(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                         cache=cache, input_pos=input_pos, memory_mask=memory_mask)
        if router_logits is not None:
            ctx = dataclasses.replace(ctx, router_logits=router_logits)
        return self.forward_pass(input_ids, ctx, position_ids=position_ids, token_type_ids=token_type_ids,
                                 cache=cache, memory_kv=memory_kv, weights=weights)

    def check(self, input_ids: Tensor, *, token_type_ids: Tensor | None, cache: Sequence[LayerCache] | None,
              input_pos: Tensor | None, memory_kv: Sequence[tuple[Tensor, Tensor]] | None,
              memory_mask: Tensor | None) -> None:
        """Every input a caller gives, checked against the config and each other (InputError)."""
        check_input_ids(input_ids, self.config, name=self.ids_name)
        B, S = input_ids.shape
        if token_type_ids is not None and self.embed.token_types is not None:
            _check_shape(token_type_ids, (B, S), "token_type_ids", self.ids_name)
            check_input_ids(token_type_ids, self.config.replace(vocab_size=self.config.type_vocab_size),
                            name="token_type_ids")
        if cache is not None:
            _check_input_pos(input_pos, S, cache[0].max_len)
        if self.blocks and self.blocks[0].cross_attn is not None:
            _check_memory(memory_kv, memory_mask, B, len(self.blocks), self.ids_name)

    def prepare(self, input_ids: Tensor, *, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                cache: Sequence[LayerCache] | None = None, input_pos: Tensor | None = None,
                memory_mask: Tensor | None = None) -> tuple[PassInputs, Tensor]:
        """(the PassInputs of this pass, position_ids [B, S]) from the slots the queries and keys occupy.
        Without a cache the queries and keys are the S tokens themselves (slots 0..S-1). With one, the
        new tokens are written at cache slots `input_pos` [S] and attend over all T slots of the cache;
        `attention_mask` [B, S_k] then marks which of the S_k = T slots hold real tokens."""
        B, S = input_ids.shape
        device = input_ids.device
        if cache is None:
            q_slots = k_slots = torch.arange(S, device=device)
        else:
            q_slots, k_slots = input_pos, torch.arange(cache[0].max_len, device=device)
        if attention_mask is not None:
            keys = "the cache slots" if cache is not None else self.ids_name
            _check_shape(attention_mask, (B, len(k_slots)), self.mask_name, keys)
        if position_ids is None:
            position_ids = q_slots[None].expand(B, S)
        else:
            _check_shape(position_ids, (B, S), "position_ids", self.ids_name)
        check_positions(position_ids, self.config)
        memory = memory_mask.bool()[:, None, None, :] if memory_mask is not None else None  # [B, 1, 1, S_m]
        ctx = self.position_rules(position_ids, q_slots=q_slots, k_slots=k_slots, key_valid=attention_mask,
                                  explicit=cache is not None, input_pos=input_pos, memory_mask=memory,
                                  dtype=self.embed.dtype)
        return ctx, position_ids

    @property
    def context(self) -> PositionRules:
        """Deprecated name of `position_rules` ("context" is the model's length in tokens)."""
        deprecated("Stack.context is deprecated; use Stack.position_rules")
        return self.position_rules

    def run(self, *args, **kwargs) -> Tensor:
        """Deprecated name of `forward_pass` (a Run is one generation)."""
        deprecated("Stack.run is deprecated; use Stack.forward_pass")
        return self.forward_pass(*args, **kwargs)

    def forward_pass(self, input_ids: Tensor, ctx: PassInputs, *, position_ids: Tensor,
                     token_type_ids: Tensor | None = None, cache: Sequence[LayerCache] | None = None,
                     memory_kv: Sequence[tuple[Tensor, Tensor]] | None = None,
                     weights: list[Tensor] | None = None) -> Tensor:
        """The pass itself, nothing checked: embeddings, every block with `ctx`, the final norm."""
        x = self.embed(input_ids, position_ids, token_type_ids)  # [B, S, D]
        for i, block in enumerate(self.blocks):
            kwargs = dict(cache=cache[i] if cache is not None else None,
                          memory_kv=memory_kv[i] if memory_kv is not None else None, weights=weights)
            if self.activation_checkpointing and self.training:
                x = checkpoint(block, x, ctx, use_reentrant=False, **kwargs)
            else:
                x = block(x, ctx, **kwargs)
        return self.final_norm(x)

    def memory_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each block's cross-attention keys and values of the encoder output memory [B, S_m, D]."""
        return [block.cross_attn.project_memory(memory) for block in self.blocks]


def _check_shape(t: Tensor, shape: tuple[int, ...], name: str, other: str) -> None:
    if tuple(t.shape) != shape:
        raise InputError(f"{name} has shape {tuple(t.shape)}, {other} has {shape}")


def _check_input_pos(input_pos: Tensor | None, S: int, max_len: int) -> None:
    if input_pos is None:
        raise InputError("a KV cache needs input_pos, the cache slots of the new tokens")
    if input_pos.dim() != 1 or input_pos.numel() != S or input_pos.dtype.is_floating_point:
        raise InputError(f"input_pos must be an integer tensor [S={S}] of cache slots, got "
                         f"{tuple(input_pos.shape)} {input_pos.dtype}")
    if torch.compiler.is_compiling() or input_pos.is_meta:
        return
    low, high = int(input_pos.min()), int(input_pos.max())
    if low < 0 or high >= max_len:
        raise InputError(f"input_pos holds slot {low if low < 0 else high}, outside the cache's [0, {max_len})")


def _check_memory(memory_kv: Sequence[tuple[Tensor, Tensor]] | None, memory_mask: Tensor | None, B: int,
                  layers: int, ids_name: str) -> None:
    if memory_kv is None or len(memory_kv) != layers:
        raise InputError(f"cross-attention needs memory_kv for each of the {layers} blocks "
                         "(the encoder output's keys and values, Stack.memory_kv)")
    rows, S_m = memory_kv[0][0].shape[0], memory_kv[0][0].shape[2]
    if rows != B:
        raise InputError(f"batch sizes differ: {ids_name} has {B} rows, the encoder output {rows}")
    if memory_mask is not None:
        _check_shape(memory_mask, (B, S_m), "src_mask", "the encoder output [B, S_src]")
