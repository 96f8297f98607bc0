"""What each rank holds, and every split that does not go evenly refused naming the field, the value and
the rule (before any rank starts: these are the checks the launcher runs)."""

from __future__ import annotations

import pytest

from anatomy import get_preset
from anatomy.errors import InputError
from anatomy.parallel.layout import (Layout, check_layout, kv_heads, local_config, query_heads, stage_layers,
                                     vocab_rows)

from .conftest import SMALL


def llama(**changes):
    return get_preset("llama-7b", **{**SMALL, "n_layers": 4, "n_kv_heads": 2, "d_ff": 128, **changes})


@pytest.mark.parametrize("changes,layout,message", [
    (dict(n_heads=6, d_model=96), Layout(tp=4), "n_heads=6 is not divisible by --tensor-parallel-size 4"),
    (dict(n_heads=8, n_kv_heads=4), Layout(tp=8, pp=1), None),
    (dict(n_heads=12, d_model=96, n_kv_heads=4), Layout(tp=8),
     "n_heads=12 is not divisible by --tensor-parallel-size 8"),
    (dict(n_heads=8, n_kv_heads=8), Layout(tp=8), None),
    (dict(n_heads=12, d_model=96, n_kv_heads=3), Layout(tp=2),
     "n_kv_heads=3 is not divisible by --tensor-parallel-size 2"),
    (dict(n_heads=12, d_model=96, n_kv_heads=3), Layout(tp=4),
     "n_kv_heads=3 is fewer than --tensor-parallel-size 4 and does not divide it"),
    (dict(n_heads=8, d_ff=100), Layout(tp=8), "d_ff=100 is not divisible by --tensor-parallel-size 8"),
    (dict(), Layout(pp=5), "n_layers=4 cannot be split into --pipeline-parallel-size 5 stages"),
])
def test_sizes_that_do_not_divide_are_refused_naming_field_value_and_rule(changes, layout, message):
    config = llama(**changes)
    if message is None:
        check_layout(config, layout)
        return
    with pytest.raises(InputError, match=message.replace("+", r"\+")):
        check_layout(config, layout)


def test_experts_and_architectures():
    moe = get_preset("mixtral-8x7b", **SMALL, n_layers=2, n_kv_heads=2, d_ff=96, n_experts=4)
    check_layout(moe, Layout(tp=2))  # each expert's 96 columns: 48 per rank
    with pytest.raises(InputError, match="d_ff_expert=90 is not divisible by --tensor-parallel-size 4: .*every expert"):
        check_layout(moe.replace(d_ff=90, d_ff_expert=90), Layout(tp=4))
    with pytest.raises(InputError, match="decoder-only models; this one has architecture='encoder'"):
        check_layout(get_preset("bert-base"), Layout(tp=2))
    with pytest.raises(InputError, match="--tensor-parallel-size 0 must be a positive integer"):
        Layout(tp=0)


def test_what_each_rank_holds():
    config = llama(n_heads=8, n_kv_heads=2, d_model=64)
    # GQA with fewer kv heads than ranks: each kv head kept by the ranks whose query heads read it
    assert [list(query_heads(config, 4, r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [list(kv_heads(config, 4, r)) for r in range(4)] == [[0], [0], [1], [1]]
    assert [list(kv_heads(config, 2, r)) for r in range(2)] == [[0], [1]]
    # the vocabulary in ceil(V / N) rows: 97 over 2 ranks is 49 + 48 (the second shard padded by a row)
    assert vocab_rows(97, 2, 0) == (range(0, 49), 49) and vocab_rows(97, 2, 1) == (range(49, 97), 49)
    assert [list(stage_layers(30, 4, s)) for s in range(4)][0] == list(range(0, 8))
    assert sum(len(stage_layers(30, 4, s)) for s in range(4)) == 30
    local = local_config(config, Layout(tp=4, pp=2), rank=5)  # stage 1, tp rank 1
    assert (local.n_layers, local.n_heads, local.n_kv_heads, local.head_dim, local.d_ff, local.vocab_size) == \
        (2, 2, 1, config.head_dim, 32, 97)
