"""The parameter ledger: every component of a model with its formula and exact count.

The counts are derived from the config by formula (tested against the model built on the meta
device and against HF transformers). Beside the exact total stands the usual 12*L*D^2 estimate,
and the difference is split into its causes (docs/anatomy.md, "Parameter ledger"). A mixture of
experts is counted twice: `total` (every expert, what is stored) and `active` (what one token
goes through: the router, k experts, the shared expert).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from anatomy.config import ModelConfig

# kinds of component, in the order the difference from 12*L*D^2 is explained
KINDS = ("embedding", "attention", "cross_attention", "ffn", "norm", "head")


@dataclass(frozen=True)
class Component:
    """One line of the ledger. `weights`/`biases` are per copy; `copies` is L for per-layer parts.

    `lookup` marks tables read by index only (an untied token embedding, position and segment
    tables): a forward pass reads a few rows of them, not the whole matrix.
    `stack` says which part of the model holds it: embed, encoder, decoder or head.
    """

    name: str
    formula: str
    kind: str
    weights: int
    biases: int = 0
    copies: int = 1
    stack: str = "embed"
    lookup: bool = False
    layer: bool = False  # a part of blocks of its stack (copies: how many)
    nominal: int = 0  # this part's share of the 12*D^2 per layer estimate (3D^2 QKV, D^2 out, 8D^2 FFN)
    active_weights: int | None = None  # per copy, what one token uses when less than all (k of E experts)

    @property
    def per_copy(self) -> int:
        return self.weights + self.biases

    @property
    def total(self) -> int:
        return self.per_copy * self.copies

    @property
    def active(self) -> int:
        """Parameters one token goes through (all of them but for experts it is not routed to)."""
        weights = self.weights if self.active_weights is None else self.active_weights
        return (weights + self.biases) * self.copies


@dataclass(frozen=True)
class Ledger:
    config: ModelConfig
    components: tuple[Component, ...]

    @property
    def total(self) -> int:
        return sum(c.total for c in self.components)

    @property
    def active(self) -> int:
        """Parameters one token goes through: the total less the experts it is not routed to."""
        return sum(c.active for c in self.components)

    def per_layer(self, stack: str | None = None) -> int:
        """Parameters of one block of `stack` (default: the main stack, encoder for seq2seq); the
        mean block where blocks differ (dense and mixture-of-experts FFNs)."""
        stack = stack or ("decoder" if self.config.is_decoder else "encoder")
        layers = {"decoder": self.config.n_decoder_layers if self.config.is_seq2seq else self.config.n_layers,
                  "encoder": self.config.n_layers}[stack]
        return sum(c.total for c in self.components if c.layer and c.stack == stack) // max(layers, 1)

    @property
    def approx_12ld2(self) -> int:
        """12 * L * D^2 over every block (encoder and decoder layers of a seq2seq model)."""
        c = self.config
        return 12 * (c.n_layers + c.n_decoder_layers) * c.d_model ** 2

    def explain_difference(self) -> dict[str, int]:
        """exact - 12*L*D^2, split by cause; the values sum to the difference exactly."""
        parts = {kind: 0 for kind in ("embedding", "head", "norm", "bias", "attention_not_4D2", "ffn_not_8D2",
                                      "cross_attention")}
        for comp in self.components:
            if comp.kind in ("attention", "cross_attention", "ffn"):
                parts["bias"] += comp.biases * comp.copies
            else:
                parts[comp.kind] += comp.biases * comp.copies
            if comp.kind == "attention":
                parts["attention_not_4D2"] += (comp.weights - comp.nominal) * comp.copies
            elif comp.kind == "ffn":
                parts["ffn_not_8D2"] += (comp.weights - comp.nominal) * comp.copies
            elif comp.kind == "cross_attention":
                parts["cross_attention"] += comp.weights * comp.copies
            else:
                parts[comp.kind] += comp.weights * comp.copies
        return parts

    def by_kind(self) -> dict[str, int]:
        totals = {kind: 0 for kind in KINDS}
        for comp in self.components:
            totals[comp.kind] += comp.total
        return totals

    def expert_params(self) -> int:
        """Routed-expert parameters of every mixture layer (all E experts, resident)."""
        return sum(c.total for c in self.components if c.active_weights is not None)

    def lookup_params(self) -> int:
        return sum(c.total for c in self.components if c.lookup)

    def stack_params(self, stack: str) -> int:
        return sum(c.total for c in self.components if c.stack == stack)


def parameter_ledger(config: ModelConfig, *, head: str = "auto") -> Ledger:
    """The ledger of the model `build_model(config, head=head)` builds."""
    parts: list[Component] = []
    if config.is_seq2seq:
        parts += _embeddings(config, copies_of_tables=2)
        parts += _block(config, stack="encoder", layers=config.n_layers, causal=False)
        parts += _block(config, stack="decoder", layers=config.n_decoder_layers, causal=True)
        parts += _final_norms(config, ("encoder", "decoder"))
        parts += _lm_head(config)
    elif config.is_decoder:
        parts += _embeddings(config)
        parts += _block(config, stack="decoder", layers=config.n_layers, causal=True)
        parts += _final_norms(config, ("decoder",))
        parts += _lm_head(config)
    else:
        parts += _embeddings(config)
        parts += _block(config, stack="encoder", layers=config.n_layers, causal=False)
        parts += _final_norms(config, ("encoder",))
        parts += _mlm_head(config) if head == "mlm" else _pooler(config)
    return Ledger(config, tuple(p for p in parts if p.total or p.kind == "head"))


def _norm(config: ModelConfig, name: str, *, copies: int = 1, stack: str, dim: int | None = None) -> Component:
    D = dim or config.d_model
    if config.norm == "rmsnorm":
        what = "(1 + w) RMSNorm weight" if config.norm_unit_offset else "RMSNorm weight"
        return Component(name, f"D ({what})", "norm", D, copies=copies, stack=stack)
    bias = D if config.norm_bias else 0
    return Component(name, "2D (LayerNorm weight + bias)" if bias else "D (LayerNorm weight)", "norm", D, bias,
                     copies=copies, stack=stack)


def _embeddings(config: ModelConfig, *, copies_of_tables: int = 1) -> list[Component]:
    """Token table (shared by both stacks of a seq2seq model), position and segment tables, norm.

    A seq2seq model's source and target embeddings share the token table but each has its own
    learned position table and embedding norm."""
    V, D = config.vocab_size, config.d_model
    untied = not config.tie_embeddings
    parts = [Component("token embedding", "V*D", "embedding", V * D, lookup=untied)]
    if config.position == "learned":
        parts.append(Component("position embedding", "max_seq_len*D", "embedding", config.max_seq_len * D,
                               copies=copies_of_tables, lookup=True))
    if config.type_vocab_size:
        parts.append(Component("segment embedding", "type_vocab_size*D", "embedding", config.type_vocab_size * D,
                               lookup=True))
    if config.embedding_norm:
        parts.append(_norm(config, "embedding norm", copies=copies_of_tables, stack="embed"))
    return parts


def _attention(config: ModelConfig, *, stack: str, layers: int) -> list[Component]:
    sinks = [Component("attention sinks (a logit per head)", "H", "attention", 0, config.n_heads, copies=layers,
                       stack=stack)] if config.attn_sinks else []
    if config.latent:
        return _latent_attention(config, stack=stack, layers=layers)
    return sinks + _projections(config, stack=stack, layers=layers)


def _latent_attention(config: ModelConfig, *, stack: str, layers: int) -> list[Component]:
    """DeepSeek's latent attention: q (through a bottleneck of q_lora_rank), the latent and RoPE key
    (kv_a, its norm), the up-projection of keys and values (kv_b), the output."""
    D, H, R, r = config.d_model, config.n_heads, config.kv_lora_rank, config.rotary_dim
    n, v, Q = config.head_dim - r, config.v_head_dim or config.head_dim, config.q_lora_rank
    out_bias = D if config.attn_out_bias else 0
    q = Component("latent attention Q (q_a, q_b)" if Q else "latent attention Q", "D*Q + Q*H*(n + r)" if Q
                  else "D*H*(n + r)", "attention", D * Q + Q * H * (n + r) if Q else D * H * (n + r), copies=layers,
                  stack=stack, nominal=3 * D * D)
    return [q,
            Component("latent attention norms (RMSNorm of q_a's output and of the latent)", "Q + R", "norm", Q + R,
                      copies=layers, stack=stack),
            Component("latent attention latent + RoPE key (kv_a)", "D*(R + r)", "attention", D * (R + r),
                      copies=layers, stack=stack),
            Component("latent attention K/V up-projection (kv_b)", "R*H*(n + v)", "attention", R * H * (n + v),
                      copies=layers, stack=stack),
            Component("attention output", "H*v*D" + (" + D" if out_bias else ""), "attention", H * v * D, out_bias,
                      copies=layers, stack=stack, nominal=D * D)]


def _projections(config: ModelConfig, *, stack: str, layers: int) -> list[Component]:
    D, q, kv = config.d_model, config.q_dim, config.kv_dim
    qkv_bias = (q + 2 * kv) if config.qkv_bias else 0
    out_bias = D if config.attn_out_bias else 0
    gqa = "" if config.n_kv_heads == config.n_heads else " (GQA: H_kv < H)"
    qk_norm = [Component("q/k norms (RMSNorm per head)", "2*d_h", "norm", 2 * config.head_dim, copies=layers,
                         stack=stack)] if config.qk_norm else []
    return qk_norm + [
        Component("attention Q/K/V", f"D*(H + 2*H_kv)*d_h{gqa}" + (" + biases" if qkv_bias else ""), "attention",
                  D * (q + 2 * kv), qkv_bias, copies=layers, stack=stack, nominal=3 * D * D),
        Component("attention output", "H*d_h*D" + (" + D" if out_bias else ""), "attention", q * D, out_bias,
                  copies=layers, stack=stack, nominal=D * D),
    ]


def _cross_attention(config: ModelConfig, *, layers: int) -> list[Component]:
    D, q, kv = config.d_model, config.q_dim, config.kv_dim
    q_bias, kv_bias = (q, 2 * kv) if config.qkv_bias else (0, 0)
    out_bias = D if config.attn_out_bias else 0
    return [
        _norm(config, "cross-attention norm", copies=layers, stack="decoder"),
        Component("cross-attention Q", "D*H*d_h", "cross_attention", D * q, q_bias, copies=layers, stack="decoder"),
        Component("cross-attention K/V", "D*2*H_kv*d_h", "cross_attention", D * 2 * kv, kv_bias, copies=layers,
                  stack="decoder"),
        Component("cross-attention output", "H*d_h*D", "cross_attention", q * D, out_bias, copies=layers,
                  stack="decoder"),
    ]


def _ffn(config: ModelConfig, *, stack: str, layers: int) -> Component:
    D, F = config.d_model, config.d_ff
    if config.ffn == "glu":
        bias = 2 * F + D if config.ffn_bias else 0
        return Component(f"FFN gate/up/down ({config.activation} GLU)", "3*D*F" + (" + 2F + D" if bias else ""),
                         "ffn", 3 * D * F, bias, copies=layers, stack=stack, nominal=8 * D * D)
    bias = F + D if config.ffn_bias else 0
    return Component(f"FFN up/down ({config.activation} MLP)", "2*D*F" + (" + F + D" if bias else ""), "ffn",
                     2 * D * F, bias, copies=layers, stack=stack, nominal=8 * D * D)


def _moe(config: ModelConfig, *, stack: str, layers: int) -> list[Component]:
    """Router, E experts (k active per token), optional shared expert and its gate."""
    D, E, k, F = config.d_model, config.n_experts, config.n_experts_per_token, config.d_ff_expert
    mats = 3 if config.ffn == "glu" else 2
    kind = f"{config.activation} GLU" if config.ffn == "glu" else f"{config.activation} MLP"
    expert_bias = E * ((mats - 1) * F + D) if config.ffn_bias else 0
    parts = [
        Component("MoE router", "D*E" + (" + E" if config.router_bias else ""), "ffn", D * E,
                  E if config.router_bias else 0, copies=layers, stack=stack),
        Component(f"MoE experts ({E} x {kind}, {k} per token)", f"E*{mats}*D*F_e" + (" + biases" if expert_bias else ""),
                  "ffn", E * mats * D * F, expert_bias, copies=layers, stack=stack, nominal=8 * D * D,
                  active_weights=k * mats * D * F),
    ]
    if config.router_score_bias:
        parts.append(Component("MoE balancing bias (choosing only)", "E", "ffn", 0, E, copies=layers, stack=stack))
    if config.d_ff_shared_expert:
        Fs = config.d_ff_shared_expert
        parts.append(Component(f"MoE shared expert ({kind})", f"{mats}*D*F_shared", "ffn", mats * D * Fs,
                               copies=layers, stack=stack))
    if config.shared_expert_gate:
        parts.append(Component("MoE shared-expert gate", "D", "ffn", D, copies=layers, stack=stack))
    return parts


def _block(config: ModelConfig, *, stack: str, layers: int, causal: bool) -> list[Component]:
    parts = [_norm(config, "attention norm", copies=layers, stack=stack)]
    parts += _attention(config, stack=stack, layers=layers)
    if config.branch_output_norm:
        parts.append(_norm(config, "attention output norm", copies=layers, stack=stack))
    if config.is_seq2seq and causal:
        parts += _cross_attention(config, layers=layers)
    parts.append(_norm(config, "FFN norm", copies=layers, stack=stack))
    moe_layers = config.n_moe_layers if causal and config.is_decoder else 0
    if layers - moe_layers:
        parts.append(_ffn(config, stack=stack, layers=layers - moe_layers))
    if moe_layers:
        parts += _moe(config, stack=stack, layers=moe_layers)
    if config.branch_output_norm:
        parts.append(_norm(config, "FFN output norm", copies=layers, stack=stack))
    return [dataclasses.replace(p, layer=True) for p in parts]


def _final_norms(config: ModelConfig, stacks: tuple[str, ...]) -> list[Component]:
    if not config.final_norm:
        return []
    return [_norm(config, f"final norm ({stack})", stack=stack) for stack in stacks]


def _lm_head(config: ModelConfig) -> list[Component]:
    V, D = config.vocab_size, config.d_model
    weights = 0 if config.tie_embeddings else V * D
    formula = "tied to the token embedding: 0" if config.tie_embeddings else "D*V (untied)"
    bias = V if config.lm_head_bias else 0
    return [Component("LM head", formula + (" + V" if bias else ""), "head", weights, bias, stack="head")]


def _pooler(config: ModelConfig) -> list[Component]:
    if not config.pooler:
        return []
    D = config.d_model
    return [Component("pooler (dense + tanh)", "D*D + D", "head", D * D, D, stack="head")]


def _mlm_head(config: ModelConfig) -> list[Component]:
    D, V = config.d_model, config.vocab_size
    decoder = 0 if config.tie_embeddings else V * D
    return [
        Component("MLM transform", "D*D + D", "head", D * D, D, stack="head"),
        _norm(config, "MLM transform norm", stack="head"),
        Component("MLM decoder", ("tied: 0" if config.tie_embeddings else "D*V") + " + V bias", "head", decoder, V,
                  stack="head"),
    ]
