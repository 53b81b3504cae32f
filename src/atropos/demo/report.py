"""The demo's report: one self-contained HTML page (inline SVG plots, no scripts, text escaped).

`write_report(path, summary, metrics, samples)`: `summary` holds the headline numbers,
`metrics` the trainer's per-step rows (metrics.jsonl), `samples` the held-out prompts with the
warm start's and the trained policy's answers.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Point = tuple[float, float]
COLORS = ("#9bb7d4", "#1f5fa8", "#c2410c", "#15803d")


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values.

    >>> moving_average([0, 2, 4, 6], 2)
    [0.0, 1.0, 3.0, 5.0]
    """
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def line_chart(
    series: dict[str, list[Point]],
    title: str,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    width: int = 640,
    height: int = 260,
) -> str:
    """An SVG line chart of named series of (x, y) points (None-free).

    Long because it writes one SVG in drawing order: frame, grid, labels, series.
    """
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f"<p>{html.escape(title)}: no data</p>"
    x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
    y0, y1 = y_range or (min(p[1] for p in pts), max(p[1] for p in pts))
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y1 = y0 + 1
    left, right, top, bottom = 56, 16, 28, 36
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{html.escape(title)}">',
        f'<text x="{left}" y="18" font-size="14" font-weight="600">{html.escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
    ]
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
            f'stroke="#eee"/><text x="{left - 6}" y="{sy(y) + 4:.1f}" font-size="11" '
            f'text-anchor="end">{_num(y)}</text>'
        )
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        parts.append(
            f'<text x="{sx(x):.1f}" y="{top + ph + 16}" font-size="11" '
            f'text-anchor="middle">{_num(x)}</text>'
        )
    parts.append(
        f'<text x="{left + pw / 2}" y="{height - 4}" font-size="11" text-anchor="middle">'
        f'step</text><text x="12" y="{top + ph / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + ph / 2})">{html.escape(y_label)}</text>'
    )
    for i, (name, points) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        parts.append(
            f'<text x="{left + pw - 4}" y="{top + 16 + 14 * i}" font-size="11" '
            f'text-anchor="end" fill="{color}">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _num(v: float) -> str:
    if v == 0 or 1e-3 <= abs(v) < 1e4:
        return f"{v:.3g}"
    return f"{v:.1e}"


def reward_chart(metrics: list[dict[str, Any]]) -> str:
    steps = [float(m["step"]) for m in metrics]
    rewards = [float(m["reward_mean"]) for m in metrics]
    window = max(1, min(10, len(rewards) // 5 or 1))
    return line_chart(
        {
            "reward per batch": list(zip(steps, rewards, strict=True)),
            f"moving mean ({window} steps)": list(
                zip(steps, moving_average(rewards, window), strict=True)
            ),
        },
        "Reward of the rollouts trained on",
        "mean reward",
        (0.0, 1.0),
    )


def mismatch_chart(metrics: list[dict[str, Any]]) -> str:
    pts = [
        (float(m["step"]), float(m["logprob_mismatch"]))
        for m in metrics
        if m.get("logprob_mismatch") is not None and math.isfinite(m["logprob_mismatch"])
    ]
    return line_chart(
        {"|trainer - inference| logprob, on-policy tokens": pts},
        "Trainer vs inference logprobs",
        "mean abs difference",
    )


def kl_chart(metrics: list[dict[str, Any]]) -> str:
    """The distillation's reverse KL to the teacher per step ("" when the run had none)."""
    pts = [
        (float(m["step"]), float(m["reverse_kl"]))
        for m in metrics
        if m.get("reverse_kl") is not None and math.isfinite(m["reverse_kl"])
    ]
    if not pts:
        return ""
    return line_chart(
        {"KL(student || teacher), sampled tokens": pts}, "Reverse KL to the teacher", "nats/token"
    )


def write_report(
    path: Path,
    summary: dict[str, Any],
    metrics: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    title: str = "Atropos demo: a tiny model learning by RL on CPU",
) -> Path:
    """Write the page; every string from the model or the config is escaped."""
    e = html.escape
    rows = "".join(
        f"<tr><th>{e(str(k))}</th><td>{e(_show(v))}</td></tr>" for k, v in summary.items()
    )
    sample_rows = "".join(
        "<tr><td><pre>{}</pre></td><td class='{}'><pre>{}</pre></td><td class='{}'><pre>{}</pre>"
        "</td><td>{}</td></tr>".format(
            e(s["prompt"]),
            "ok" if s["before_correct"] else "bad",
            e(s["before"]),
            "ok" if s["after_correct"] else "bad",
            e(s["after"]),
            e(str(s["answer"])),
        )
        for s in samples
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{e(title)}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 980px; color: #222 }}
table {{ border-collapse: collapse; margin: 1em 0 }}
th, td {{ border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top }}
pre {{ margin: 0; white-space: pre-wrap; font-size: 12px }}
td.ok {{ background: #ecfdf3 }} td.bad {{ background: #fef2f2 }}
</style></head><body>
<h1>{e(title)}</h1>
<table>{rows}</table>
{kl_chart(metrics)}
{reward_chart(metrics)}
{mismatch_chart(metrics)}
<h2>Held-out samples, greedy decoding</h2>
<table><tr><th>prompt</th><th>warm start</th><th>after training</th><th>answer</th></tr>
{sample_rows}</table>
</body></html>
"""
    path.write_text(page, encoding="utf-8")
    return path


def _show(value: Any, percent: bool = False) -> str:
    if percent and isinstance(value, float):
        return f"{value:.1%}"
    if isinstance(value, float):
        return _num(value)
    return str(value)
