"""Grammar engines for constrained decoding, side by side on the served model's vocabulary.

SmolLM2-135M-Instruct's tokenizer (49,152 tokens, byte-level BPE); for each engine installed
(llguidance, xgrammar, outlines-core) and each constraint below:

    compile   seconds from the constraint to a matcher ready for its first mask (nothing cached)
    walk      a valid output (the example's tokens): per step, fill the next token's packed bitmask
              [V / 32] int32, check the example's token is allowed, advance the matcher by it
    random    RANDOM_STEPS steps each taking a random allowed token (seeded), the masks of a
              generation that wanders (long strings, deep nesting); ended early when the
              grammar ends
    apply     the bitmask laid onto a [1, V] float32 row of logits (-inf where not allowed), as the
              serving loop does it for every constrained row (anatomy.serving.grammar)

Per-step times are medians and 99th percentiles in microseconds over all the steps of all the
constraints; a model step of the default server is ~20-60 ms on 2 cores (docs/serving.md).

    python -m benchmarks grammar
"""

from __future__ import annotations

import json
import random
import statistics
import time

import torch

import anatomy
from anatomy.serving.grammar import apply_bitmask

MODEL = "smollm2-135m-instruct"
RANDOM_STEPS = 200

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string", "format": "email"},
    "role": {"type": "string", "enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
    "required": ["name", "age", "role", "tags"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {
    "id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
    "customer": {"type": "object", "properties": {"name": {"type": "string"},
                                                  "address": {"type": "object", "properties": {
                                                      "city": {"type": "string"}, "zip": {"type": "string"}},
                                                      "required": ["city"]}},
                 "required": ["name", "address"]},
    "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
        "required": ["sku", "qty", "price"]}},
    "status": {"anyOf": [{"type": "string", "enum": ["open", "paid"]}, {"type": "null"}]}},
    "required": ["id", "customer", "items", "status"]}
CONSTRAINTS = [
    ("json object", ("json", {"type": "object"}), {"answer": "Paris", "confidence": 0.9}),
    ("schema: person", ("json", PERSON), {"name": "Ada", "age": 36, "role": "admin", "tags": ["math", "code"]}),
    ("schema: order", ("json", ORDER), {"id": "ABC-1234", "customer": {"name": "Bo", "address": {"city": "Oslo"}},
                                        "items": [{"sku": "x1", "qty": 2, "price": 9.5}], "status": "paid"}),
    ("regex: date", ("regex", r"\d{4}-\d{2}-\d{2}"), "2024-05-17"),
    ("choice", ("regex", r"(positive|negative|neutral)"), "negative"),
]


class Llguidance:
    name = "llguidance"

    def __init__(self, tok) -> None:
        import llguidance

        self.llg = llguidance
        self.tokenizer = llguidance.LLTokenizer(tok.backend.to_str(), n_vocab=tok.vocab_size, eos_token=tok.eos_id)

    def matcher(self, kind: str, spec):
        llg = self.llg.LLMatcher
        grammar = llg.grammar_from_json_schema(spec) if kind == "json" else llg.grammar_from_regex(spec)
        m = self.llg.LLMatcher(self.tokenizer, grammar)
        assert not m.is_error(), m.get_error()
        return m

    def fill(self, m, mask: torch.Tensor) -> None:
        m.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)

    def advance(self, m, token: int) -> None:
        assert m.consume_token(token), m.get_error()

    def done(self, m) -> bool:
        return m.is_stopped()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tok) -> None:
        import xgrammar

        self.xgr = xgrammar
        vocab = [tok.backend.id_to_token(i) for i in range(tok.vocab_size)]
        info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.BYTE_LEVEL, vocab_size=tok.vocab_size,
                                      stop_token_ids=[tok.eos_id])
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)

    def matcher(self, kind: str, spec):
        compile = self.compiler.compile_json_schema if kind == "json" else self.compiler.compile_regex
        if kind == "json" and spec == {"type": "object"}:
            return self.xgr.GrammarMatcher(self.compiler.compile_builtin_json_grammar())
        return self.xgr.GrammarMatcher(compile(json.dumps(spec) if kind == "json" else spec))

    def fill(self, m, mask: torch.Tensor) -> None:
        m.fill_next_token_bitmask(mask[None])

    def advance(self, m, token: int) -> None:
        assert m.accept_token(token)

    def done(self, m) -> bool:
        return m.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok) -> None:
        import outlines_core

        self.oc = outlines_core
        decode = _byte_decoder()
        special = set(tok.special_ids)
        tokens: dict[bytes, list[int]] = {}
        for i in range(tok.vocab_size):
            if i not in special:
                tokens.setdefault(bytes(decode[c] for c in tok.backend.id_to_token(i)), []).append(i)
        self.vocab = outlines_core.Vocabulary(tok.eos_id, tokens)

    def matcher(self, kind: str, spec):
        from outlines_core.json_schema import build_regex_from_schema

        regex = build_regex_from_schema(json.dumps(spec)) if kind == "json" else spec
        return self.oc.Guide(self.oc.Index(regex, self.vocab))

    def fill(self, m, mask: torch.Tensor) -> None:
        m.write_mask_into(mask.data_ptr(), mask.numel(), 4)

    def advance(self, m, token: int) -> None:
        m.advance(token)

    def done(self, m) -> bool:
        return m.is_finished()


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _allowed(mask: torch.Tensor, token: int) -> bool:
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)


def measure(engine, tok) -> dict:
    V = tok.vocab_size
    mask = torch.zeros((V + 31) // 32, dtype=torch.int32)
    compile_s, steps, failed = [], [], []
    rng = random.Random(0)
    bits = torch.arange(32, dtype=torch.int32)
    for label, (kind, spec), example in CONSTRAINTS:
        start = time.perf_counter()
        try:
            m = engine.matcher(kind, spec)
        except Exception as exc:  # an engine that cannot compile one: said in the table
            failed.append(f"{label}: {type(exc).__name__}")
            continue
        compile_s.append(time.perf_counter() - start)
        text = example if isinstance(example, str) else json.dumps(example)
        for token in tok.encode(text, add_special_tokens=False):
            t0 = time.perf_counter()
            engine.fill(m, mask)
            steps.append(time.perf_counter() - t0)
            assert _allowed(mask, token), (engine.name, label, tok.decode([token]))
            engine.advance(m, token)
        m = engine.matcher(kind, spec)
        for _ in range(RANDOM_STEPS):
            t0 = time.perf_counter()
            engine.fill(m, mask)
            steps.append(time.perf_counter() - t0)
            allowed = ((mask[:, None] >> bits) & 1).flatten()[:V].nonzero()[:, 0].tolist()
            allowed = [t for t in allowed if t != tok.eos_id]
            if not allowed or engine.done(m):
                break
            engine.advance(m, rng.choice(allowed))
    return {"compile": compile_s, "steps": steps, "failed": failed}


def apply_cost(V: int) -> list[float]:
    logits = torch.randn(1, V)
    mask = torch.randint(-2 ** 31, 2 ** 31 - 1, (1, (V + 31) // 32), dtype=torch.int32)
    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        apply_bitmask(logits.clone(), mask)
        times.append(time.perf_counter() - t0)
    return times


def batch_cost(tok, rows: int = 8) -> list[float]:
    """Per step: the processors' grammar work for `rows` sequences of the served engine (llguidance)."""
    from types import SimpleNamespace

    from anatomy.serving.grammar import GrammarEngine, GrammarSpec
    from anatomy.serving.processors import processed

    engine = GrammarEngine(tok, vocab_size=tok.vocab_size, stop_ids=tok.eos_ids)
    seqs = [SimpleNamespace(bias=None, generated=0, min_tokens=0, stop_ids=tok.eos_ids,
                            constraint=engine.compile(GrammarSpec("json", PERSON, param="x"))) for _ in range(rows)]
    example = tok.encode(json.dumps(CONSTRAINTS[1][2]), add_special_tokens=False)
    logits, times = torch.randn(rows, tok.vocab_size), []
    for token in example:
        t0 = time.perf_counter()
        processed(logits, seqs)
        times.append(time.perf_counter() - t0)
        for seq in seqs:
            seq.constraint.accept(token)
    return times


def _us(values: list[float], q: float | None = None) -> str:
    if not values:
        return "-"
    values = sorted(values)
    v = statistics.median(values) if q is None else values[min(len(values) - 1, int(q * len(values)))]
    return f"{v * 1e6:,.0f}"


def main() -> None:
    tok = anatomy.load_tokenizer(MODEL)
    print(f"{MODEL}: vocabulary of {tok.vocab_size:,} tokens; {len(CONSTRAINTS)} constraints, a valid walk and "
          f"{RANDOM_STEPS} random steps each\n")
    print("| engine | setup (tokenizer) s | compile median / max ms | mask per step median / p99 us | steps | "
          "could not compile |")
    print("|---|---|---|---|---|---|")
    for make in (Llguidance, Xgrammar, OutlinesCore):
        start = time.perf_counter()
        try:
            engine = make(tok)
        except ImportError as exc:
            print(f"| {make.name} | not installed ({exc.name}) | | | | |")
            continue
        setup = time.perf_counter() - start
        r = measure(engine, tok)
        compile_ms = [c * 1e3 for c in r["compile"]]
        print(f"| {engine.name} | {setup:.2f} | {statistics.median(compile_ms):,.1f} / {max(compile_ms):,.1f} | "
              f"{_us(r['steps'])} / {_us(r['steps'], 0.99)} | {len(r['steps'])} | {', '.join(r['failed']) or '-'} |",
              flush=True)
    applied = apply_cost(tok.vocab_size)
    print(f"\napplying a bitmask to a [1, {tok.vocab_size:,}] row (anatomy.serving.grammar.apply_bitmask): "
          f"median {_us(applied)} us, p99 {_us(applied, 0.99)} us")
    batch = batch_cost(tok)
    print(f"a serving step's grammar work for 8 constrained rows (anatomy.serving.processors.processed, llguidance): "
          f"median {_us(batch)} us, p99 {_us(batch, 0.99)} us per step")


if __name__ == "__main__":
    main()
