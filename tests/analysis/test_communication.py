"""The communication term: the collectives of a step, their bytes and time on the named links, each
rank's weights and KV cache, and the roofline that adds the talking; checked against hand arithmetic
(the figures of llama-70b on 8 x H100). That the collectives are the ones a run issues is checked in
tests/parallel/test_ranks.py."""

from __future__ import annotations

import json

import pytest

from anatomy import get_preset
from anatomy.analysis.communication import issued_by, step_collectives
from anatomy.analysis.hardware import INTERCONNECTS, get_hardware, get_interconnect
from anatomy.analysis.params import parameter_ledger
from anatomy.analysis.parallel import held_params, parallel_report
from anatomy.cli import main
from anatomy.errors import InputError
from anatomy.parallel.layout import Layout

LLAMA_70B = get_preset("llama-70b")  # 80 layers, D 8192, 64 heads, 8 kv heads, V 32000


def test_a_tensor_parallel_decode_step_of_llama_70b_on_8_ranks():
    ops = step_collectives(LLAMA_70B, Layout(tp=8), batch=1, tokens=1, rows=(1,), dtype="bf16")
    reduces = [op for op in ops if op.kind == "all_reduce"]
    assert len(reduces) == 1 + 2 * 80  # the token table, then attention output and FFN down per block
    assert {op.shape for op in reduces} == {(1, 1, 8192)} and reduces[0].message_bytes == 8192 * 2
    gather = ops[-1]
    assert (gather.kind, gather.shape, gather.ranks) == ("gather", (1, 4000), tuple(range(8)))
    link = INTERCONNECTS["nvlink4"]
    assert reduces[0].wire_bytes == 2 * 7 / 8 * 16384
    assert reduces[0].time_s(link) == pytest.approx(3.6e-6 + 14 * 0.47e-6 + 2 * 7 / 8 * 16384 / 450e9)
    assert gather.time_s(link) == pytest.approx(3.6e-6 + 7 * 0.47e-6 + 7 * 8000 / 450e9)


def test_pipeline_sends_and_what_each_rank_issues():
    ops = step_collectives(LLAMA_70B, Layout(tp=2, pp=2), batch=2, tokens=3, rows=(2,), dtype="bf16")
    sends = [op for op in ops if op.kind == "send"]
    assert [(op.where, op.ranks, op.shape) for op in sends] == [
        ("stage 0 -> 1", (0, 2), (2, 3, 8192)), ("stage 0 -> 1", (1, 3), (2, 3, 8192)),
        ("lm_head -> rank 0", (2, 0), (2, 32000))]
    rank2 = issued_by(ops, 2)
    assert rank2[0] == ("recv", "stage 0 -> 1", (2, 3, 8192), 2 * 3 * 8192 * 2)
    assert [k for k, *_ in rank2].count("all_reduce") == 2 * 40  # the second stage's 40 blocks, no table
    assert rank2[-2][0] == "gather" and rank2[-1][:2] == ("send", "lm_head -> rank 0")
    assert issued_by(ops, 0)[-1][:2] == ("recv", "lm_head -> rank 0")


def test_where_llama_70b_decode_on_8_h100_spends_its_time():
    """bf16 weights: 69.0 G parameters / 8 ranks = 17.2 GB per rank, 5.1 ms of HBM reads at 3.35 TB/s;
    161 all-reduces of 16 KiB at ~10.2 us each on NVLink: ~1.7 ms, a quarter of the step."""
    report = parallel_report(LLAMA_70B, Layout(tp=8), hardware=get_hardware("h100-sxm"),
                             link=get_interconnect("nvlink4"), batch=1, seq=512, context=2048, weight_dtype="bf16",
                             kv_dtype="bf16", compute_dtype="bf16")
    rank = report["ranks"][0]
    assert rank["weights_bytes"] == pytest.approx(parameter_ledger(LLAMA_70B).total * 2 / 8, rel=1e-3)
    assert rank["kv_cache_bytes"] == 2 * 80 * 1 * 128 * 2048 * 2  # one kv head per rank
    decode = report["decode"]
    stage = decode["stages"][0]
    assert stage["bound"] == "memory" and stage["memory_s"] == pytest.approx(5.15e-3, rel=0.01)
    assert decode["communication_s"] == pytest.approx(161 * 10.24e-6 + 7.0e-6, rel=0.01)
    assert 0.2 < decode["communication_share"] < 0.3
    pcie = parallel_report(LLAMA_70B, Layout(tp=8), hardware=get_hardware("h100-sxm"), link=get_interconnect("pcie"),
                           batch=1, seq=512, context=2048, weight_dtype="bf16", kv_dtype="bf16",
                           compute_dtype="bf16")
    assert pcie["decode"]["communication_share"] > decode["communication_share"]
    assert pcie["prefill"]["time_s"] > report["prefill"]["time_s"]


@pytest.mark.parametrize("preset", ["llama-7b", "gpt2", "mixtral-8x7b"])
def test_the_ranks_hold_the_whole_model_between_them(preset):
    """One rank holds the ledger's parameters; N ranks hold all of them, each ~1/N of the split ones. A
    tied model's two pipeline stages both hold its token table (the last one reads it as the head):
    GPT-2's 38.6 M-parameter table is 31% of its 124 M."""
    config = get_preset(preset)
    ledger = parameter_ledger(config)
    total = ledger.total
    assert held_params(config, Layout(), 0) == total
    pp = [held_params(config, Layout(pp=2), r) for r in range(2)]
    table = config.vocab_size * config.d_model if config.tie_embeddings else 0
    assert sum(pp) == total + table and max(pp) < 0.6 * total + table
    tp = [held_params(config, Layout(tp=4), r) for r in range(4)]
    assert sum(tp) >= total and max(tp) < 0.3 * total


def test_every_interconnect_cites_its_figures():
    for link in INTERCONNECTS.values():
        assert link.bandwidth > 0 and link.step_latency_s > 0 and "tuning.cc" in link.source
    assert get_interconnect("nvlink") is INTERCONNECTS["nvlink4"]
    assert get_interconnect("infiniband").bandwidth == 50e9
    with pytest.raises(InputError, match="unknown --interconnect 'nvlnk'; did you mean"):
        get_interconnect("nvlnk")


def test_inspect_reports_the_parallel_anatomy(capsys):
    assert main(["inspect", "--model", "llama-70b", "--tensor-parallel", "8", "--context", "2048", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    p = report["parallel"]
    assert p["layout"] == {"tensor_parallel": 8, "pipeline_parallel": 1, "ranks": 8}
    assert p["interconnect"]["name"] == "nvlink4" and len(p["ranks"]) == 8
    assert {c["role"] for c in p["decode"]["collectives"]} == {"token table", "attention output", "FFN down",
                                                                "LM head"}
    assert main(["inspect", "--model", "llama-70b", "--tensor-parallel", "4", "--pipeline-parallel", "2",
                 "--interconnect", "ib-ndr400", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "Roofline with communication on ib-ndr400" in out and "pipelined" in out


@pytest.mark.parametrize("args,message", [
    (["--tensor-parallel", "3"], "n_heads=64 is not divisible by --tensor-parallel-size 3"),
    (["--interconnect", "pcie5"], "--interconnect needs --tensor-parallel N or --pipeline-parallel M above 1"),
    (["--tensor-parallel", "2", "--interconnect", "token-ring"], "unknown --interconnect 'token-ring'"),
    (["--pipeline-parallel", "0"], "--pipeline-parallel 0 must be a positive integer"),
])
def test_inspect_refuses_bad_parallel_options(capsys, args, message):
    assert main(["inspect", "--model", "llama-70b", *args]) == 2
    assert message in capsys.readouterr().err
