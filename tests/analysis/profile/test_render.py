"""The profile report's tables (analysis/profile/render.py): numbers worked out by hand."""

from __future__ import annotations

from anatomy.analysis.profile.render import _what_if


def test_what_if_changes_are_in_milliseconds():
    entry = {"switch": "weights=bf16", "phases": {"decode": {
        "before_step_s": 0.5, "after_step_s": 0.3, "before_tok_per_s": 2.0, "after_tok_per_s": 10 / 3,
        "positions": {"qkv_ffn_gemm": [0.4, 0.1], "lm_head": [0.0, 0.002], "sampling": [0.0, 0.0]}}}}
    report = {"positions": {"qkv_ffn_gemm": {"label": "QKV / FFN GEMM"}, "lm_head": {"label": "LM head"},
                            "sampling": {"label": "Sampling"}}}
    table = _what_if(entry, report)
    assert table.rows == [
        ["decode", "step (unprofiled)", "500.00", "300.00", "-200.00 ms (-40%)"],
        ["decode", "QKV / FFN GEMM", "400.00", "100.00", "-300.00 ms (-75%)"],
        ["decode", "LM head", "0.00", "2.00", "+2.00 ms"],  # nothing before: no ratio
    ]
    assert table.notes == ["decode: 2.0 -> 3.3 tok/s"]
