"""benchmarks/bench_quality.py's reading of llama-perplexity: its --kl-divergence summary and the
tokens of a --kl-divergence-base file, on output laid out by perplexity.cpp's format strings."""

from __future__ import annotations

import struct

import pytest

from benchmarks.bench_quality import kld_tokens, parse_kl_divergence

# The tail of `llama-perplexity --kl-divergence` as perplexity.cpp's kl_divergence() prints it (its
# LOG format strings, values made up): the per-chunk table first, which must not be read as the summary
OUTPUT = """\
kl_divergence: 0.81 seconds per pass - ETA 0.05 minutes

chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1      18.2101 ±    1.4420       0.00214 ±    0.00071       0.00051 ±    0.00004     0.612 ±  0.041 %    99.216 ±  0.554 %
   2      21.0456 ±    1.2378       0.00190 ±    0.00052       0.00048 ±    0.00003     0.598 ±  0.030 %    98.824 ±  0.479 %

====== Perplexity statistics ======
Mean PPL(Q)                   :  21.734906 ±   0.912345
Mean PPL(base)                :  21.690412 ±   0.910012
Cor(ln(PPL(Q)), ln(PPL(base))):  99.96%
Mean ln(PPL(Q)/PPL(base))     :   0.002049 ±   0.000412
Mean PPL(Q)/PPL(base)         :   1.002051 ±   0.000413
Mean PPL(Q)-PPL(base)         :   0.044494 ±   0.009001

====== KL divergence statistics ======
Mean    KLD:   0.000497 ±   0.000021
Maximum KLD:   0.021877
99.9%   KLD:   0.013360
Median  KLD:   0.000231
Minimum KLD:  -0.000002

====== Token probability statistics ======
Mean    Δp: -0.012 ± 0.019 %
RMS Δp    :  0.605 ± 0.025 %
Same top p: 99.020 ± 0.310 %
"""


def test_reads_the_summary_not_the_chunk_table():
    assert parse_kl_divergence(OUTPUT) == {"perplexity": 21.734906, "reference_perplexity": 21.690412,
                                           "kl_divergence": 0.000497, "top1_agreement": pytest.approx(0.9902)}


def test_a_missing_line_names_it():
    with pytest.raises(RuntimeError, match="Same top p"):
        parse_kl_divergence(OUTPUT.split("====== Token")[0])


def test_reads_the_tokens_of_a_base_file(tmp_path):
    path = tmp_path / "base.kld"
    tokens = list(range(100, 112))
    path.write_bytes(b"_logits_" + struct.pack("<Iii", 4, 49152, 3) + struct.pack("<12i", *tokens) + b"\0" * 64)
    assert kld_tokens(path) == (4, tokens)
    (tmp_path / "other").write_bytes(b"GGUF" + b"\0" * 40)
    with pytest.raises(RuntimeError, match="not a llama-perplexity log-probability file"):
        kld_tokens(tmp_path / "other")
