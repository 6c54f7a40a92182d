"""The compile report (JSON) of every compile, its HTML page, and ``pipeline report``.

The HTML test renders the page of a real model in headless Chromium and checks, in the layout
Chromium computed, that every key section is on screen with its content; it is skipped where no
Chromium binary exists (install Debian's ``chromium`` to run it)."""
from __future__ import annotations

import html
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from pipeline.tools.cli import main
from pipeline.tools.report_html import SECTIONS, render_html


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class GatedBlock(torch.nn.Module):
    """A transformer encoder layer behind a data-dependent check (one graph break). SiLU keeps
    the layer off ATen's fused inference fast path, so attention, norms and MLP are traced."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                                      activation=torch.nn.functional.silu, batch_first=True)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        if x.abs().max().item() > 100:   # graph break: a Python branch on a tensor value
            x = x / 100
        return torch.softmax(self.norm(self.layer(x)), dim=-1)


def compiled_block(tmp_path: Path, **kwargs):
    model = GatedBlock().eval()
    compiled = pipeline.compile_with_plan(model, "default", options={"capture": {"dynamic": False}},
                                          expect={"max_graph_breaks": 4, "max_kernels": 50}, **kwargs)
    with torch.no_grad():
        compiled(torch.randn(2, 6, 32))
        compiled(torch.randn(2, 5, 32))   # other sizes under static shapes: recompiles
    return compiled


@pytest.fixture(scope="module")
def block_report(tmp_path_factory) -> Path:
    """The report folder of the block compiled with ``report=`` a folder."""
    torch._dynamo.reset()
    folder = tmp_path_factory.mktemp("report")
    compiled_block(folder, report=folder)
    return folder


# -- the JSON report ---------------------------------------------------------------------------
def test_report_folder_gets_json_and_html_after_the_calls_that_compiled(block_report):
    report = json.loads((block_report / "report.json").read_text())
    assert report["format"] == "pipeline-compile-report/1"
    assert (block_report / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert report["summary"]["recompiles"] >= 1 and report["summary"]["graph_breaks"] >= 1


def test_report_names_graph_breaks_with_their_source_line(block_report):
    report = json.loads((block_report / "report.json").read_text())
    first = report["graph_breaks"][0]
    assert first["file"].endswith("test_report.py")
    assert first["code"] == "if x.abs().max().item() > 100:   # graph break: a Python branch on a tensor value"
    # Dynamo's wording depends on whether .item() was captured (data_dependent) or broke the graph
    assert "data-dependent" in first["summary"].lower()


def test_report_has_each_graph_as_captured_and_after_every_pass(block_report):
    report = json.loads((block_report / "report.json").read_text())
    plan = [p["name"] for p in report["plan"]["passes"]]
    for graph in report["graphs"]:
        assert [s["stage"] for s in graph["sources"]] == ["captured"] + plan[1:]
        assert [p["pass"] for p in graph["passes"]] == plan[1:]
        assert all(p["plugin"].startswith("plan-pipeline") for p in graph["passes"])


def test_report_lists_kernels_with_source_fusion_decisions_and_cache_outcomes(block_report):
    report = json.loads((block_report / "report.json").read_text())
    kernels = [k for g in report["graphs"] for k in g["kernels"]]
    assert kernels and all(k["source"].strip() and k["ops"] for k in kernels)
    assert any(g["fusion"]["decisions"] for g in report["graphs"])
    assert all(g["cache"] for g in report["graphs"] if g["kernels"])
    assert any("aten.linear" in op or "aten.addmm" in op or "aten.mm" in op
               for g in report["graphs"] for op in g["extern_calls"])


def test_report_shows_each_expectation_with_its_measured_value(block_report):
    report = json.loads((block_report / "report.json").read_text())
    assert {e["key"]: e["ok"] for e in report["expectations"]} == {"max_graph_breaks": True, "max_kernels": True}
    assert report["expectations"][0]["measured"] == report["summary"]["graph_breaks"]


def test_recompiles_name_the_guard_that_failed(block_report):
    report = json.loads((block_report / "report.json").read_text())
    assert any("size mismatch" in r["reason"] for r in report["recompiles"])
    assert all(c["guards"] for c in report["captures"])


def test_without_a_request_no_graph_sources_are_kept(tmp_path, monkeypatch):
    monkeypatch.delenv("PIPELINE_REPORT_DIR", raising=False)
    compiled = pipeline.compile_with_plan(lambda x: torch.relu(x) * 2, "default")
    compiled(torch.randn(8))
    report = pipeline.compile_report(compiled)
    assert report["summary"]["sources_recorded"] is False
    assert all(g["sources"] == [] for g in report["graphs"])
    assert report["graphs"][0]["kernels"]


def test_report_dir_environment_variable_writes_one_folder_per_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_REPORT_DIR", str(tmp_path))
    for scale in (2, 3):
        compiled = pipeline.compile_with_plan(lambda x, s=scale: torch.relu(x) * s, "default")
        compiled(torch.randn(8))
    folders = sorted(p.parent for p in tmp_path.glob("*/report.json"))
    assert len(folders) == 2 and all(f.name.startswith("default-") for f in folders)
    assert json.loads((folders[0] / "report.json").read_text())["summary"]["sources_recorded"] is True


def test_a_call_that_raises_still_writes_the_report_of_what_compiled(tmp_path):
    def checked(x):
        y = torch.sin(x) * 2
        if y.abs().sum().item() >= 0:
            raise ValueError("rejected by the model")
        return y

    compiled = pipeline.compile_with_plan(checked, "default", report=tmp_path)
    with pytest.raises(ValueError, match="rejected by the model"):
        compiled(torch.randn(4))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"]["graphs"] == 1 and report["summary"]["graph_breaks"] == 1


def test_a_missed_expectation_is_in_the_report_written_for_that_call(tmp_path):
    compiled = pipeline.compile_with_plan(lambda x: torch.sin(x) * 2, "default", report=tmp_path,
                                          expect={"max_kernels": 0})
    with pytest.raises(pipeline.ExpectationError):
        compiled(torch.randn(4))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["expectations"] == [{"key": "max_kernels", "limit": 0, "measured": 1, "ok": False}]


# -- the command ---------------------------------------------------------------------------------
def test_report_command_renders_the_page_from_json_and_prints_its_path(block_report, capsys):
    page = block_report / "report.html"
    page.unlink()
    assert main(["report", str(block_report), "--no-open"]) == 0
    assert capsys.readouterr().out.strip() == str(page)
    assert page.read_text() == render_html(json.loads((block_report / "report.json").read_text()))


def test_report_command_on_a_missing_report_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--no-open"]) == 2
    assert "no compile report at" in capsys.readouterr().err


def test_report_command_serves_the_page_over_http(block_report):
    import urllib.request
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.tools.cli", "report", str(block_report), "--serve"],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        process.stdout.readline()                       # the page path
        line = process.stdout.readline()                # serving http://127.0.0.1:PORT/report.html
        url = line.split()[1]
        with urllib.request.urlopen(url, timeout=30) as response:
            assert b'<section id="graph-breaks">' in response.read()
    finally:
        process.terminate()
        process.wait(timeout=30)


# -- the page in a real browser -----------------------------------------------------------------
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome", "chrome")
                 if shutil.which(name)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (apt-get install chromium)")

# Reports, for every section, its box in the laid-out page and its text (run by Chromium).
PROBE = """<script>
window.addEventListener('load', () => {
  const out = {};
  for (const section of document.querySelectorAll('main > section')) {
    const box = section.getBoundingClientRect();
    const style = getComputedStyle(section);
    out[section.id] = {width: box.width, height: box.height, top: box.top + window.scrollY,
                       shown: style.display !== 'none' && style.visibility !== 'hidden' && style.opacity !== '0',
                       text: section.innerText};
  }
  document.body.setAttribute('data-probe', JSON.stringify(out));
});
</script>"""


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=180)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", data[16:24])


@needs_chromium
def test_html_report_of_a_real_model_shows_every_key_section_in_chromium(block_report, tmp_path):
    page = tmp_path / "probed.html"
    page.write_text((block_report / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    done = chromium("--dump-dom", "--window-size=1280,1000", page.as_uri(), profile=tmp_path / "profile-dom")
    assert 'data-probe="' in done.stdout, done.stderr[-2000:]
    probe = json.loads(html.unescape(done.stdout.split('data-probe="', 1)[1].split('"', 1)[0]))
    assert list(probe) == list(SECTIONS)
    for key, title in SECTIONS.items():
        box = probe[key]
        assert box["shown"] and box["width"] > 600 and box["height"] > 40, (key, box)
        assert box["text"].startswith(title), key
    tops = [probe[key]["top"] for key in SECTIONS]
    assert tops == sorted(tops), "sections overlap or are out of order"
    text = {key: probe[key]["text"] for key in SECTIONS}
    assert "test_report.py" in text["graph-breaks"] and "data-dependent branching" in text["graph-breaks"].lower()
    assert "size mismatch" in text["guards"]
    assert "fused_0" in text["fusion"] and "reduction" in text["fusion"]
    assert "cpp_fused_0" in text["kernels"]
    assert "aten." in text["extern-calls"]
    assert "no pass in the plan wrapped it" in text["cudagraphs"]
    assert "C++ kernel(s)" in text["cache"]
    assert "functionalize" in text["pass-times"] and "as captured" in text["graphs"]
    assert "expect.max_graph_breaks" in text["expectations"] and "met" in text["expectations"]

    shot = tmp_path / "report.png"
    blank_page = tmp_path / "blank.html"
    blank_page.write_text("<!DOCTYPE html><html><body style='background:#f6f7f9'></body></html>")
    blank = tmp_path / "blank.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,3000", (block_report / "report.html").as_uri(),
             profile=tmp_path / "profile-shot")
    chromium(f"--screenshot={blank}", "--window-size=1280,3000", blank_page.as_uri(), profile=tmp_path / "profile-blank")
    assert png_size(shot) == (1280, 3000)
    # A painted page compresses far worse than an empty one of the same size.
    assert shot.stat().st_size > 10 * blank.stat().st_size
