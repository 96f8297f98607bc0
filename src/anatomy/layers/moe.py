"""Mixture-of-experts FFN: a router picks k of E expert FFNs per token (Mixtral, Qwen-MoE, gpt-oss).

    x [N, D] --router--> logits [N, E] --softmax, top-k--> weights [N, k], experts [N, k]
    out[t] = sum_j weights[t, j] * expert_{experts[t, j]}(x[t])          (+ shared expert(x[t]))

The experts are stored stacked as GGUF does (`gate_up` [E, 2F, D], `down` [E, D, F], optional biases),
or as one compact linear per expert (weights/modules.py's CompactExperts). Two ways compute the same
sum: "loop", the reference, per expert; "grouped", the (token, expert) pairs sorted by expert so each
expert is one matmul. The router logits can be collected for `load_balancing_loss`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anatomy.config import ModelConfig
from anatomy.errors import InputError
from anatomy.layers.ffn import ACTIVATIONS, gating, make_ffn

IMPLEMENTATIONS = ("grouped", "loop")


class MoE(nn.Module):
    """model(x [B, S, D]) -> [B, S, D]; `router_logits`, a list, receives this layer's [B*S, E]."""

    def __init__(self, config: ModelConfig, *, implementation: str = "grouped") -> None:
        super().__init__()
        E, F_e, D = config.n_experts, config.d_ff_expert, config.d_model
        self.n_experts, self.k, self.renormalize = E, config.n_experts_per_token, config.moe_renormalize
        self.rule = Routing(config.router_scoring, config.router_groups, config.router_topk_groups,
                            config.routed_scaling)
        self.glu, self.d_ff = config.ffn == "glu", F_e
        self.act, self.gated = ACTIVATIONS[config.activation], gating(config)
        self.implementation = check_implementation(implementation)
        self.router = nn.Linear(D, E, bias=config.router_bias)
        self.gate_up = nn.Parameter(torch.empty(E, (2 if self.glu else 1) * F_e, D))  # [E, 2F, D] (or [E, F, D])
        self.down = nn.Parameter(torch.empty(E, D, F_e))  # [E, D, F]
        nn.init.normal_(self.gate_up, std=0.02)
        nn.init.normal_(self.down, std=0.02)
        self.gate_up_bias = self.down_bias = None  # each expert's biases (gpt-oss): [E, 2F] and [E, D]
        if config.ffn_bias:
            self.gate_up_bias = nn.Parameter(torch.zeros(E, self.gate_up.shape[1]))
            self.down_bias = nn.Parameter(torch.zeros(E, D))
        self.shared = make_ffn(config, d_ff=config.d_ff_shared_expert) if config.d_ff_shared_expert else None
        self.shared_gate = nn.Linear(D, 1, bias=False) if config.shared_expert_gate else None
        # added to the scores for choosing the experts only (DeepSeek-V3's balancing), not trained by gradients
        self.score_bias = nn.Parameter(torch.zeros(E), requires_grad=False) if config.router_score_bias else None

    def forward(self, x: Tensor, router_logits: list[Tensor] | None = None) -> Tensor:
        B, S, D = x.shape
        flat = x.reshape(B * S, D)  # [N, D]
        logits = self.router(flat)  # [N, E]
        if router_logits is not None:
            router_logits.append(logits)
        weights, experts = route(logits, self.k, renormalize=self.renormalize, rule=self.rule,
                                 score_bias=self.score_bias)  # [N, k] each
        mix = self._loop if self.implementation == "loop" and not x.is_meta else self._grouped
        out = mix(flat, weights.to(x.dtype), experts)  # [N, D]
        if self.shared is not None:
            shared = self.shared(flat)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(flat)) * shared
            out = out + shared
        return out.view(B, S, D)

    def expert(self, e: int, x: Tensor) -> Tensor:
        """Expert e on its tokens x [n, D] -> [n, D]."""
        biased = self.gate_up_bias is not None
        h = _product(self.gate_up[e], x, self.gate_up_bias[e] if biased else None)  # [n, 2F]
        if self.glu:
            gate, up = h.split(self.d_ff, dim=-1)
            h = self.gated(gate, up)
        else:
            h = self.act(h)
        return _product(self.down[e], h, self.down_bias[e] if biased else None)  # [n, D]

    def _loop(self, flat: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """Reference: expert by expert, the tokens (and which of their k choices) that picked it."""
        out = torch.zeros_like(flat)
        for e in range(self.n_experts):
            token, choice = torch.where(experts == e)  # [n] each
            if token.numel():
                y = self.expert(e, flat[token]).to(flat.dtype) * weights[token, choice, None]
                out = out.index_add(0, token, y)
        return out

    def _grouped(self, flat: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """The N*k (token, expert) pairs sorted by expert: each expert reads one contiguous slice."""
        k = experts.shape[1]
        order = experts.flatten().argsort(stable=True)  # [N*k] pair indices, grouped by expert
        token = order // k  # [N*k] the token of each sorted pair
        counts = self._counts(experts)  # tokens per expert
        slices = flat[token].split(counts)  # E x [n_e, D]
        y = torch.cat([self.expert(e, xs) for e, xs in enumerate(slices) if len(xs)]).to(flat.dtype)  # [N*k, D]
        y = y * weights.flatten()[order, None]
        return torch.zeros_like(flat).index_add(0, token, y)


    def _counts(self, experts: Tensor) -> list[int]:
        """How many (token, choice) pairs each expert got. On the meta device (shape traces, FLOP
        counts) there are no values: the pairs are spread evenly, the routing a balanced router gives."""
        if experts.is_meta:
            pairs, E = experts.numel(), self.n_experts
            return [pairs // E + (e < pairs % E) for e in range(E)]
        return torch.bincount(experts.flatten(), minlength=self.n_experts).tolist()


def _product(weight: Tensor | nn.Module, x: Tensor, bias: Tensor | None) -> Tensor:
    """x @ W^T + b for an expert's matrix: a slice of the stacked tensor, or a module holding it
    compact (weights/modules.py's CompactExperts: a CompactLinear, or the kernel plan's layer)."""
    if isinstance(weight, nn.Module):
        y = weight(x)
        return y + bias.to(y.dtype) if bias is not None else y
    return F.linear(x, weight, bias)


@dataclass(frozen=True)
class Routing:
    """How a router's logits choose and weigh experts beyond softmax-then-top-k (DeepSeek-V3: sigmoid
    scores, 8 groups of which the 4 whose two best experts score highest are eligible, weights x 2.5)."""

    scoring: str = "softmax"
    groups: int = 1
    topk_groups: int = 1
    scale: float = 1.0


def route(logits: Tensor, k: int, *, renormalize: bool, rule: Routing = Routing(),
          score_bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The scores of the experts (softmax over them, or each one's sigmoid; in fp32) and the k a token
    picks: (weights [N, k] fp32, expert ids [N, k]). Experts are picked by score + score_bias, among the
    best groups when there are groups; weighted by their scores, divided by their sum with renormalize,
    times rule.scale."""
    scores = logits.float().softmax(dim=-1) if rule.scoring == "softmax" else logits.float().sigmoid()  # [N, E]
    if score_bias is None and rule.groups == 1:
        weights, experts = scores.topk(k, dim=-1)  # [N, k]
    else:
        choice = scores + score_bias if score_bias is not None else scores
        if rule.groups > 1:
            choice = _best_groups(choice, rule.groups, rule.topk_groups)
        experts = choice.topk(k, dim=-1).indices
        weights = scores.gather(1, experts)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights * rule.scale if rule.scale != 1.0 else weights), experts


def _best_groups(choice: Tensor, groups: int, chosen: int) -> Tensor:
    """The scores of experts outside each token's `chosen` best groups (a group: the sum of its two best
    scores) set to -inf."""
    N, E = choice.shape
    grouped = choice.view(N, groups, E // groups)
    group_scores = grouped.topk(min(2, E // groups), dim=-1).values.sum(dim=-1)  # [N, G]
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_scores.topk(chosen, dim=-1).indices, True)
    return grouped.masked_fill(~keep[..., None], float("-inf")).view(N, E)


def load_balancing_loss(router_logits: list[Tensor], n_experts: int, k: int,
                        token_mask: Tensor | None = None) -> Tensor:
    """Switch Transformer's auxiliary loss over every MoE layer's router logits [N, E] (as Mixtral
    and HF transformers compute it): E * sum_e f_e * P_e, where f_e is the fraction of the (token,
    choice) pairs routed to expert e and P_e the mean router probability of e, both over all layers'
    tokens (token_mask [N], when given, leaves padding out). Equals k when the load is uniform."""
    counts = torch.zeros(n_experts, dtype=torch.float32, device=router_logits[0].device)
    prob_sum = torch.zeros_like(counts)
    rows = torch.zeros((), dtype=torch.float32, device=counts.device)
    mask = token_mask.reshape(-1).float() if token_mask is not None else None
    for logits in router_logits:
        probs = logits.float().softmax(dim=-1)  # [N, E]
        chosen = probs.topk(k, dim=-1).indices  # [N, k]
        pair_weight = mask[:, None].expand_as(chosen) if mask is not None else torch.ones_like(chosen, dtype=torch.float32)
        counts = counts.scatter_add(0, chosen.flatten(), pair_weight.flatten())
        prob_sum = prob_sum + (probs * mask[:, None] if mask is not None else probs).sum(dim=0)
        rows = rows + (mask.sum() if mask is not None else probs.shape[0])
    return n_experts * torch.sum((counts / rows) * (prob_sum / rows))


def check_implementation(implementation: str) -> str:
    if implementation not in IMPLEMENTATIONS:
        raise InputError(f"MoE implementation={implementation!r} is not one of {', '.join(map(repr, IMPLEMENTATIONS))}")
    return implementation
