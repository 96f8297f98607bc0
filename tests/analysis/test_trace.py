"""The shape trace against seed 003's prefill and decode examples, and against the analytic FLOPs."""

from __future__ import annotations

from anatomy.analysis.flops import layer_flops
from anatomy.analysis.trace import trace
from anatomy.presets import get_preset


def _outputs(rows, module, op):
    return [r.output for r in rows if r.module == module and r.op == op]


def test_prefill_matches_seed_003_example():
    rows = trace(get_preset("llama-7b"), phase="prefill", batch=1, seq=10, context=10)
    qkv = next(r for r in rows if r.module == "stack.blocks.0.attn.qkv")
    assert qkv.inputs[0] == [1, 10, 4096] and qkv.output == [1, 10, 3 * 4096]
    assert _outputs(rows, "stack.blocks.0.attn", "transpose")[:3] == [[1, 32, 10, 128]] * 3  # Q, K, V
    scores = next(r for r in rows if r.note.startswith("scores"))
    assert scores.output == [1, 32, 10, 10]
    assert _outputs(rows, "stack.blocks.0.attn.out", "linear") == [[1, 10, 4096]]
    assert _outputs(rows, "stack.blocks.0.ffn.down", "linear") == [[1, 10, 4096]]
    assert _outputs(rows, "lm_head", "linear") == [[1, 1, 32000]]  # generation: last position only
    assert not any(r.module.startswith("stack.blocks.1") for r in rows)  # one block, plus the two ends


def test_decode_scores_are_b_h_1_t():
    rows = trace(get_preset("llama-7b"), phase="decode", batch=2, seq=10, context=37)
    assert next(r for r in rows if r.module == "stack.embed.tokens").output == [2, 1, 4096]
    scores = [r for r in rows if r.note.startswith("scores")]
    assert scores[0].output == [2, 32, 1, 37]
    assert scores[0].inputs == [[2, 32, 1, 128], [2, 32, 128, 37]]  # the new query against T cached keys
    writes = [r for r in rows if r.op == "index_copy_"]
    # the new K and V written to the paged pools, a row [H_kv, d_h] per token and batch row (B * 1 of them)
    assert len(writes) == 2 and writes[0].inputs[-1] == [2, 32, 128]


def test_trace_flops_of_one_block_equal_the_analytic_layer():
    config = get_preset("llama-3-8b")
    for phase, q_len, kv_len in (("prefill", 16, 16), ("decode", 1, 40)):
        rows = trace(config, phase=phase, batch=3, seq=16, context=40)
        block = sum(r.flops for r in rows if r.module.startswith("stack.blocks.0"))
        assert block == sum(layer_flops(config, batch=3, q_len=q_len, kv_len=kv_len).values())


def test_gqa_rows_name_the_logical_score_shape():
    rows = trace(get_preset("llama-3-8b"), phase="prefill", batch=1, seq=10, context=10)
    scores = next(r for r in rows if r.note.startswith("scores"))
    assert scores.output == [1, 8, 40, 10]  # 4 query heads per kv head folded into the rows
    assert "logical [1, 32, 10, 10]" in scores.note


def test_views_move_no_bytes_and_matmuls_move_their_operands():
    rows = trace(get_preset("gpt2"), phase="prefill", batch=1, seq=8, context=8, dtype="f32")
    assert all(r.bytes == 0 for r in rows if r.op in ("view", "transpose", "split"))
    qkv = next(r for r in rows if r.module == "stack.blocks.0.attn.qkv")
    assert qkv.bytes == 4 * (8 * 768 + 768 * 2304 + 2304 + 8 * 2304)  # x, W, b read; y written


def test_encoder_has_no_decode_trace_and_seq2seq_has_cross_attention():
    assert trace(get_preset("bert-base"), phase="decode", batch=1, seq=8, context=8) == []
    rows = trace(get_preset("transformer-base"), phase="decode", batch=1, seq=9, context=5)
    cross = [r for r in rows if r.note.startswith("scores") and "cross_attn" in r.module]
    assert cross[0].output == [1, 8, 1, 9]  # the new target token against 9 source positions


def test_moe_block_trace_shows_the_router_and_k_experts():
    config = get_preset("mixtral-8x7b", n_layers=2)
    rows = trace(config, phase="decode", batch=1, seq=8, context=64, dtype="bf16")
    linears = [r for r in rows if r.module.endswith("ffn") and r.op == "linear"]
    router = [r for r in rows if r.module.endswith("ffn.router")]
    assert router[0].output == [1, 8] and len(linears) == 2 * 2  # gate_up and down of 2 experts
    assert sum(r.flops for r in linears) == 2 * 2 * 3 * 4096 * 14336
