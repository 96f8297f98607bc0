"""Tokenizer and embedding speed: anatomy against HF transformers and sentence-transformers, same
files, same run. Prints medians of REPEATS runs."""

from __future__ import annotations


import torch
from rich.console import Console
from rich.table import Table

from benchmarks.timing import median_seconds

REPEATS = 3


def _texts(n: int) -> list[str]:
    words = "the model reads every token of a sentence and writes one vector that keeps its meaning".split()
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(5 + (i * 13) % 40)) for i in range(n)]


def main() -> None:
    import anatomy
    from anatomy.checkpoints.registry import resolve
    from anatomy.inference.embed import load_embedder
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    gguf = resolve("smollm2-135m-instruct")
    minilm = resolve("all-minilm-l6-v2")
    texts = _texts(256)
    rows = []

    ours_load = median_seconds(lambda: anatomy.load_tokenizer(gguf))
    hf_load = median_seconds(lambda: AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name))
    rows.append(("SmolLM2 tokenizer from GGUF, load", f"{ours_load:.2f} s", f"{hf_load:.2f} s (HF AutoTokenizer)"))

    ours_tok = anatomy.load_tokenizer(gguf)
    hf_tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    n_tokens = sum(len(ids) for ids in ours_tok.encode_batch(texts))
    ours_enc = median_seconds(lambda: ours_tok.encode_batch(texts))
    hf_enc = median_seconds(lambda: hf_tok(texts)["input_ids"])
    rows.append((f"encode {len(texts)} texts ({n_tokens} tokens)", f"{n_tokens / ours_enc / 1e3:.0f} k tok/s",
                 f"{n_tokens / hf_enc / 1e3:.0f} k tok/s (HF)"))

    load_embedder("all-minilm-l6-v2")
    anatomy.embed("all-minilm-l6-v2", texts[:4])
    st = SentenceTransformer(str(minilm), device="cpu")
    st.encode(texts[:4])
    ours_emb = median_seconds(lambda: anatomy.embed("all-minilm-l6-v2", texts, batch_size=32))
    st_emb = median_seconds(lambda: st.encode(texts, batch_size=32, normalize_embeddings=True))
    rows.append((f"embed {len(texts)} texts, all-MiniLM-L6-v2, batch 32", f"{len(texts) / ours_emb:.0f} texts/s",
                 f"{len(texts) / st_emb:.0f} texts/s (sentence-transformers)"))

    table = Table(title=f"tokenizers and embeddings (median of {REPEATS}, {torch.get_num_threads()} threads)")
    for column in ("what", "anatomy", "reference"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console(width=140).print(table)
