"""The demo's report charts in a real browser (Debian's chromium through Playwright), at 1280 and
640 px, from made-up metrics (no training run): nothing wider than the page, the y title clear
of the tick labels, the legend clear of the lines, whole round step ticks, and the note on why
the reward moves less than held-out accuracy. Screenshots go to the test's tmp dir, and with
ATROPOS_REPORT_SCREENSHOTS=1 also to benchmarks/results/demo_report_{1280,640}.png.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from atropos.demo.report import write_report

pytest.importorskip("playwright.sync_api")

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
Box = dict[str, float]

GEOMETRY = """() => {
  const box = e => { const r = e.getBoundingClientRect();
    return {l: r.left, t: r.top, r: r.right, b: r.bottom}; };
  const screen = (m, q) => {
    const s = new DOMPoint(q.x, q.y).matrixTransform(m);
    return [s.x, s.y];
  };
  return {
    scrollWidth: document.scrollingElement.scrollWidth, innerWidth: window.innerWidth,
    notes: [...document.querySelectorAll('p.note')].map(p => p.textContent),
    charts: [...document.querySelectorAll('svg.chart')].map(svg => ({
      title: svg.getAttribute('aria-label'), box: box(svg),
      yTitle: box(svg.querySelector('.y-title')), legend: box(svg.querySelector('.legend')),
      yTicks: [...svg.querySelectorAll('.tick.y')].map(box),
      xTicks: [...svg.querySelectorAll('.tick.x')].map(t => ({box: box(t), text: t.textContent})),
      texts: [...svg.querySelectorAll('text')].map(box),
      points: [...svg.querySelectorAll('polyline.series')].flatMap(p => {
        const m = p.getScreenCTM(), n = p.getTotalLength();
        const out = [...p.points].map(q => screen(m, q));  // the data points, then the line
        for (let i = 0; i <= 500; i++) out.push(screen(m, p.getPointAtLength(n * i / 500)));
        return out;
      }),
    })),
  };
}"""


def synthetic_metrics(steps: int = 100, distill: bool = False) -> list[dict[str, Any]]:
    """Rows like the trainer's metrics.jsonl: a reward rising to ~0.95 (the top right corner,
    where a legend would sit), a small mismatch with spikes and a few missing steps."""
    rows = []
    for s in range(1, steps + 1):
        row: dict[str, Any] = {
            "step": s,
            "reward_mean": min(1.0, 0.3 + 0.65 * s / steps + 0.08 * math.sin(s * 1.7)),
            "logprob_mismatch": None
            if s % 17 == 0
            else 0.004 + 0.003 * math.sin(s) ** 2 + (0.02 if s % 23 == 0 else 0.0),
            "on_policy_fraction": 0.9,
        }
        if distill:
            row["reverse_kl"] = 0.9 * math.exp(-s / 30) + 0.05
        rows.append(row)
    return rows


def synthetic_report(path: Path, distill: bool = False) -> Path:
    summary = {
        "held-out accuracy, warm start": 0.412,
        "held-out accuracy, trained": 0.774,
        "held-out items": 500,
        "steps": 100,
        "logprob mismatch, mean (on-policy tokens)": 0.0061,
        "on-policy share of sequences": 0.9,
    }
    samples = [
        {
            "prompt": f"What is {a} + {b}?", "answer": a + b,
            "before": f" {a + b + (a % 3)}", "before_correct": a % 3 == 0,
            "after": f" {a + b}", "after_correct": True,
        }
        for a, b in [(12, 34), (7, 88), (45, 45), (99, 1)]
    ]  # fmt: skip
    return write_report(path, summary, synthetic_metrics(distill=distill), samples)


def overlaps(a: Box, b: Box) -> bool:
    return a["l"] < b["r"] and b["l"] < a["r"] and a["t"] < b["b"] and b["t"] < a["b"]


def inside(point: list[float], box: Box, pad: float = 1.5) -> bool:
    x, y = point
    return box["l"] - pad <= x <= box["r"] + pad and box["t"] - pad <= y <= box["b"] + pad


def is_nice(step: int) -> bool:
    """1, 2 or 5 times a power of ten."""
    return step > 0 and any(step == m * 10**k for k in range(7) for m in (1, 2, 5))


@pytest.mark.parametrize("distill", [False, True], ids=["rl", "distill"])
@pytest.mark.parametrize("width", [1280, 640])
def test_report_charts_fit_and_do_not_overlap(
    browser: Any, tmp_path: Path, width: int, distill: bool
) -> None:
    report = synthetic_report(tmp_path / "report.html", distill=distill)
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        page.goto(report.as_uri())
        got = page.evaluate(GEOMETRY)
        shot = tmp_path / f"demo_report_{width}.png"
        page.screenshot(path=str(shot), full_page=True)
    finally:
        page.close()
    if os.environ.get("ATROPOS_REPORT_SCREENSHOTS") == "1" and not distill:
        shutil.copyfile(shot, RESULTS / shot.name)

    assert got["scrollWidth"] <= got["innerWidth"] == width  # no horizontal scroll
    charts = {c["title"]: c for c in got["charts"]}
    expected = {"Reward of the rollouts trained on", "Trainer vs inference logprobs"}
    assert set(charts) == expected | ({"Reverse KL to the teacher"} if distill else set())
    for title, c in charts.items():
        assert 0 <= c["box"]["l"] and c["box"]["r"] <= width, title
        for text in c["texts"]:  # no label cut off by the chart's edge
            assert c["box"]["l"] <= text["l"] and text["r"] <= c["box"]["r"] + 0.5, title
        ticks = c["yTicks"] + [t["box"] for t in c["xTicks"]]
        assert len(c["yTicks"]) >= 3 and not any(overlaps(c["yTitle"], t) for t in ticks), title
        assert c["points"] and not any(inside(p, c["legend"]) for p in c["points"]), title
        labels = [t["text"] for t in c["xTicks"]]
        assert all(re.fullmatch(r"-?\d+", t) for t in labels), (title, labels)
        steps = {int(b) - int(a) for a, b in zip(labels, labels[1:], strict=False)}
        assert len(labels) >= 3 and len(steps) == 1 and is_nice(steps.pop()), (title, labels)
        boxes = [t["box"] for t in c["xTicks"]]
        assert not any(overlaps(a, b) for a, b in zip(boxes, boxes[1:], strict=False)), title
    [note] = got["notes"]
    assert "temperature 1" in note and "greedy" in note
    assert ("dropped" in note) is not distill  # distillation keeps the all-equal groups
