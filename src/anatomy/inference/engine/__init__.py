"""The engine: the one way to run a model. Generation, streaming, beam search, speculative
verification, the serving loop and the profiler all go through its public API; nothing outside this
package touches an engine's private members or runs `model.stack` itself.

    engine.py    DecoderEngine: the planned view, captured steps, the LM head; start/tokens/logits/step
    run.py       Run: one generation over a static cache (prefill, decode, verify, rewind, choose)
    paged.py     the paged KV cache and the inputs of a step over a batch of chunks (serving)
    capture.py   a decode step's blocks traced once per shape and replayed
    kv_cache.py  the static KV cache of a direct model call: the paged one, a fixed table per row
    seq2seq.py   Seq2SeqEngine: an encoder-decoder's source encoded once, decoder steps, beam reorder
    kept.py      engines kept per model object (anatomy.engine_for)
    view.py      the engine's own copy of a model's modules over the caller's tensors
"""

from anatomy.inference.engine.engine import DecoderEngine, held_bytes
from anatomy.inference.engine.kept import engine_for, kept_engines
from anatomy.inference.engine.paged import Chunk, PagedKVCache
from anatomy.inference.engine.run import PaddedBatch, Run
from anatomy.inference.engine.seq2seq import Seq2SeqEngine, Seq2SeqRun

__all__ = ["Chunk", "DecoderEngine", "PaddedBatch", "PagedKVCache", "Run", "Seq2SeqEngine", "Seq2SeqRun",
           "engine_for", "held_bytes", "kept_engines"]
