"""The profile page (`anatomy profile --html`) in headless Chromium: it loads from disk with no
console errors and no requests; each phase has its section; every op with FLOPs, bytes and time is
one point on the machine's roofline, at the FLOP/s the JSON reports; the sweep figure is embedded."""

from __future__ import annotations

import json

import pytest

from anatomy.cli import main

from ...inference.conftest import llama_tiny

pytestmark = pytest.mark.slow  # a real browser


def test_profile_page_in_a_browser(browser, tmp_path, capsys):
    import anatomy

    model_dir = tmp_path / "llama"
    anatomy.save(llama_tiny(), model_dir)
    page_path = tmp_path / "profile.html"
    assert main(["profile", "--model", str(model_dir), "--prompt-len", "8", "--new-tokens", "4",
                 "--sweep", "batch=1,2", "--json", "--html", str(page_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    opened = browser.open(page_path)
    page = opened.page
    try:
        assert opened.errors == []
        assert opened.foreign_requests() == []
        for phase, d in report["phases"].items():
            section = page.locator(f"section#{phase}")
            assert section.is_visible()
            placed = [o for o in d["ops"] if o["flops"] and o["bytes"] and o["time_s"]]
            points = section.locator("svg.roofline .point")
            assert points.count() == len(placed)
            labels = set(points.evaluate_all("els => els.map(e => e.dataset.label)"))
            assert labels == {f"{o['module']} {o['op']}" for o in placed}
        assert page.locator("section#more img[src^='data:image/png;base64,']").count() == 1
        opened.shot(tmp_path, "profile")
    finally:
        page.close()
