"""Tensor and pipeline parallelism on 2 gloo ranks (torchrun, started here) against one rank's engine
on the same weights: logits within 1e-5 in fp32 (the all-reduces add the partial sums in another
order than one matmul does: ~1e-7 here), 64 greedy tokens identical, every collective issued equal to
the communication model's (count, shape, bytes), and each rank holding ~1/N of the weights."""

from __future__ import annotations

import pytest
import torch

import anatomy
from anatomy.analysis.communication import issued_by, step_collectives
from anatomy.analysis.parallel import held_params
from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.parallel.cuts import tensor_cuts
from anatomy.parallel.layout import Layout
from anatomy.weights.modules import stored_bytes

from .conftest import run_ranks
from .worker import BATCH, COMM_PROMPT, GREEDY, IDS

pytestmark = pytest.mark.slow

LAYOUTS = {"tp2": Layout(tp=2), "pp2": Layout(pp=2)}
CASES = [(kind, layout) for kind in ("llama", "gpt2", "mixtral") for layout in LAYOUTS] + [("mqa", "tp2")]
FP32 = 1e-5


@pytest.fixture(scope="module")
def ranks(saved, tmp_path_factory):
    cases = [{"name": f"{kind}-{name}", "model": str(saved[kind]), "tp": LAYOUTS[name].tp, "pp": LAYOUTS[name].pp}
             for kind, name in CASES]
    cases.append({"name": "llama-int4-tp2", "model": str(saved["llama"]), "weights": "int4", "tp": 2, "pp": 1})
    cases.append({"name": "llama-int8kv-tp2", "model": str(saved["llama"]), "kv_dtype": "int8", "tp": 2, "pp": 1})
    cases.append({"name": "llama-pp2-lanes", "model": str(saved["llama"]), "tp": 1, "pp": 2, "lanes": True})
    return run_ranks(cases, tmp_path_factory.mktemp("ranks"), nproc=2)


def reference(model, kv_dtype: str | None = None) -> dict:
    engine = DecoderEngine(model, capture=False, kv_dtype=kv_dtype)
    run = engine.start(BATCH, SamplingParams(max_new_tokens=2))
    out = {"logits": engine.logits(torch.tensor(IDS)), "batch_prefill": run.prefill(),
           "batch_decode": run.decode(torch.tensor([31, 32]))}
    out["greedy"] = [int(t[0]) for t in engine.tokens(GREEDY, SamplingParams(max_new_tokens=64, ignore_eos=True))]
    return out


@pytest.mark.parametrize("kind,layout", CASES)
def test_logits_and_greedy_tokens_equal_one_rank(ranks, saved, kind, layout):
    got = ranks[f"{kind}-{layout}"][0]
    want = reference(anatomy.load(saved[kind]))
    for key in ("logits", "batch_prefill", "batch_decode"):
        assert got[key].shape == want[key].shape
        assert (got[key] - want[key]).abs().max() <= FP32, key
    assert got["greedy"] == want["greedy"] and len(got["greedy"]) == 64


def test_int4_shards_cut_along_groups_give_one_rank_s_answer(ranks, saved):
    """int4 weights (group 32) cut on group boundaries: the same dequantized weights, so the logits
    differ from one rank's only by the kernels' bf16 arithmetic."""
    got = ranks["llama-int4-tp2"][0]
    want = reference(anatomy.load(saved["llama"], weights="int4"))
    scale = want["logits"].abs().max()
    assert (got["logits"] - want["logits"]).abs().max() <= 2e-2 * scale


def test_an_int8_kv_cache_sharded_by_heads_gives_one_rank_s_answer(ranks, saved):
    """Each rank quantizes its own heads' keys and values (a scale per token and head: the same values
    and scales one rank computes): the prefill's logits within fp32's 1e-5, the decode step's after
    reading the codes within 1e-4 (a code can round the other way on a 1e-7 difference), 64 greedy
    tokens identical."""
    got = ranks["llama-int8kv-tp2"][0]
    want = reference(anatomy.load(saved["llama"]), kv_dtype="int8")
    assert (got["batch_prefill"] - want["batch_prefill"]).abs().max() <= FP32
    assert (got["batch_decode"] - want["batch_decode"]).abs().max() <= 1e-4
    assert got["greedy"] == want["greedy"] and len(got["greedy"]) == 64


@pytest.mark.parametrize("kind,layout", CASES)
def test_collectives_issued_are_the_communication_model_s(ranks, saved, kind, layout):
    """Every rank's collectives of one prefill [1, 4] and one decode step, recorded as issued, equal
    the model's list for that rank: kind, module, shape and bytes, in order."""
    config = anatomy.load_config(saved[kind])
    predict = {phase: step_collectives(config, LAYOUTS[layout], batch=1, tokens=tokens, rows=(1,), dtype="f32")
               for phase, tokens in (("prefill", len(COMM_PROMPT[0])), ("decode", 1))}
    results = ranks[f"{kind}-{layout}"]
    as_lists = lambda ops: [[k, w, list(s), b] for k, w, s, b in ops]  # noqa: E731
    assert results[0]["prefill_ops"] == as_lists(issued_by(predict["prefill"], 0))
    assert results[0]["decode_ops"] == as_lists(issued_by(predict["decode"], 0))
    assert results[0]["prefill_ops"] and results[0]["decode_ops"]
    assert results[1]["ops"] == as_lists(issued_by(predict["prefill"], 1) + issued_by(predict["decode"], 1))


@pytest.mark.parametrize("kind,layout", CASES)
def test_each_rank_holds_about_one_nth_of_the_weights(ranks, saved, kind, layout):
    """Measured in the running ranks. Tensor parallel: each rank's shard stores exactly its slice of every
    tensor the layout splits (half of each, the MQA model's one kv head whole on both) and the replicated
    ones (norms, learned positions, row-parallel biases, the router) once, ~1/2 of one rank's; its
    engine's decode weights (the linears) are ~1/2 of one rank's. Every rank holds exactly the
    parameters the anatomy counts for it on the meta device."""
    model = anatomy.load(saved[kind])
    one = stored_bytes(model)
    one_engine = DecoderEngine(model, capture=False).decode_weight_bytes
    for rank, got in enumerate(ranks[f"{kind}-{layout}"]):
        assert got["params"] == held_params(model.config, LAYOUTS[layout], rank)
        if layout == "tp2":
            assert got["stored_bytes"] == kept_bytes(model, rank)
            assert abs(got["stored_bytes"] / one - 0.5) < 0.06  # the tiny models' norms and positions are ~5%
            assert abs(got["engine_weight_bytes"] / one_engine - 0.5) < (0.07 if kind == "mqa" else 0.02)
        assert got["stored_bytes"] < 0.75 * one
    assert sum(r["stored_bytes"] for r in ranks[f"{kind}-{layout}"]) >= one  # nothing is missing


def kept_bytes(model, rank: int) -> int:
    """Bytes of rank `rank`'s slices (tensor_cuts, with the vocabulary padding) and of the replicated tensors."""
    cuts = tensor_cuts(model, tp=2, tp_rank=rank)
    total, seen = 0, set()
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:  # a tied head is its table
            continue
        seen.add(t.data_ptr())
        cut = cuts.get(name)
        total += t.nbytes if cut is None else t.nbytes // t.shape[cut.dim] * len(cut.index)
    return total


def test_serving_lanes_overlap_on_the_stages(ranks):
    """Two threads stepping their own paged caches on a PP=2 engine (the serving lanes): rank 0's stage
    takes the next step while the previous one waits for the last stage's logits, and every step's
    logits are those of the same steps run one after the other (tags keep the messages apart)."""
    got = ranks["llama-pp2-lanes"][0]
    assert got["overlaps"] >= 1
    for lane in range(2):
        assert torch.equal(got["lanes"][lane], got["alone"][lane])
