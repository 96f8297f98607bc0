"""Where each LoRA target lives in an anatomy decoder, and the HF module PEFT names it by.

anatomy fuses projections that HF keeps apart, so a target is a range of a module's output rows:

    q, k, v   stack.blocks.N.attn.qkv     rows [0, H*d_h), [.., + H_kv*d_h), [.., + H_kv*d_h)
    gate, up  stack.blocks.N.ffn.gate_up  rows [0, F), [F, 2F)    (an MLP: up is stack.blocks.N.ffn.up)
    o, down   stack.blocks.N.attn.out, stack.blocks.N.ffn.down

The HF names come from checkpoints/hf_names.py: q of block 3 of a LLaMA is `model.layers.3.self_attn.q_proj`.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from anatomy.checkpoints.hf_names import TensorLink, family_of, tensor_links
from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.layers.attention import Attention
from anatomy.layers.ffn import GLU, MLP
from anatomy.lora.config import LoraConfig, TARGETS
from anatomy.models import DecoderLM, build_model


@dataclass(frozen=True)
class Site:
    """One adapted projection: target `target` of block `layer`, rows [start, stop) of `module`."""

    module: str  # anatomy's module path, e.g. "stack.blocks.3.attn.qkv"
    target: str  # "q"
    layer: int
    start: int
    stop: int
    in_features: int
    hf_module: str | None  # e.g. "model.layers.3.self_attn.q_proj"; None where HF has no module of it alone
    unnamed: str = ""  # why hf_module is None

    @property
    def out_features(self) -> int:
        return self.stop - self.start

    def shapes(self, rank: int) -> dict[str, tuple[int, int]]:
        """The shapes of A and B."""
        return {"A": (rank, self.in_features), "B": (self.out_features, rank)}


def all_sites(config: ModelConfig, *, hf_names: bool = True) -> list[Site]:
    """Every target of every block a decoder of this config has, in block then TARGETS order
    (hf_names=False: without their HF names, for a config HF has no class for)."""
    model = build_model(config, device="meta")
    if not isinstance(model, DecoderLM):
        raise InputError(f"LoRA adapters are made for decoder LMs; this model is a {config.architecture}")
    links = {link.ours.removesuffix(".weight"): link for link in tensor_links(model, family_of(model))} \
        if hf_names else {}
    out = []
    for layer, block in enumerate(model.stack.blocks):
        for target, (path, start, stop, in_features) in block_targets(block).items():
            module = f"stack.blocks.{layer}.{path}"
            hf_module, unnamed = _hf_module(links[module], target, start, stop) if hf_names else (None, "")
            out.append(Site(module=module, target=target, layer=layer, start=start, stop=stop,
                            in_features=in_features, hf_module=hf_module, unnamed=unnamed))
    return out


def sites(config: ModelConfig, lora: LoraConfig, *, hf_names: bool = True) -> list[Site]:
    """The sites an adapter of `lora` has on a model of `config`; every target and layer must exist
    (and, with hf_names, have a PEFT name)."""
    every = all_sites(config, hf_names=hf_names)
    n_layers = 1 + max((s.layer for s in every), default=-1)
    bad = next((i for i in lora.layers or () if not 0 <= i < n_layers), None)
    if bad is not None:
        raise InputError(f"LoRA layer {bad} is not a block of this model (it has {n_layers})")
    missing = next((t for t in lora.targets if not any(s.target == t for s in every)), None)
    if missing is not None:
        has = sorted({s.target for s in every}, key=TARGETS.index)
        raise InputError(f"LoRA target {missing!r} is not in this model (its blocks have {', '.join(has)})")
    chosen = [s for s in every if s.target in lora.targets and (lora.layers is None or s.layer in lora.layers)]
    unnamed = next((s for s in chosen if s.hf_module is None), None) if hf_names else None
    if unnamed is not None:
        raise InputError(f"LoRA target {unnamed.target!r}: {unnamed.unnamed}; PEFT has no module of this target alone")
    return chosen


def block_targets(block: nn.Module) -> dict[str, tuple[str, int, int, int]]:
    """target -> (module path in the block, first row, end row, in_features)."""
    out: dict[str, tuple[str, int, int, int]] = {}
    attn = block.attn
    if isinstance(attn, Attention) and not attn.cross:  # latent attention has no q/k/v rows of its own
        q, kv, d = attn.n_heads * attn.head_dim, attn.n_kv_heads * attn.head_dim, attn.qkv.in_features
        out.update(q=("attn.qkv", 0, q, d), k=("attn.qkv", q, q + kv, d), v=("attn.qkv", q + kv, q + 2 * kv, d),
                   o=("attn.out", 0, attn.out.out_features, attn.out.in_features))
    ffn = block.ffn
    if isinstance(ffn, GLU):
        out.update(gate=("ffn.gate_up", 0, ffn.d_ff, ffn.gate_up.in_features),
                   up=("ffn.gate_up", ffn.d_ff, 2 * ffn.d_ff, ffn.gate_up.in_features))
    elif isinstance(ffn, MLP):
        out["up"] = ("ffn.up", 0, ffn.up.out_features, ffn.up.in_features)
    if isinstance(ffn, (GLU, MLP)):  # a mixture's experts are stacked, not one projection
        out["down"] = ("ffn.down", 0, ffn.down.out_features, ffn.down.in_features)
    return out


def _hf_module(link: TensorLink, target: str, start: int, stop: int) -> tuple[str | None, str]:
    """The HF module holding exactly rows [start, stop) of our module, as PEFT names it, or None and why not."""
    offset = 0
    for name, part in zip(link.hf, link.part_shapes):
        if (offset, offset + part[0]) == (start, stop) and not link.transpose:
            return name.removesuffix(".weight"), ""
        offset += part[0]
    why = "stores it transposed (Conv1D)" if link.transpose else f"holds more than {target} in one module"
    return None, f"HF {link.hf[0].removesuffix('.weight')} {why}"
