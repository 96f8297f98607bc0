"""benchmarks/bench_quality.py's reading of llama-perplexity: its --kl-divergence summary (on a real
run's output) and the tokens of a --kl-divergence-base file (laid out as perplexity.cpp writes it)."""

from __future__ import annotations

import struct

import pytest

from benchmarks.bench_quality import kld_tokens, parse_kl_divergence

# The tail of `llama-perplexity --kl-divergence` (llama.cpp of llama-cpp-python 0.3.36, built by
# benchmarks/build_llama_cpp.sh) on the shipped Q4_1 file against the F32 file anatomy writes of it, over
# tests/data/english.txt with -c 512: the per-chunk table first, which must not be read as the summary
OUTPUT = """\
chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p
   1      24.3250 ±    4.0356       0.00703 ±    0.00450       0.00234 ±    0.00012     0.941 ±  0.079 %    95.686 ±  1.275 %
   2      21.8617 ±    2.4887       0.00392 ±    0.00324       0.00234 ±    0.00008     0.945 ±  0.054 %    96.471 ±  0.818 %
   3      23.0756 ±    2.1804       0.00471 ±    0.00264       0.00228 ±    0.00006     0.896 ±  0.044 %    95.686 ±  0.735 %
   4      21.6339 ±    1.7877       0.00307 ±    0.00225       0.00228 ±    0.00005     0.934 ±  0.039 %    96.176 ±  0.601 %

====== Perplexity statistics ======
Mean PPL(Q)                   :  21.633926 ±   1.787664
Mean PPL(base)                :  21.567521 ±   1.779289
Cor(ln(PPL(Q)), ln(PPL(base))):  99.96%
Mean ln(PPL(Q)/PPL(base))     :   0.003074 ±   0.002245
Mean PPL(Q)/PPL(base)         :   1.003079 ±   0.002252
Mean PPL(Q)-PPL(base)         :   0.066405 ±   0.049133

====== KL divergence statistics ======
Mean    KLD:   0.002281 ±   0.000052
Maximum KLD:   0.012775
99.9%   KLD:   0.012461
99.0%   KLD:   0.008018
95.0%   KLD:   0.005131
90.0%   KLD:   0.004321
Median  KLD:   0.001950
10.0%   KLD:   0.000643
 5.0%   KLD:   0.000381
 1.0%   KLD:   0.000047
 0.1%   KLD:  -0.000000
Minimum KLD:  -0.000008

====== Token probability statistics ======
Mean    Δp:  0.016 ± 0.029 %
Maximum Δp:  4.612%
99.9%   Δp:  4.517%
99.0%   Δp:  3.248%
95.0%   Δp:  1.527%
90.0%   Δp:  0.938%
75.0%   Δp:  0.198%
Median  Δp: -0.001%
25.0%   Δp: -0.230%
10.0%   Δp: -0.894%
 5.0%   Δp: -1.432%
 1.0%   Δp: -2.834%
 0.1%   Δp: -4.080%
Minimum Δp: -4.263%
RMS Δp    :  0.934 ± 0.039 %
Same top p: 96.176 ± 0.601 %
"""


def test_reads_the_summary_not_the_chunk_table():
    assert parse_kl_divergence(OUTPUT) == {"perplexity": 21.633926, "reference_perplexity": 21.567521,
                                           "kl_divergence": 0.002281, "top1_agreement": pytest.approx(0.96176)}


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
