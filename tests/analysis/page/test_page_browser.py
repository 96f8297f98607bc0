"""The inspect and compare pages in headless Chromium: they load from disk with no console errors
and no network requests; the diagram has one element per component and clicking one shows its
parameter count; the ledger total and the roofline points are the numbers `anatomy inspect --json`
prints; the trace filter works; labels fit their boxes; a 70B page stays small and quick. Each
page's screenshot is saved in the test's tmp_path."""

from __future__ import annotations

import json

import pytest

from anatomy.cli import main

pytestmark = pytest.mark.slow  # a real browser

SIZE = ["--seq", "16", "--context", "64"]
MODELS = {  # name -> the number of diagram components (tests/analysis/page/test_page.py lists them)
    "smollm2-135m-instruct": 8,
    "bert-base": 9,
    "transformer-base": 15,
}


def _inspect(tmp_path, capsys, name: str, *extra: str) -> tuple[dict, object]:
    """One run prints the JSON and writes the page."""
    page = tmp_path / f"{name}.html"
    assert main(["inspect", name, *SIZE, *extra, "--json", "--html", str(page)]) == 0
    return json.loads(capsys.readouterr().out), page


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inspect_page_in_a_browser(browser, tmp_path, capsys, name):
    report, path = _inspect(tmp_path, capsys, name)
    opened = browser.open(path)
    page = opened.page
    try:
        assert opened.errors == []
        assert opened.foreign_requests() == []
        components = page.locator("svg.diagram .component")
        assert components.count() == MODELS[name]
        assert len(set(components.evaluate_all("els => els.map(e => e.dataset.part)"))) == MODELS[name]

        shown_total = 0
        for k in range(components.count()):
            component = components.nth(k)
            component.click()
            part = component.get_attribute("data-part")
            detail = page.locator(f'.detail[data-for="{part}"]')
            assert detail.is_visible() and page.locator(".detail:visible").count() == 1
            if detail.locator('[data-role="params"]').count():
                count = int(detail.locator('[data-role="params"]').inner_text().split()[0].replace(",", ""))
                assert count == int(component.get_attribute("data-params"))
                shown_total += count
        assert shown_total == report["params"]["total"]  # the parts add up to the ledger, shared ones once

        attention = [c for c in report["params"]["components"] if c["kind"] == "attention"]
        stack = attention[0]["stack"]
        page.locator(f'.component[data-part="{stack}.attn"]').click()
        text = page.locator(f'.detail[data-for="{stack}.attn"] [data-role="params"]').inner_text()
        assert int(text.split()[0].replace(",", "")) == sum(c["total"] for c in attention if c["stack"] == stack)

        total = page.locator("#ledger-total")
        assert int(total.get_attribute("data-total")) == report["params"]["total"]
        assert total.inner_text() == f"{report['params']['total']:,}"

        points = page.locator("svg.roofline .point")
        phases = [p for p in ("prefill", "decode") if p in report["roofline"]]
        assert points.count() == len(phases)
        for k, phase in enumerate(phases):
            point = points.nth(k)
            assert point.get_attribute("data-phase") == phase
            for key in ("flops", "bytes", "intensity", "ridge", "time_s", "time_per_token_s", "tokens_per_s"):
                assert float(point.get_attribute("data-" + key.replace("_", "-"))) == report["roofline"][phase][key]
            point.locator(".mark").hover()
            tip = page.locator("#tip")
            assert tip.is_visible() and f"{phase}: {report['roofline'][phase]['bound']}-bound" in tip.inner_text()

        overflowing = page.evaluate("""() => {
            const bad = [];
            for (const g of document.querySelectorAll('svg.diagram .component')) {
                const box = g.querySelector('rect').getBBox();
                for (const t of g.querySelectorAll('text')) {
                    const b = t.getBBox();
                    if (b.x < box.x + 2 || b.x + b.width > box.x + box.width - 2) bad.push(t.textContent);
                }
            }
            return bad; }""")
        assert overflowing == []  # no label spills out of its box

        _filter_the_trace(page, report)
        opened.shot(tmp_path, f"inspect-{name}")
    finally:
        page.close()


def _filter_the_trace(page, report) -> None:
    rows = page.locator("table.trace tbody tr")
    assert rows.count() == len(report["trace"])
    page.fill("#trace-filter", "matmul")
    visible = page.locator("table.trace tbody tr:not(.hidden)")
    matmuls = [r for r in report["trace"] if "matmul" in f"{r['module']} {r['op']} {r['note']}".lower()]
    assert visible.count() == len(matmuls) > 0
    assert all("matmul" in t for t in visible.evaluate_all("els => els.map(e => e.dataset.search)"))
    assert page.locator("details.group:not(.hidden)").evaluate_all("els => els.every(e => e.open)")
    assert f"{len(matmuls)} of {len(report['trace'])} ops match" in page.locator("#trace-count").inner_text()
    page.fill("#trace-filter", "")
    assert page.locator("table.trace tbody tr.hidden").count() == 0


def test_dark_theme_and_the_switch(browser, tmp_path, capsys):
    _, path = _inspect(tmp_path, capsys, "smollm2-135m-instruct")
    opened = browser.open(path, color_scheme="dark")
    page = opened.page
    try:
        assert page.evaluate("document.documentElement.dataset.theme") == "dark"  # follows the system
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        opened.shot(tmp_path, "inspect-smollm2-dark")
        page.click("#theme-toggle")
        assert page.evaluate("document.documentElement.dataset.theme") == "light"
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") != background
        assert opened.errors == []
    finally:
        page.close()


def test_compare_page_in_a_browser(browser, tmp_path, capsys):
    names = ["smollm2-135m", "llama-3-8b", "bert-base"]
    path = tmp_path / "compare.html"
    assert main(["compare", *names, *SIZE, "--json", "--html", str(path)]) == 0
    reports = json.loads(capsys.readouterr().out)
    opened = browser.open(path)
    page = opened.page
    try:
        assert opened.errors == [] and opened.foreign_requests() == []
        headers = page.locator("#compare-table thead th").all_inner_texts()
        assert headers[1:] == names
        row = page.locator("#compare-table tbody tr", has_text="parameters").first.locator("td").all_inner_texts()
        assert row[1:] == [f"{reports[n]['params']['total']:,}" for n in names]
        assert page.locator(".compare-grid svg.diagram").count() == 3
        points = page.locator("svg.roofline .point")
        assert points.count() == 2 + 2 + 1  # an encoder has no decode step
        first = points.first
        assert float(first.get_attribute("data-flops")) == reports[names[0]]["roofline"]["prefill"]["flops"]
        opened.shot(tmp_path, "compare")
    finally:
        page.close()


def test_a_70b_page_is_small_and_quick(browser, tmp_path, capsys):
    """llama-70b (80 layers, D 8192, GQA 64/8): under 512 KiB, loaded and drawn within 5 s."""
    report, path = _inspect(tmp_path, capsys, "llama-70b")
    assert path.stat().st_size < 512 * 1024
    opened = browser.open(path)
    try:
        assert opened.load_s < 5.0, f"took {opened.load_s:.2f} s"
        assert opened.errors == [] and opened.foreign_requests() == []
        assert int(opened.page.locator("#ledger-total").get_attribute("data-total")) == 68_976_648_192
        opened.shot(tmp_path, "inspect-llama-70b")
    finally:
        opened.page.close()


def test_the_notebook_frame_renders_the_page(browser, tmp_path):
    import anatomy

    frame = anatomy.inspect("gpt2", seq_len=8, context=16)._repr_html_()
    path = tmp_path / "notebook.html"
    path.write_text(f"<!DOCTYPE html><html><body><p>a notebook cell</p>{frame}</body></html>")
    opened = browser.open(path)
    try:
        inner = opened.page.frame_locator("iframe")
        assert inner.locator("svg.diagram .component").count() == 8
        inner.locator('.component[data-part="decoder.ffn"]').click()
        assert inner.locator('.detail[data-for="decoder.ffn"]').is_visible()
        assert opened.errors == [] and opened.foreign_requests() == []
        opened.shot(tmp_path, "notebook")
    finally:
        opened.page.close()
