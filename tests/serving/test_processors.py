"""What shapes a sequence's next token in the serving loop: logit_bias, min_tokens and a grammar
(llguidance, on SmolLM2's tokenizer with a tiny random model of its vocabulary: a constrained output
is valid by construction, whatever the weights), batched with unconstrained rows; the bitmask laid
onto the logits against a hand-made one; the grammar cache and the Constraint's rollback."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from anatomy.inference.engine import DecoderEngine
from anatomy.inference.sampling import SamplingParams
from anatomy.serving.grammar import GrammarError, GrammarSpec, apply_bitmask
from anatomy.serving.loop import ServingLoop

from .conftest import run_all

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
    "role": {"enum": ["admin", "user"]}, "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                   "maxItems": 3}},
    "required": ["name", "age", "role", "tags"], "additionalProperties": False}


def texts(events) -> str:
    return "".join(e.text for e in events)


def test_apply_bitmask_matches_a_boolean_mask():
    V = 70
    allowed = torch.rand(3, V) < 0.3
    words = torch.zeros(3, 3, dtype=torch.int64)
    for r, t in allowed.nonzero().tolist():
        words[r, t // 32] |= 1 << (t % 32)
    mask = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    logits = torch.randn(3, V)
    out = apply_bitmask(logits.clone(), mask)
    assert torch.equal(out, logits.masked_fill(~allowed, float("-inf")))


def test_logit_bias_bans_and_forces_tokens(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 6, block_size=4)
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    free = [e.token for e in run_all(loop, [[5, 9, 2]], params)[0]]
    banned = [e.token for e in run_all(loop, [[5, 9, 2]], params, bias={free[0]: -100.0})[0]]
    assert banned[0] != free[0]
    forced = [e.token for e in run_all(loop, [[5, 9, 2]], SamplingParams(max_new_tokens=6, temperature=1.0, seed=1,
                                                                          ignore_eos=True), bias={42: 100.0})[0]]
    assert forced == [42] * 6


def test_min_tokens_holds_the_stop_ids_back(tiny):
    loop = ServingLoop(DecoderEngine(tiny), kv_bytes=10 ** 6, block_size=4)
    first = run_all(loop, [[5, 9, 2]], SamplingParams(max_new_tokens=1, ignore_eos=True))[0][0].token
    stop_now = SamplingParams(max_new_tokens=8, stop_ids=(first,))
    assert len(run_all(loop, [[5, 9, 2]], stop_now)[0]) == 1
    held = run_all(loop, [[5, 9, 2]], stop_now, min_tokens=4)[0]
    assert len(held) >= 4 and all(e.token != first for e in held[:4])


def test_grammar_constrained_rows_in_a_batch(vocab_model, smollm2_tokenizer, grammars):
    loop = ServingLoop(DecoderEngine(vocab_model), smollm2_tokenizer, kv_bytes=10 ** 7, block_size=16)
    prompt = smollm2_tokenizer.encode("Give me a person as JSON:")
    specs = [GrammarSpec("json", SCHEMA, param="x"), GrammarSpec("regex", r"[0-9]{4}-[0-9]{2}", param="x"),
             GrammarSpec("choice", ["yes", "no", "maybe"], param="x"), GrammarSpec("json", {"type": "object"}, "x")]
    events = [[] for _ in range(len(specs) + 1)]
    for i, spec in enumerate(specs):
        loop.submit(prompt, SamplingParams(max_new_tokens=120, temperature=1.0, seed=i), events[i].append,
                    constraint=grammars.compile(spec))
    loop.submit(prompt, SamplingParams(max_new_tokens=10), events[-1].append)  # unconstrained, same steps
    while loop.step():
        pass
    person = json.loads(texts(events[0]))
    jsonschema.validate(person, SCHEMA)
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}", texts(events[1])) and events[1][-1].finish_reason == "stop"
    assert texts(events[2]) in ("yes", "no", "maybe")
    assert events[3][-1].finish_reason == "length" or isinstance(json.loads(texts(events[3])), dict)
    assert texts(events[3]).startswith("{")
    assert len(events[-1]) == 10


def test_compiled_grammars_are_cached_and_copies_are_independent(grammars, smollm2_tokenizer):
    before = grammars.cached
    a = grammars.compile(GrammarSpec("choice", ["alpha", "beta"], param="x"))
    b = grammars.compile(GrammarSpec("choice", ["alpha", "beta"], param="x"))
    assert grammars.cached == before + 1, "the same grammar is compiled once"
    ids = smollm2_tokenizer.encode("alpha", add_special_tokens=False)
    for t in ids:
        a.accept(t)
    assert a.finished and not b.finished, "each sequence has its own matcher"
    a.rollback(len(ids))
    assert not a.finished and a.valid_prefix(ids) == len(ids)
    assert b.valid_prefix(smollm2_tokenizer.encode("gamma", add_special_tokens=False)) == 0


@pytest.mark.parametrize("spec, words", [
    (GrammarSpec("json", {"type": "strnig"}, param="response_format.json_schema.schema"), "Invalid type"),
    (GrammarSpec("json", {"$ref": "#/defs/none"}, param="guided_json"), "does not exist"),
    (GrammarSpec("regex", "((", param="guided_regex"), "regex"),
    (GrammarSpec("lark", "start: nothing_defined", param="guided_grammar"), "nothing_defined"),
])
def test_grammars_that_do_not_compile_name_the_field(grammars, spec, words):
    with pytest.raises(GrammarError) as exc:
        grammars.compile(spec)
    assert exc.value.param == spec.param and words in exc.value.message


def test_speculative_decoding_within_the_grammar_gives_the_plain_constrained_output(vocab_model, smollm2_tokenizer,
                                                                                      grammars):
    """Prompt-lookup drafts are cut to what the grammar allows and verified under its masks: greedy
    constrained output with speculation == without it, and valid."""
    from anatomy.inference.speculative.rounds import ServedSpeculation

    example = json.dumps({"name": "Ada", "age": 36, "role": "admin", "tags": ["x"]})
    prompt = smollm2_tokenizer.encode(f"{example}\n{example}\n{example}\n")
    params = SamplingParams(max_new_tokens=60)
    out = []
    for speculation in (None, ServedSpeculation(num_speculative_tokens=4)):
        loop = ServingLoop(DecoderEngine(vocab_model), smollm2_tokenizer, kv_bytes=10 ** 7, block_size=16,
                           speculation=speculation)
        events = run_all(loop, [prompt], params, constraint=grammars.compile(GrammarSpec("json", SCHEMA, "x")),
                         bias={smollm2_tokenizer.encode("Ada", add_special_tokens=False)[0]: 5.0})[0]
        out.append(([e.token for e in events], loop))
    assert out[0][0] == out[1][0]
    assert out[1][1].scheduler.running == [] and out[1][1].blocks.used == 0
    text = smollm2_tokenizer.decode([t for t in out[1][0] if t not in smollm2_tokenizer.eos_ids])
    if len(out[1][0]) < 60:
        jsonschema.validate(json.loads(text), SCHEMA)
