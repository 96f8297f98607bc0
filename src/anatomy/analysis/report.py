"""`anatomy inspect`'s report: one dict with stable keys (the --json output, documented in
docs/anatomy.md), and its renderings as rich tables, Markdown and a matplotlib figure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from anatomy import dtypes
from anatomy.analysis import diagram, flops, memory, params, roofline, trace
from anatomy.analysis.hardware import Hardware
from anatomy.analysis.speculative import SpeculativeOptions, speculative_report
from anatomy.config import ModelConfig


@dataclass(frozen=True)
class Options:
    batch: int = 1
    seq: int = 512
    context: int = 2048
    dtype: str = "bf16"
    kv_dtype: str | None = None  # default: the compute dtype
    tokens: float | None = None
    gpus: int = 1
    mfu: float = 0.4
    speculative: SpeculativeOptions | None = None  # predict speculative decoding at this context
    layout: Any = None  # a parallel.Layout of several ranks: the per-rank anatomy and communication
    interconnect: Any = None  # a hardware.Interconnect, with a layout: between the ranks of a stage
    stage_interconnect: Any = None  # ... and between the stages (default: the same)
    lora: Any = None  # a lora.LoraConfig: the adapter's parameters, bytes, FLOPs and training-state saving

    @property
    def compute_dtype(self) -> str:
        return memory.compute_dtype(self.dtype)

    @property
    def cache_dtype(self) -> str:
        return self.kv_dtype or self.compute_dtype


def build_report(config: ModelConfig, *, name: str, options: Options, hardware: Hardware,
                 stored: dict[str, Any] | None = None) -> dict[str, Any]:
    ledger = params.parameter_ledger(config)
    report = {
        "model": {"name": name, "architecture": config.architecture, "config": _config_summary(config)},
        "options": {"batch": options.batch, "seq": options.seq, "context": options.context, "dtype": options.dtype,
                    "kv_dtype": options.cache_dtype, "compute_dtype": options.compute_dtype,
                    "hardware": hardware.name},
        "diagram": _diagram(config),
        "params": _params(ledger),
        "flops": _flops(config, options),
        "memory": _memory(config, ledger, options),
        "roofline": _roofline(config, ledger, options, hardware),
        "trace": _trace(config, options),
    }
    if options.tokens is not None:
        report["training"] = _training(config, ledger, options, hardware)
    if options.speculative is not None and not config.is_encoder:
        report["speculative"] = speculative_report(config, hardware, options.speculative, context=options.context,
                                                   weight_dtype=options.dtype, kv_dtype=options.cache_dtype,
                                                   compute_dtype=options.compute_dtype)
    if options.layout is not None:
        from anatomy.analysis.parallel import parallel_report

        report["parallel"] = parallel_report(config, options.layout, hardware=hardware, link=options.interconnect,
                                             batch=options.batch, seq=options.seq, context=options.context,
                                             weight_dtype=options.dtype, kv_dtype=options.cache_dtype,
                                             compute_dtype=options.compute_dtype,
                                             stage_link=options.stage_interconnect)
        report["options"]["interconnect"] = report["parallel"]["interconnect"]["name"]
    if options.lora is not None:
        from anatomy.analysis.lora import lora_report

        report["lora"] = lora_report(config, options.lora, total_params=ledger.total, dtype=options.dtype,
                                     compute_dtype=options.compute_dtype)
    if stored is not None:  # the real bytes of a checkpoint or loaded model, next to the analytic ones
        report["memory"]["stored_weights"] = stored
    return report


def _config_summary(c: ModelConfig) -> dict[str, Any]:
    keys = ("vocab_size", "d_model", "n_layers", "n_decoder_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff",
            "norm", "norm_position", "ffn", "activation", "position", "max_seq_len", "tie_embeddings",
            "rope_theta", "embedding_scale")
    extras = ("sliding_window", "n_experts", "n_experts_per_token", "d_ff_expert", "d_ff_shared_expert")
    return {k: getattr(c, k) for k in keys} | {k: getattr(c, k) for k in extras if getattr(c, k)}


def _diagram(config: ModelConfig) -> dict[str, str]:
    shape = diagram.describe(config)
    return {"text": diagram.text(shape), "mermaid": diagram.mermaid(shape)}


def _params(ledger: params.Ledger) -> dict[str, Any]:
    c = ledger.config
    out = {
        "total": ledger.total,
        "per_layer": ledger.per_layer(),
        "components": [{"name": p.name, "formula": p.formula, "kind": p.kind, "stack": p.stack,
                        "per_copy": p.per_copy, "copies": p.copies, "total": p.total} for p in ledger.components],
        "by_kind": ledger.by_kind(),
        "approx_12ld2": ledger.approx_12ld2,
        "difference": ledger.total - ledger.approx_12ld2,
        "difference_explained": ledger.explain_difference(),
    }
    if c.is_seq2seq:
        out["per_decoder_layer"] = ledger.per_layer("decoder")
    if c.n_experts:
        out["active"] = ledger.active  # what one token goes through: k of E experts
        out["experts"] = ledger.expert_params()
    return out


def _flops(config: ModelConfig, o: Options) -> dict[str, Any]:
    fwd = flops.forward_flops(config, batch=o.batch, seq=o.seq)
    causal = flops.forward_flops(config, batch=o.batch, seq=o.seq, causal_halving=True)
    prefill = flops.forward_flops(config, batch=o.batch, seq=o.seq, last_only=True)
    training = flops.training_flops_per_token(config, seq=o.seq)
    measured = _flop_counter_forward(config, o)
    out = {
        "forward": fwd.total,
        "forward_per_token": fwd.per_token,
        "forward_causal_halved": causal.total,
        "forward_without_attention_matmuls": fwd.total - fwd.attention_matmuls,
        "parts": fwd.parts,
        "parts_causal_halved": causal.parts,
        "per_layer": fwd.per_layer,
        "per_layer_total": sum(fwd.per_layer.values()),
        "prefill_last_position_head": prefill.total,
        "training_per_token": training["three_forward"],
        "training_per_token_6n": training["six_n"],
        "training_attention_term_per_token": training["attention_term"],
        "flop_counter_forward": measured,
        "flop_counter_matches": measured == fwd.total,
    }
    if not config.is_encoder:
        out["decode_step"] = flops.decode_flops(config, batch=o.batch, context=o.context, source_len=o.seq).total
    return out


def _flop_counter_forward(config: ModelConfig, o: Options) -> int:
    """FlopCounterMode's count of the same forward, on the meta device."""
    from anatomy.models import build_model

    model = build_model(config, device="meta").to("meta").eval()
    ids = torch.zeros(o.batch, o.seq, dtype=torch.long, device="meta")
    return flops.count_flops(lambda: model(ids, ids) if config.is_seq2seq else model(ids))


def _memory(config: ModelConfig, ledger: params.Ledger, o: Options) -> dict[str, Any]:
    sdpa = memory.training_activations(config, batch=o.batch, seq=o.seq, dtype=o.compute_dtype, backend="sdpa")
    eager = memory.training_activations(config, batch=o.batch, seq=o.seq, dtype=o.compute_dtype, backend="eager")
    out = {
        "weights_bytes": memory.weights_bytes(ledger.total, o.dtype),
        "weights_bytes_by_dtype": {d: memory.weights_bytes(ledger.total, d) for d in dtypes.ALL},
        "kv_cache_bytes_per_token": memory.kv_bytes_per_token(config, o.cache_dtype),
        "kv_cache_bytes": memory.kv_cache_bytes(config, batch=o.batch, tokens=o.context, kv_dtype=o.cache_dtype),
        "naive_scores_bytes_per_layer": memory.naive_scores_bytes(config, batch=o.batch, seq=o.seq,
                                                                  dtype=o.compute_dtype),
        "fused_attention_bytes_per_layer": memory.fused_attention_bytes(config, batch=o.batch, seq=o.seq),
        "activations": {
            "fused_attention": {"total": sdpa.total, "per_block": sdpa.per_block, "checkpointed": sdpa.checkpointed},
            "naive_attention": {"total": eager.total, "per_block": eager.per_block,
                                "checkpointed": eager.checkpointed},
        },
        "training_state_bytes": memory.training_state(ledger.total, dtype=o.compute_dtype).total,
    }
    if config.sliding_window is not None:  # what a cache keeping every position would hold instead
        out["kv_cache_bytes_without_windows"] = memory.kv_cache_bytes(config, batch=o.batch, tokens=o.context,
                                                                      kv_dtype=o.cache_dtype, windowed=False)
    if config.n_experts:
        out["experts"] = _expert_bytes(config, ledger, o)
    return out


def _expert_bytes(config: ModelConfig, ledger: params.Ledger, o: Options) -> dict[str, Any]:
    """Expert weights: all resident, but a decode step reads only those its tokens are routed to."""
    resident = ledger.expert_params()
    per_expert = resident // config.n_experts
    touched = roofline.experts_touched(config, o.batch)
    return {"resident_bytes": memory.weights_bytes(resident, o.dtype),
            "read_per_token_bytes": memory.weights_bytes(per_expert * config.n_experts_per_token, o.dtype),
            "experts_touched_per_layer_decode_step": touched,
            "read_per_decode_step_bytes": round(memory.weights_bytes(per_expert, o.dtype) * touched)}


def _roofline(config: ModelConfig, ledger: params.Ledger, o: Options, hw: Hardware) -> dict[str, Any]:
    common = {"weight_dtype": o.dtype, "kv_dtype": o.cache_dtype, "compute_dtype": o.compute_dtype}
    points = [roofline.prefill_point(config, ledger, hw, batch=o.batch, seq=o.seq, **common)]
    out: dict[str, Any] = {"hardware": {"name": hw.name, "peak_flops": hw.peak(o.compute_dtype),
                                        "bandwidth": hw.bandwidth, "source": hw.source, "notes": hw.notes}}
    if not config.is_encoder:
        points.append(roofline.decode_point(config, ledger, hw, batch=o.batch, context=o.context, source_len=o.seq,
                                            **common))
        out["decode_compute_bound_batch"] = roofline.decode_compute_bound_batch(
            config, ledger, hw, context=o.context, source_len=o.seq, **common)
    for p in points:
        out[p.phase] = {"flops": p.flops, "bytes": p.bytes, "intensity": p.intensity, "ridge": p.ridge,
                        "bound": p.bound, "time_s": p.time_s, "time_per_token_s": p.time_per_token_s,
                        "tokens_per_s": p.tokens_per_s}
    return out


def _training(config: ModelConfig, ledger: params.Ledger, o: Options, hw: Hardware) -> dict[str, Any]:
    per_token = flops.training_flops_per_token(config, seq=o.seq)
    peak = hw.peak(o.compute_dtype)
    six_n = flops.training_time(total_flops=per_token["six_n"] * o.tokens, peak_flops=peak, mfu=o.mfu, gpus=o.gpus)
    full = flops.training_time(total_flops=per_token["three_forward"] * o.tokens, peak_flops=peak, mfu=o.mfu,
                               gpus=o.gpus)
    return {"tokens": o.tokens, "gpus": o.gpus, "mfu": o.mfu, "peak_flops": peak,
            "total_flops": six_n.total_flops, "gpu_seconds": six_n.gpu_seconds, "gpu_hours": six_n.gpu_hours,
            "gpu_days": six_n.gpu_days, "wall_days": six_n.wall_days,
            "total_flops_with_attention": full.total_flops, "wall_days_with_attention": full.wall_days}


def _trace(config: ModelConfig, o: Options) -> list[dict[str, Any]]:
    rows = []
    for phase in ("prefill", "decode"):
        rows += [r.to_dict() for r in trace.trace(config, phase=phase, batch=o.batch, seq=o.seq, context=o.context,
                                                  dtype=o.compute_dtype)]
    return rows
