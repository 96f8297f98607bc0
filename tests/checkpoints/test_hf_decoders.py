"""The decoders people run today, against HF transformers itself: Mistral (sliding window), Qwen2
(q/k/v biases, windows on some layers), Qwen3 (q/k norm), Gemma ((1 + w) norms, scaled embeddings,
GeGLU, MQA), Gemma 2 (sandwich norms, soft-capping, query_pre_attn_scalar, alternating windows),
Gemma 3 (q/k norms, a RoPE base of the sliding layers' own, linear scaling on the global ones), SmolLM3
(no RoPE on every 2nd layer here, a window on those, biases), gpt-oss (attention sinks, experts with
biases and a clamped SwiGLU stored interleaved, a router bias, YaRN), DeepSeek-V3 and -V2 (latent attention
with the latent cached, shared experts after a dense layer; V3: sigmoid routing among the best groups,
YaRN's mscale on the scores; V2: softmax routing, queries without a bottleneck),
Phi-3 (fused tensors, partial rotary, window), Mixtral and Qwen2-/Qwen3-MoE (experts, shared expert,
dense layers), Llama with each RoPE scaling and Phi-3 with LongRoPE.

HF builds each tiny model with random weights and saves it; anatomy.load reads it: logits within
1e-4 (fp32) with and without left padding, with prompts longer than the sliding windows; decoding
through the KV cache equals recomputing; anatomy.save writes it back and HF's from_pretrained gets
the same logits, as the same class."""

from __future__ import annotations

import json

import pytest
import torch

import anatomy
from anatomy.checkpoints.hf_config import config_from_hf
from anatomy.errors import ConfigError
from anatomy.inference.engine.kv_cache import KVCache

transformers = pytest.importorskip("transformers")
TOL = 1e-4
V = 101
SMALL = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)


DEEPSEEK = dict(moe_intermediate_size=32, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, v_head_dim=16,
                qk_nope_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1,
                max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _configs() -> dict:
    T = transformers
    longrope = {"rope_type": "longrope", "rope_theta": 1000.0, "partial_rotary_factor": 0.75,
                "short_factor": [1.0 + 0.1 * i for i in range(6)], "long_factor": [2.0 + 0.5 * i for i in range(6)]}
    llama3 = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    return {
        "mistral": (T.MistralForCausalLM, T.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=5)),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(**SMALL, num_key_value_heads=2, use_sliding_window=True,
                                                    sliding_window=5, max_window_layers=1, tie_word_embeddings=True)),
        "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=24, attention_bias=True)),
        "gemma": (T.GemmaForCausalLM, T.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=32)),
        "gemma2": (T.Gemma2ForCausalLM, T.Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=16, sliding_window=5,
                                                       query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                                                       final_logit_softcapping=3.0)),
        "gemma3_text": (T.Gemma3ForCausalLM, T.Gemma3TextConfig(
            **SMALL, num_key_value_heads=2, head_dim=16, sliding_window=5, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
        "smollm3": (T.SmolLM3ForCausalLM, T.SmolLM3Config(**SMALL, num_key_value_heads=2, no_rope_layer_interval=2,
                                                          use_sliding_window=True, sliding_window=5, pad_token_id=0,
                                                          bos_token_id=1, eos_token_id=2, attention_bias=True,
                                                          mlp_bias=True)),
        "gpt_oss": (T.GptOssForCausalLM, T.GptOssConfig(
            **SMALL, num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=5,
            max_position_embeddings=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 8})),
        "deepseek_v3": (T.DeepseekV3ForCausalLM, T.DeepseekV3Config(
            **SMALL, **DEEPSEEK, num_key_value_heads=4, n_shared_experts=1, routed_scaling_factor=2.5, n_group=4,
            topk_group=2, rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "mscale": 1.0,
                                           "mscale_all_dim": 1.0, "original_max_position_embeddings": 8})),
        "deepseek_v2": (T.DeepseekV2ForCausalLM, T.DeepseekV2Config(**SMALL, **{**DEEPSEEK, "q_lora_rank": None},
                                                                    n_shared_experts=2)),
        "phi3": (T.Phi3ForCausalLM, T.Phi3Config(**SMALL, num_key_value_heads=2, sliding_window=6, pad_token_id=0,
                                                 eos_token_id=2, rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": 10000.0,
                                                                                  "partial_rotary_factor": 0.5})),
        "mixtral": (T.MixtralForCausalLM, T.MixtralConfig(**SMALL, num_key_value_heads=2, num_local_experts=8,
                                                          num_experts_per_tok=2, sliding_window=7)),
        "qwen2_moe": (T.Qwen2MoeForCausalLM, T.Qwen2MoeConfig(**SMALL, num_key_value_heads=2, num_experts=4,
                                                              num_experts_per_tok=2, moe_intermediate_size=24,
                                                              shared_expert_intermediate_size=40, mlp_only_layers=[1])),
        "qwen3_moe": (T.Qwen3MoeForCausalLM, T.Qwen3MoeConfig(**SMALL, num_key_value_heads=2, num_experts=4,
                                                              num_experts_per_tok=2, moe_intermediate_size=24,
                                                              norm_topk_prob=True, head_dim=16)),
        "llama-llama3": (T.LlamaForCausalLM, T.LlamaConfig(**SMALL, num_key_value_heads=2, rope_parameters=llama3)),
        "llama-yarn": (T.LlamaForCausalLM, T.LlamaConfig(**SMALL, max_position_embeddings=32, rope_parameters={
            "rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 8})),
        "llama-linear": (T.LlamaForCausalLM, T.LlamaConfig(**SMALL, rope_parameters={
            "rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0})),
        "llama-dynamic": (T.LlamaForCausalLM, T.LlamaConfig(**SMALL, max_position_embeddings=8, rope_parameters={
            "rope_type": "dynamic", "rope_theta": 1000.0, "factor": 2.0})),
        "phi3-longrope": (T.Phi3ForCausalLM, T.Phi3Config(**SMALL, max_position_embeddings=32,
                                                          original_max_position_embeddings=8, pad_token_id=0,
                                                          eos_token_id=2, rope_parameters=longrope)),
    }


FAMILIES = list(_configs())
# Dynamic NTK and LongRoPE choose their frequencies by how far a pass reaches: a prefix shorter than
# the original context rotates with the short rule, the whole sequence with the long one (HF too).
LENGTH_DEPENDENT = {"llama-dynamic", "phi3-longrope"}


@pytest.fixture(scope="module")
def hf_decoders(tmp_path_factory):
    """{family: (HF model in eval mode, the directory HF saved it to)}."""
    torch.manual_seed(1)
    out = {}
    for family, (cls, config) in _configs().items():
        model = cls(config)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)  # norms off one, biases off zero
        directory = tmp_path_factory.mktemp(family)
        model.save_pretrained(directory)
        out[family] = (model.eval(), directory)
    return out


def _inputs(masked: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    ids = torch.randint(3, V - 1, (3, 12), generator=torch.Generator().manual_seed(2))
    if not masked:
        return ids, None
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    mask[2, :7] = 0
    return ids, mask


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None) -> float:
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    return float((a - b).abs().max())


@pytest.mark.parametrize("masked", [False, True], ids=["no-padding", "padding"])
@pytest.mark.parametrize("family", FAMILIES)
def test_load_matches_hf(hf_decoders, family, masked):
    hf_model, directory = hf_decoders[family]
    ours = anatomy.load(directory)
    ids, mask = _inputs(masked)
    with torch.no_grad():
        expected, got = hf_model(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask)
    assert _max_diff(got, expected, mask) <= TOL


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in LENGTH_DEPENDENT])
@torch.no_grad()
def test_cached_decode_equals_recompute(hf_decoders, family):
    """Left-padded prefill of 4 slots, then 8 decode steps through the static KV cache (past every
    sliding window): each step's logits equal those of the full forward at that position."""
    model = anatomy.load(hf_decoders[family][1])
    ids, mask = _inputs(masked=True)
    full = model(ids, attention_mask=mask)
    cache = KVCache(model.config, batch=3, max_len=12)
    logits = model(ids[:, :4], attention_mask=mask, cache=cache, input_pos=torch.arange(4))
    steps = [logits[:, -1]]
    for t in range(4, 12):
        steps.append(model(ids[:, t:t + 1], attention_mask=mask, cache=cache, input_pos=torch.tensor([t]))[:, -1])
    rows = mask[:, 3:].bool()  # positions 3..11 of every row that holds a real token
    assert _max_diff(torch.stack(steps, 1), full[:, 3:], rows) <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_save_then_hf_from_pretrained(hf_decoders, tmp_path, family):
    hf_model, directory = hf_decoders[family]
    ours = anatomy.load(directory)
    anatomy.save(ours, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == [type(hf_model).__name__]
    reloaded = type(hf_model).from_pretrained(tmp_path / "out").eval()
    ids, mask = _inputs(masked=True)
    with torch.no_grad():
        assert _max_diff(reloaded(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask), mask) <= TOL
    assert anatomy.load(tmp_path / "out").config == ours.config


def test_fields_choose_the_class_a_fresh_model_is_written_as(hf_decoders, tmp_path):
    """A config built from fields, never loaded, is written as the plainest class that expresses it."""
    from anatomy.checkpoints.hf_config import hf_family

    for family in ("mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "smollm3", "mixtral", "qwen2_moe",
                   "qwen3_moe", "gpt_oss", "deepseek_v2", "deepseek_v3"):
        config = anatomy.load_config(hf_decoders[family][1])
        assert hf_family(config) == family
    assert hf_family(anatomy.load_config(hf_decoders["phi3"][1])) == "phi3"  # partial rotary dims


@torch.no_grad()
def test_mixtral_decode_step_leaves_experts_idle(hf_decoders):
    """One decode token picks 2 of 8 experts per layer: the other experts get no token at all."""
    hf_model, directory = hf_decoders["mixtral"]
    ours = anatomy.load(directory)
    ids = torch.randint(3, V - 1, (1, 6), generator=torch.Generator().manual_seed(3))
    cache = KVCache(ours.config, batch=1, max_len=6)
    ours(ids[:, :5], cache=cache, input_pos=torch.arange(5))
    router = []
    step = ours(ids[:, 5:], cache=cache, input_pos=torch.tensor([5]), router_logits=router)
    used = {int(e) for logits in router for e in logits.topk(2, dim=-1).indices.flatten()}
    assert len(router) == 2 and len(used) < 8
    assert _max_diff(step[:, -1], hf_model(ids).logits[:, -1], None) <= TOL


# -- what HF configs anatomy refuses ---------------------------------------------------------------
def _mixtral_dict() -> dict:
    return {"model_type": "mixtral", **SMALL, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}


@pytest.mark.parametrize("change, message", [
    ({"num_experts_per_tok": 5}, "n_experts_per_token=5 must be in \\[1, n_experts=4\\].*num_experts_per_tok"),
    ({"rope_parameters": {"rope_type": "ntk-by-parts", "rope_theta": 1e4}},
     "rope_parameters.rope_type='ntk-by-parts' is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}}, "lacks 'low_freq_factor'"),
    ({"router_jitter_noise": 0.1}, "router_jitter_noise=0.1 is not supported"),
    ({"model_type": "gemma", "use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
    ({"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                 "partial_rotary_factor": 0.5}}, "partial_rotary_factor=0.5"),
    ({"model_type": "qwen2", "layer_types": ["full_attention", "chunked_attention"]}, "'chunked_attention'"),
    ({"model_type": "smollm3", "no_rope_layers": [1]}, "no_rope_layers=\\[1\\] must list 1 \\(RoPE\\) or 0 "
                                                       "\\(none\\) for each of the 2 layers"),
    ({"model_type": "smollm3", "no_rope_layer_interval": 0}, "no_rope_layer_interval=0 must be a positive integer"),
    ({"model_type": "gemma3_text", "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                       "sliding_attention": {"rope_type": "su2"}},
      "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4}, "rope_type='su2'"),
])
def test_unrepresentable_configs_are_refused_naming_the_field(change, message):
    with pytest.raises(ConfigError, match=message):
        config_from_hf({**_mixtral_dict(), **change})


def test_a_config_no_class_expresses_is_refused_on_save(tmp_path):
    config = anatomy.get_preset("llama-7b", n_layers=2, d_model=64, n_heads=4, d_ff=96, vocab_size=V, n_experts=4,
                                n_experts_per_token=2, moe_layers=(1,))  # dense layer 0, no shared expert, no q/k norm
    with pytest.raises(ConfigError, match="no HF class can express this config; the closest, LlamaForCausalLM, "
                                          r"needs: n_experts=4 \(needs 0\)"):
        anatomy.save(anatomy.build_model(config), tmp_path / "x")


@torch.no_grad()
def test_gemma3_multimodal_checkpoints_give_their_language_model(tmp_path):
    """Gemma 3 4B and up ship as Gemma3ForConditionalGeneration (a vision tower beside the language
    model, tensors under language_model.): anatomy reads the language model, with HF's text logits, and
    writes it as Gemma3ForCausalLM."""
    T = transformers
    text = T.Gemma3TextConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, intermediate_size=96, head_dim=16, sliding_window=5,
                              query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"])
    vision = T.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=28, patch_size=14)
    torch.manual_seed(5)
    hf = T.Gemma3ForConditionalGeneration(T.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                                         image_token_index=299, boi_token_index=297,
                                                         eoi_token_index=298)).eval()
    for p in hf.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(tmp_path / "mm")
    ours = anatomy.load(tmp_path / "mm")
    ids = torch.randint(3, 290, (2, 12), generator=torch.Generator().manual_seed(6))
    assert _max_diff(ours(ids), hf(input_ids=ids).logits, None) <= TOL
    anatomy.save(ours, tmp_path / "text")
    reloaded = T.Gemma3ForCausalLM.from_pretrained(tmp_path / "text").eval()
    assert _max_diff(reloaded(ids).logits, ours(ids), None) <= TOL
    with pytest.raises(ConfigError, match="gemma3 text_config=None must be an object"):
        config_from_hf({"model_type": "gemma3"})


@pytest.mark.parametrize("family", ["gemma3_text", "smollm3", "gpt_oss", "deepseek_v3", "deepseek_v2"])
@torch.no_grad()
def test_the_2026_families_give_hfs_64_greedy_tokens(tmp_path, family):
    """HF's greedy generate from a 12-token prompt (past every window of 5), 64 new tokens, equals anatomy's
    greedy decode through its static KV cache (every slot kept, the windows applied by the masks), and each
    cached step's logits are those of one full forward over the whole sequence within 1e-5."""
    cls, config = _configs()[family]
    config.max_position_embeddings = 128
    torch.manual_seed(3)
    hf = cls(config).eval()
    for p in hf.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    hf.generation_config.eos_token_id = None  # 64 tokens whatever they are
    hf.save_pretrained(tmp_path)
    ours = anatomy.load(tmp_path)
    prompt = torch.randint(3, V - 1, (1, 12), generator=torch.Generator().manual_seed(4))
    expected = hf.generate(prompt, max_new_tokens=64, do_sample=False, pad_token_id=0)[0, 12:].tolist()
    cache = KVCache(ours.config, batch=1, max_len=12 + 64)
    assert all(layer.max_len == cache.max_len for layer in cache)  # windowed layers hold every slot too
    steps = [ours(prompt, cache=cache, input_pos=torch.arange(12))[:, -1]]
    tokens: list[int] = []
    for t in range(64):
        tokens.append(int(steps[-1].argmax(-1)))
        steps.append(ours(torch.tensor([[tokens[-1]]]), cache=cache, input_pos=torch.tensor([12 + t]))[:, -1])
    assert tokens == expected
    full = ours(torch.cat([prompt, torch.tensor([tokens])], 1))[0, 11:]
    assert (torch.cat(steps) - full).abs().max() <= 1e-5
