"""Explicit name maps between HF transformers' tensors and anatomy's, per HF family.

A Link joins one of our modules (or one tensor) to the HF module(s) it is made of, e.g.

    blocks.3.attn.qkv   <- model.layers.3.self_attn.{q,k,v}_proj    rows [H*d_h | H_kv*d_h | H_kv*d_h]
    blocks.3.attn.qkv   <- transformer.h.3.attn.c_attn              GPT-2 Conv1D: stored [in, out]

`tensor_links(model, family)` expands the links over the tensors the model actually has (a bias
only where the config has one, the LM head only when untied) and gives each HF tensor's shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from anatomy.checkpoints.assign import expected_shapes
from anatomy.config import ModelConfig
from anatomy.errors import ConfigError, InputError
from anatomy.checkpoints.hf_config import ARCHITECTURES, DECODERS, hf_family
from anatomy.models import DecoderLM, Encoder, EncoderDecoder, MaskedLM, SequenceClassifier

# HF checkpoints of the same family are saved with or without the base model's prefix.
OPTIONAL_PREFIX = {"gpt2": "transformer.", "bert": "bert.", "bert-mlm": "bert.", "bert-cls": "bert.",
                   "gemma3": "language_model."}


@dataclass(frozen=True)
class Link:
    ours: str  # a module path (its .weight/.bias follow) or, with exact=True, one tensor name
    hf: tuple[str, ...]  # HF module paths (or tensor names), concatenated along rows to give ours
    sizes: tuple[int, ...] = ()  # rows of each HF part, when several are fused into one of ours
    transpose: bool = False  # HF stores the weight [in, out] (GPT-2 Conv1D; gpt-oss's experts [E, in, out])
    exact: bool = False
    leading_one: bool = False  # HF stores the tensor with an extra leading dimension of 1
    interleaved: bool = False  # HF interleaves an expert's gate and up rows (gpt-oss: gate even, up odd)


@dataclass(frozen=True)
class TensorLink:
    ours: str
    hf: tuple[str, ...]
    hf_shapes: tuple[torch.Size, ...]
    part_shapes: tuple[torch.Size, ...]  # each HF part in our layout, before concatenation
    transpose: bool
    shape: tuple[int, ...] = ()  # ours; stacked experts [E, R, C] are concatenated as [E*R, C] rows
    interleaved: bool = False

    def to_ours(self, t: torch.Tensor, part_shape: torch.Size) -> torch.Tensor:
        """One HF tensor as its part of ours."""
        if self.transpose:
            t = t.t() if t.dim() == 2 else t.transpose(-1, -2)
        if self.interleaved:  # [E, 2F, ...] with gate and up rows alternating -> gate rows, then up rows
            t = torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)
        return t.reshape(part_shape)

    def to_hf(self, t: torch.Tensor, hf_shape: torch.Size) -> torch.Tensor:
        """Ours (a link of one HF tensor) as that tensor."""
        if self.interleaved:
            E, R = t.shape[:2]
            t = t.reshape(E, 2, R // 2, *t.shape[2:]).transpose(1, 2).reshape(t.shape)
        if self.transpose:
            t = t.t() if t.dim() == 2 else t.transpose(-1, -2)
        return t.reshape(hf_shape)


def family_of(model: nn.Module) -> str:
    """The HF family a model is read from and written as, by its class and config fields."""
    if isinstance(model, MaskedLM):
        return "bert-mlm"
    if isinstance(model, SequenceClassifier):
        return "bert-cls"
    if isinstance(model, Encoder):
        return "bert"
    if isinstance(model, EncoderDecoder):
        return "marian"
    if isinstance(model, DecoderLM):
        return hf_family(model.config)
    raise InputError(f"no HF layout for {type(model).__name__} (expected one of anatomy's model classes)")


def tensor_links(model: nn.Module, family: str) -> list[TensorLink]:
    """One TensorLink per tensor the model expects; every expected tensor is covered."""
    links = _LINKS[family](model.config)
    by_module = {link.ours: link for link in links if not link.exact}
    by_tensor = {link.ours: link for link in links if link.exact}
    out = []
    for name, shape in expected_shapes(model).items():
        module, _, suffix = name.rpartition(".")
        link = by_tensor.get(name) or by_module.get(module)
        if link is None:
            raise ConfigError(f"HF {ARCHITECTURES[family]} has no tensor for {name!r}: this config has a part "
                              "the HF class lacks")
        hf = link.hf if link.exact else tuple(f"{h}.{suffix}" for h in link.hf)
        out.append(_expand(name, shape, hf, link))
    return out


def ignorable(family: str, config: ModelConfig) -> re.Pattern[str]:
    """HF tensors a checkpoint may hold that anatomy recomputes or ties (not errors when present)."""
    patterns = {
        **{family: [r"(model\.)?layers\.\d+\.self_attn\.rotary_emb\.inv_freq"] for family in DECODERS},
        "gpt2": [r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias"],
        "bert": [r"(bert\.)?embeddings\.position_ids"],
        "bert-mlm": [r"(bert\.)?embeddings\.position_ids", r"cls\.predictions\.decoder\.bias"],
        "bert-cls": [r"(bert\.)?embeddings\.position_ids"],
        "marian": [r"model\.(encoder|decoder)\.embed_positions\.weight",
                   r"model\.(encoder|decoder)\.embed_tokens\.weight"],
        "gemma3": [r"vision_tower\..*", r"multi_modal_projector\..*"],  # the language model is what is read
    }[family]
    if config.tie_embeddings:
        patterns.append(r"(language_model\.)?lm_head\.weight|cls\.predictions\.decoder\.weight")
    return re.compile("|".join(f"(?:{p})" for p in patterns))


def _expand(name: str, shape: torch.Size, hf: tuple[str, ...], link: Link) -> TensorLink:
    rows = shape[:-1].numel() if len(shape) == 3 else (shape[0] if shape else 0)  # stacked experts: E*R rows
    rest = shape[-1:] if len(shape) == 3 else shape[1:]
    if not shape:
        part_shapes = (shape,)
    else:
        part_shapes = tuple(torch.Size((r, *rest)) for r in link.sizes or (rows,))
    transpose = link.transpose and len(shape) in (2, 3)
    hf_shapes = tuple(torch.Size(reversed(s)) if transpose else s for s in part_shapes)
    if transpose and len(shape) == 3:  # stacked experts stored [E, C, R]
        hf_shapes = (torch.Size((shape[0], shape[2], shape[1])),)
    if link.leading_one:
        hf_shapes = tuple(torch.Size((1, *s)) for s in hf_shapes)
    return TensorLink(name, hf, hf_shapes, part_shapes, transpose, shape, link.interleaved)


def _decoder(c: ModelConfig, family: str) -> list[Link]:
    """The LLaMA-like decoders: one layout, with each family's names for its norms, fused tensors
    (Phi-3) and experts (Mixtral's w1/w3/w2, Qwen's gate/up/down_proj and shared expert)."""
    links = [Link("stack.embed.tokens", ("model.embed_tokens",)), Link("stack.final_norm", ("model.norm",)),
             Link("lm_head", ("lm_head",))]
    sandwich = family in ("gemma2", "gemma3_text")  # norms before and after each branch
    for i in range(c.n_layers):
        o, h = f"stack.blocks.{i}.", f"model.layers.{i}."
        links += [
            Link(o + "attn_norm", (h + "input_layernorm",)),
            Link(o + "attn.out", (h + "self_attn.o_proj",)),
            Link(o + "attn.q_norm", (h + "self_attn.q_norm",)), Link(o + "attn.k_norm", (h + "self_attn.k_norm",)),
            Link(o + "ffn_norm", (h + ("pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"),)),
            Link(o + "attn_out_norm", (h + "post_attention_layernorm",)),
            Link(o + "ffn_out_norm", (h + "post_feedforward_layernorm",)),
        ]
        if c.attn_sinks:
            links.append(Link(o + "attn.sinks", (h + "self_attn.sinks",), exact=True))
        if c.latent:
            links += _latent_links(o + "attn.", h + "self_attn.")
        elif family == "phi3":
            links += [Link(o + "attn.qkv", (h + "self_attn.qkv_proj",)), Link(o + "ffn.gate_up", (h + "mlp.gate_up_proj",))]
        else:
            links += [Link(o + "attn.qkv", tuple(h + f"self_attn.{x}_proj" for x in "qkv"),
                           sizes=(c.q_dim, c.kv_dim, c.kv_dim))]
        links += _moe_links(c, o, h, family) if c.layer_is_moe(i) else _dense_ffn_links(c, o, h, family)
    return links


def _latent_links(o: str, h: str) -> list[Link]:
    """DeepSeek's latent attention: q (or q_a, its norm, q_b), kv_a with its norm, kv_b, o."""
    return [Link(o + "q", (h + "q_proj",)), Link(o + "q_a", (h + "q_a_proj",)), Link(o + "q_a_norm", (h + "q_a_layernorm",)),
            Link(o + "q_b", (h + "q_b_proj",)), Link(o + "kv_a", (h + "kv_a_proj_with_mqa",)),
            Link(o + "kv_a_norm", (h + "kv_a_layernorm",)), Link(o + "kv_b", (h + "kv_b_proj.weight",), exact=True)]


def _dense_ffn_links(c: ModelConfig, o: str, h: str, family: str) -> list[Link]:
    links = [Link(o + "ffn.down", (h + "mlp.down_proj",))]
    if family != "phi3":
        links.append(Link(o + "ffn.gate_up", (h + "mlp.gate_proj", h + "mlp.up_proj"), sizes=(c.d_ff, c.d_ff)))
    return links


def _moe_links(c: ModelConfig, o: str, h: str, family: str) -> list[Link]:
    """Stacked experts [E, 2F, D] / [E, D, F] from per-expert tensors, expert by expert (gpt-oss: from
    its own stacked ones)."""
    if family == "gpt_oss":
        return _gpt_oss_experts(o, h + "mlp.")
    E, F = c.n_experts, c.d_ff_expert
    if family == "mixtral":
        m, gate, up, down = h + "block_sparse_moe.", "w1", "w3", "w2"
    else:
        m, gate, up, down = h + "mlp.", "gate_proj", "up_proj", "down_proj"
    experts = [f"{m}experts.{e}." for e in range(E)]
    links = [
        Link(o + "ffn.router", (m + "gate",)),
        Link(o + "ffn.gate_up", tuple(x + f"{w}.weight" for x in experts for w in (gate, up)), sizes=(F, F) * E,
             exact=True),
        Link(o + "ffn.down", tuple(x + f"{down}.weight" for x in experts), sizes=(c.d_model,) * E, exact=True),
    ]
    if c.router_score_bias:
        links.append(Link(o + "ffn.score_bias", (m + "gate.e_score_correction_bias",), exact=True))
    if c.d_ff_shared_expert:
        s, Fs = m + ("shared_experts." if family.startswith("deepseek") else "shared_expert."), c.d_ff_shared_expert
        links += [Link(o + "ffn.shared.gate_up", (s + "gate_proj", s + "up_proj"), sizes=(Fs, Fs)),
                  Link(o + "ffn.shared.down", (s + "down_proj",)), Link(o + "ffn.shared_gate", (m + "shared_expert_gate",))]
    return links


def _gpt_oss_experts(o: str, m: str) -> list[Link]:
    """gpt-oss stores its experts stacked, [E, in, out] with gate and up columns interleaved."""
    x = m + "experts."
    return [Link(o + "ffn.router", (m + "router",)),
            Link(o + "ffn.gate_up", (x + "gate_up_proj",), exact=True, transpose=True, interleaved=True),
            Link(o + "ffn.gate_up_bias", (x + "gate_up_proj_bias",), exact=True, interleaved=True),
            Link(o + "ffn.down", (x + "down_proj",), exact=True, transpose=True),
            Link(o + "ffn.down_bias", (x + "down_proj_bias",), exact=True)]


def _gpt2(c: ModelConfig) -> list[Link]:
    t = "transformer."
    links = [Link("stack.embed.tokens", (t + "wte",)), Link("stack.embed.positions", (t + "wpe",)),
             Link("stack.final_norm", (t + "ln_f",)), Link("lm_head", ("lm_head",))]
    for i in range(c.n_layers):
        o, h = f"stack.blocks.{i}.", f"{t}h.{i}."
        links += [
            Link(o + "attn_norm", (h + "ln_1",)),
            Link(o + "attn.qkv", (h + "attn.c_attn",), transpose=True),
            Link(o + "attn.out", (h + "attn.c_proj",), transpose=True),
            Link(o + "ffn_norm", (h + "ln_2",)),
            Link(o + "ffn.up", (h + "mlp.c_fc",), transpose=True),
            Link(o + "ffn.down", (h + "mlp.c_proj",), transpose=True),
        ]
    return links


def _bert_encoder(c: ModelConfig, o: str, h: str) -> list[Link]:
    """BERT's encoder with our names under prefix o (the Encoder's) and HF's under prefix h."""
    e, s = h + "embeddings.", o + "stack."
    links = [Link(s + "embed.tokens", (e + "word_embeddings",)),
             Link(s + "embed.positions", (e + "position_embeddings",)),
             Link(s + "embed.token_types", (e + "token_type_embeddings",)),
             Link(s + "embed.norm", (e + "LayerNorm",)), Link(o + "pooler", (h + "pooler.dense",))]
    for i in range(c.n_layers):
        b, hl = f"{s}blocks.{i}.", f"{h}encoder.layer.{i}."
        links += [
            Link(b + "attn.qkv", tuple(hl + f"attention.self.{x}" for x in ("query", "key", "value")),
                 sizes=(c.q_dim, c.kv_dim, c.kv_dim)),
            Link(b + "attn.out", (hl + "attention.output.dense",)),
            Link(b + "attn_norm", (hl + "attention.output.LayerNorm",)),
            Link(b + "ffn.up", (hl + "intermediate.dense",)),
            Link(b + "ffn.down", (hl + "output.dense",)),
            Link(b + "ffn_norm", (hl + "output.LayerNorm",)),
        ]
    return links


def _bert(c: ModelConfig) -> list[Link]:
    return _bert_encoder(c, "", "")


def _bert_mlm(c: ModelConfig) -> list[Link]:
    p = "cls.predictions."
    return _bert_encoder(c, "encoder.", "bert.") + [
        Link("transform", (p + "transform.dense",)), Link("transform_norm", (p + "transform.LayerNorm",)),
        Link("decoder.weight", (p + "decoder.weight",), exact=True), Link("decoder.bias", (p + "bias",), exact=True),
    ]


def _bert_cls(c: ModelConfig) -> list[Link]:
    return _bert_encoder(c, "encoder.", "bert.") + [Link("classifier", ("classifier",))]


def _marian_block(c: ModelConfig, o: str, h: str, *, cross: bool) -> list[Link]:
    links = [
        Link(o + "attn.qkv", tuple(h + f"self_attn.{x}_proj" for x in "qkv"), sizes=(c.q_dim, c.kv_dim, c.kv_dim)),
        Link(o + "attn.out", (h + "self_attn.out_proj",)),
        Link(o + "attn_norm", (h + "self_attn_layer_norm",)),
        Link(o + "ffn.up", (h + "fc1",)), Link(o + "ffn.down", (h + "fc2",)),
        Link(o + "ffn_norm", (h + "final_layer_norm",)),
    ]
    if cross:
        links += [
            Link(o + "cross_attn.q", (h + "encoder_attn.q_proj",)),
            Link(o + "cross_attn.kv", (h + "encoder_attn.k_proj", h + "encoder_attn.v_proj"),
                 sizes=(c.kv_dim, c.kv_dim)),
            Link(o + "cross_attn.out", (h + "encoder_attn.out_proj",)),
            Link(o + "cross_norm", (h + "encoder_attn_layer_norm",)),
        ]
    return links


def _marian(c: ModelConfig) -> list[Link]:
    links = [Link("shared", ("model.shared",)), Link("lm_head.weight", ("lm_head.weight",), exact=True),
             Link("lm_head.bias", ("final_logits_bias",), exact=True, leading_one=True)]
    for i in range(c.n_layers):
        links += _marian_block(c, f"encoder.blocks.{i}.", f"model.encoder.layers.{i}.", cross=False)
    for i in range(c.n_decoder_layers):
        links += _marian_block(c, f"decoder.blocks.{i}.", f"model.decoder.layers.{i}.", cross=True)
    return links


def _decoder_links(family: str):
    return lambda c: _decoder(c, family)


_LINKS = {**{family: _decoder_links(family) for family in DECODERS}, "gemma3": _decoder_links("gemma3_text"),
          "gpt2": _gpt2, "bert": _bert, "bert-mlm": _bert_mlm, "bert-cls": _bert_cls,
          "marian": _marian}
