"""The page, read as HTML and SVG (the browser tests drive it): built from the report dict alone,
every ledger row in exactly one part of the diagram, one SVG element per part, the roofline points
carrying the report's numbers, nothing fetched from anywhere, user text escaped, writes atomic."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser

import pytest

import anatomy
from anatomy.analysis import params, report as report_module
from anatomy.analysis.page import check_output_path, compare_page, inspect_page, write_page
from anatomy.analysis.page.charts import squarify
from anatomy.analysis.page.diagram import diagram_svg
from anatomy.analysis.page.parts import diagram_parts
from anatomy.errors import InputError
from anatomy.presets import PRESETS, get_preset

# the parts each architecture's diagram must show, written out here rather than derived
EXPECTED_PARTS = {
    "smollm2-135m": {"decoder.embedding", "decoder.positions", "decoder.attn_norm", "decoder.attn",
                     "decoder.ffn_norm", "decoder.ffn", "decoder.final_norm", "head"},
    "bert-base": {"encoder.embedding", "encoder.positions", "encoder.segments", "encoder.embedding_norm",
                  "encoder.attn_norm", "encoder.attn", "encoder.ffn_norm", "encoder.ffn", "head"},
    "transformer-base": {"encoder.embedding", "encoder.positions", "encoder.attn_norm", "encoder.attn",
                         "encoder.ffn_norm", "encoder.ffn", "decoder.embedding", "decoder.positions",
                         "decoder.attn_norm", "decoder.attn", "decoder.cross_norm", "decoder.cross_attn",
                         "decoder.ffn_norm", "decoder.ffn", "head"},
}


@pytest.fixture(scope="module")
def reports():
    return {name: anatomy.inspect(name, seq_len=16, context=64).data for name in EXPECTED_PARTS}


def _ledger_report(name: str) -> dict:
    """The parts of the report the diagram reads, for any preset, without tracing it."""
    config = get_preset(name)
    ledger = params.parameter_ledger(config)
    return {"model": {"name": name, "architecture": config.architecture,
                      "config": report_module._config_summary(config)},
            "params": report_module._params(ledger), "flops": {"per_layer": {}}}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_ledger_row_sits_in_exactly_one_part(name):
    report = _ledger_report(name)
    parts = diagram_parts(report)
    held = [id(c) for p in parts.values() for c in p.ledger]
    assert sorted(held) == sorted(id(c) for c in report["params"]["components"])
    assert sum(p.params for p in parts.values()) == report["params"]["total"]


@pytest.mark.parametrize("name", sorted(EXPECTED_PARTS))
def test_the_svg_has_one_element_per_component(reports, name):
    svg = diagram_svg(reports[name])
    found = re.findall(r'<g class="component[^"]*" data-part="([^"]+)"', svg)
    assert sorted(found) == sorted(EXPECTED_PARTS[name])  # each exactly once
    params = dict(re.findall(r'data-part="([^"]+)" data-params="(\d+)"', svg))
    components = reports[name]["params"]["components"]
    stack = "encoder" if name != "smollm2-135m" else "decoder"
    attention = sum(c["total"] for c in components if c["kind"] == "attention" and c["stack"] == stack)
    assert int(params[f"{stack}.attn"]) == attention
    assert sum(int(v) for v in params.values()) == reports[name]["params"]["total"]


def test_pre_and_post_norm_are_drawn_in_their_order(reports):
    def order(svg: str) -> list[str]:
        return [p.split(".")[1] for p in re.findall(r'data-part="(encoder\.[^"]+|decoder\.[^"]+)"', svg)]

    pre = order(diagram_svg(reports["smollm2-135m"]))
    post = order(diagram_svg(reports["bert-base"]))
    assert pre.index("attn_norm") < pre.index("attn") < pre.index("ffn_norm") < pre.index("ffn")
    assert post.index("attn") < post.index("attn_norm") < post.index("ffn") < post.index("ffn_norm")
    s2s = diagram_svg(reports["transformer-base"])
    assert 'class="memory"' in s2s and "K, V of memory" in s2s  # the encoder feeds the cross-attention


def test_roofline_points_carry_the_reports_numbers(reports):
    page = inspect_page(reports["smollm2-135m"])
    points = re.findall(r'<g class="point (prefill|decode)"([^>]*)>', page)
    assert [phase for phase, _ in points] == ["prefill", "decode"]
    for phase, attributes in points:
        values = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', attributes))
        expected = reports["smollm2-135m"]["roofline"][phase]
        for key in ("flops", "bytes", "intensity", "time_s", "tokens_per_s"):
            assert float(values[key.replace("_", "-")]) == expected[key]


class _References(HTMLParser):
    """Every attribute that could load something, and the tags that would."""

    def __init__(self) -> None:
        super().__init__()
        self.references: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "action", "poster", "srcset", "data") and value:
                self.references.append(value)


def test_a_further_compute_roof_is_drawn_flat_from_its_own_ridge():
    """A profile's integer products peak: a dashed roof from its ridge (peak / bandwidth) to the right edge,
    named in the legend, the axis reaching above it."""
    import re

    from anatomy.analysis.page.charts import RoofPoint, roofline_svg

    hardware = {"name": "here", "peak_flops": 1e11, "bandwidth": 1e10, "more_peaks": {"int8 products": 8e11}}
    point = RoofPoint("gemm", "prefill", {"intensity": 200.0, "bound": "compute"}, achieved=4e11, tip="gemm")
    svg = roofline_svg(hardware, [point], dtype="f32")
    more = re.findall(r'<path class="roof roof-more" d="M([\d.]+),([\d.]+) L([\d.]+),([\d.]+)"', svg)
    assert len(more) == 1 and more[0][1] == more[0][3]  # flat
    plain = roofline_svg({k: v for k, v in hardware.items() if k != "more_peaks"}, [point], dtype="f32")
    assert "roof-more" not in plain and "int8 products" in svg and "800 GFLOP/s" in svg


@pytest.mark.parametrize("name", sorted(EXPECTED_PARTS))
def test_the_page_refers_to_nothing_outside_itself(reports, name):
    page = inspect_page(reports[name])
    parser = _References()
    parser.feed(page)
    assert all(ref.startswith("#") for ref in parser.references), parser.references
    assert not parser.tags & {"link", "img", "iframe", "object", "embed", "audio", "video", "base"}
    assert "default-src 'none'" in page  # and the browser is told so
    assert not re.search(r"url\((?!#)|@import|https?://", page)


def test_the_report_travels_in_the_page(reports):
    report = reports["transformer-base"]
    page = inspect_page(report)
    embedded = re.search(r'<script type="application/json" id="anatomy-report">(.*?)</script>', page, re.S).group(1)
    assert json.loads(embedded) == json.loads(json.dumps(report))


def test_user_text_is_escaped(reports):
    report = dict(reports["smollm2-135m"], model={**reports["smollm2-135m"]["model"],
                                                 "name": "</script><img src=x onerror=alert(1)>"})
    page = inspect_page(report)
    assert "<img src=x" not in page and "</script><img" not in page
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page


def test_compare_page_has_every_model(reports):
    trimmed = {name: {k: v for k, v in r.items() if k != "trace"} for name, r in reports.items()}
    page = compare_page(trimmed)
    assert len(re.findall(r'<div class="cell( wide)?" data-model=', page)) == 3
    assert '<div class="cell wide" data-model="transformer-base">' in page  # two stacks: two columns
    assert len(re.findall(r'<g class="point (?:prefill|decode) series', page)) == 2 + 1 + 2  # bert: no decode
    assert f"{reports['bert-base']['params']['total']:,}" in page


def test_squarified_treemap_areas_are_proportional():
    values = [50, 25, 12, 8, 3, 2]
    rects = squarify(values, 0, 0, 600, 300)
    for value, (_, _, w, h) in zip(values, rects):
        assert w * h == pytest.approx(value / 100 * 600 * 300)
    assert sum(w * h for _, _, w, h in rects) == pytest.approx(600 * 300)
    assert all(x >= -1e-9 and y >= -1e-9 and x + w <= 600 + 1e-6 and y + h <= 300 + 1e-6 for x, y, w, h in rects)


def test_notebook_repr_is_the_page_in_a_frame():
    report = anatomy.inspect("gpt2", seq_len=8, context=16)
    frame = report._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts' in frame
    source = html.unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1))
    assert source == report.html() and source.startswith("<!DOCTYPE html>")
    assert report["params"]["total"] == 124_439_808 and "gpt2" in repr(report)
    comparison = anatomy.compare("gpt2", "bert-base", seq_len=8, context=16)
    assert list(comparison) == ["gpt2", "bert-base"] and "trace" not in comparison["gpt2"]
    assert comparison._repr_html_().startswith("<iframe srcdoc=")


def test_inspect_takes_a_config_or_a_model():
    config = get_preset("gpt2", n_layers=2)
    by_config = anatomy.inspect(config, seq_len=8, context=16)
    by_model = anatomy.inspect(anatomy.build_model(config, device="meta"), seq_len=8, context=16, name="tiny")
    assert by_config["params"] == by_model["params"] and by_model["model"]["name"] == "tiny"
    with pytest.raises(InputError, match=r"seq_len=0 must be a positive integer"):
        anatomy.inspect(config, seq_len=0)
    with pytest.raises(InputError, match=r"cannot inspect a list"):
        anatomy.inspect([1, 2])


def test_output_paths_are_checked_before_any_work(tmp_path):
    with pytest.raises(InputError, match=r"--html .*page\.html: the folder .*missing does not exist"):
        check_output_path(tmp_path / "missing" / "page.html")
    with pytest.raises(InputError, match="is a directory, not a file"):
        check_output_path(tmp_path)
    target = tmp_path / "page.html"
    target.write_text("a good page")
    with pytest.raises(UnicodeEncodeError):
        write_page("\ud800 a lone surrogate cannot be encoded", target)
    assert target.read_text() == "a good page"  # no partial file where a good one was
    assert [p.name for p in tmp_path.iterdir()] == ["page.html"]


def test_a_70b_page_stays_small():
    """llama-70b: 80 layers of 8192 wide, yet one block is traced: the page stays under 512 KiB."""
    page = anatomy.inspect("llama-70b").html()
    assert len(page.encode()) < 512 * 1024
    assert "68,976,648,192" in page


def test_a_kind_of_parameter_the_page_does_not_know_is_drawn_as_other(reports):
    """A new family may bring new ledger kinds (experts, routers): they still land in a part and
    in the treemap, coloured as "other"."""
    report = json.loads(json.dumps(reports["smollm2-135m"]))
    extra = {"name": "router", "formula": "D*E", "kind": "router", "stack": "decoder", "per_copy": 576 * 8,
             "copies": 30, "total": 576 * 8 * 30}
    report["params"]["components"].append(extra)
    report["params"]["by_kind"]["router"] = extra["total"]
    report["params"]["total"] += extra["total"]
    parts = diagram_parts(report)
    assert sum(p.params for p in parts.values()) == report["params"]["total"]
    page = inspect_page(report)
    assert 'class="cell fill-other"' in page and 'class="swatch kind-other"' in page
