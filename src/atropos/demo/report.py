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


FONT = 11  # tick, axis-title and legend text, in the chart's own units (px at full size)
CHAR_W = 0.62 * FONT  # a generous width of one character of that text (digits are ~0.55 em)
WIDTH = 640  # the chart's own width: it scales down to its container (viewBox), never wider


def nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round ticks about `count` intervals apart (1, 2 or 5 times a power of ten) covering
    [lo, hi]: the first at or below `lo`, the last at or above `hi`; with `integer`, whole
    numbers a whole step apart (steps of training are never 25.8).

    >>> nice_ticks(1, 100, integer=True)
    [0, 20, 40, 60, 80, 100]
    >>> nice_ticks(1, 3, integer=True), nice_ticks(4, 4, integer=True)
    ([1, 2, 3], [3, 4, 5])
    >>> nice_ticks(0.0, 1.0)
    [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    """
    if hi <= lo:  # one value: around it
        pad = 1.0 if integer or lo == 0 else abs(lo) / 10
        lo, hi = lo - pad, hi + pad
    step = _nice_step((hi - lo) / max(count, 1))
    if integer:
        step = max(1.0, round(step))
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    digits = _decimals(step)
    if integer:
        return [int(k * step) for k in range(first, last + 1)]
    return [round(k * step, digits + 1) for k in range(first, last + 1)]


def _nice_step(raw: float) -> float:
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw * (1 - 1e-9))


def _decimals(step: float) -> int:
    return max(0, -math.floor(math.log10(step) + 1e-9))


def tick_label(value: float, step: float) -> str:
    """`value` with as many decimals as the tick step needs (exponent form below 1e-4).

    >>> [tick_label(v, s) for v, s in [(0, 0.2), (0.4, 0.2), (20, 20), (15e-4, 5e-4), (4e-5, 2e-5)]]
    ['0.0', '0.4', '20', '0.0015', '4e-05']
    """
    digits = _decimals(step)
    if digits > 4 or abs(value) >= 1e5:
        return f"{value:.2g}"
    return f"{value:.{digits}f}"


def line_chart(
    series: dict[str, list[Point]],
    title: str,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    height: int = 260,
) -> str:
    """An SVG line chart of named series of (x = step, y) points (None-free).

    It scales to its container (viewBox, CSS width 100% up to its own width). Steps get whole
    round ticks; the legend is a row above the plot, never over the data; the plot's left margin
    is sized to the longest y tick label, so the rotated y title never meets them.

    Long because it writes one SVG in drawing order: title, legend, frame, grid, labels, series.
    """
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f"<p>{html.escape(title)}: no data</p>"
    xs = nice_ticks(min(p[0] for p in pts), max(p[0] for p in pts), 6, integer=True)
    lo, hi = y_range or (min(p[1] for p in pts), max(p[1] for p in pts))
    ys = nice_ticks(lo, hi, 5)
    if y_range is not None:  # the fixed range, its round ticks only
        ys = [y for y in ys if lo - 1e-9 <= y <= hi + 1e-9] or [lo, hi]
    x0, x1 = xs[0], xs[-1]
    y0, y1 = (lo, hi) if y_range is not None else (ys[0], ys[-1])
    if y1 == y0:
        y1 = y0 + 1
    y_step = ys[1] - ys[0] if len(ys) > 1 else 1.0
    y_texts = [tick_label(y, y_step) for y in ys]
    # left: a gap, the rotated y title (one line tall), a gap, the widest tick label, a gap
    left = 6 + FONT + 8 + math.ceil(max(len(t) for t in y_texts) * CHAR_W) + 6
    right = 8 + math.ceil(len(str(xs[-1])) * CHAR_W / 2)
    pw = WIDTH - left - right
    rows = _legend_rows(list(series), pw)
    top, bottom = 26 + 16 * len(rows) + 6, 36
    ph = height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * ph

    e = html.escape
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" aria-label="{e(title)}" '
        f'font-size="{FONT}">',
        f'<text x="{left}" y="18" font-size="14" font-weight="600">{e(title)}</text>',
        '<g class="legend">',
    ]
    colors = {name: COLORS[i % len(COLORS)] for i, name in enumerate(series)}
    for r, row in enumerate(rows):
        lx, ly = left, 26 + 16 * r + 8
        for name in row:
            parts.append(
                f'<line x1="{lx}" x2="{lx + 16}" y1="{ly}" y2="{ly}" stroke="{colors[name]}" '
                f'stroke-width="2"/><text x="{lx + 20}" y="{ly + 4}">{e(name)}</text>'
            )
            lx += _legend_width(name) + 16
    parts += [
        "</g>",
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>',
    ]
    for y, text in zip(ys, y_texts, strict=True):
        parts.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
            f'stroke="#eee"/><text class="tick y" x="{left - 6}" y="{sy(y) + 4:.1f}" '
            f'text-anchor="end">{text}</text>'
        )
    for x in xs:
        parts.append(
            f'<line x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top + ph}" y2="{top + ph + 4}" '
            f'stroke="#999"/><text class="tick x" x="{sx(x):.1f}" y="{top + ph + 16}" '
            f'text-anchor="middle">{x:g}</text>'
        )
    mid = top + ph / 2
    parts.append(
        f'<text class="x-title" x="{left + pw / 2}" y="{height - 4}" text-anchor="middle">step'
        f'</text><text class="y-title" x="{6 + FONT - 2}" y="{mid}" text-anchor="middle" '
        f'transform="rotate(-90 {6 + FONT - 2} {mid})">{e(y_label)}</text>'
    )
    for name, points in series.items():
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
        parts.append(
            f'<polyline class="series" fill="none" stroke="{colors[name]}" stroke-width="2" '
            f'points="{path}"><title>{e(name)}</title></polyline>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _legend_width(name: str) -> int:
    return 20 + math.ceil(len(name) * CHAR_W)


def _legend_rows(names: list[str], width: int) -> list[list[str]]:
    """The legend's entries in rows no wider than `width` (one entry per row at the least)."""
    rows: list[list[str]] = [[]]
    used = 0
    for name in names:
        w = _legend_width(name)
        if rows[-1] and used + 16 + w > width:
            rows.append([])
            used = 0
        used += (16 if rows[-1] else 0) + w
        rows[-1].append(name)
    return rows


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


def reward_note(metrics: list[dict[str, Any]]) -> str:
    """Why the reward curve moves less than held-out accuracy, true of the run's settings
    (`atropos.demo.run`: the environment samples at its temperature 1 and drops groups of all-equal
    rewards unless distilling; `held_out` decodes greedily, the same items before and after)."""
    kept = any(m.get("reverse_kl") is not None for m in metrics)  # distillation keeps them all
    dropped = (
        ""
        if kept
        else "; groups whose answers all score the same are dropped, so the batch never holds "
        "the questions the policy always solves"
    )
    return (
        "Why this moves less than held-out accuracy: each point is the mean reward of one "
        "trained batch, a group of answers per training question sampled at temperature 1"
        f"{dropped}. Held-out accuracy is greedy decoding of fixed held-out questions (before "
        "and after training): one counts as solved once the right answer is the most likely, "
        "long before every sample gets it right."
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
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{e(title)}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; padding: 0 1em;
  max-width: 980px; color: #222 }}
svg.chart {{ display: block; width: 100%; max-width: {WIDTH}px; height: auto; margin: 1em 0 0 }}
p.note {{ max-width: {WIDTH}px; color: #444 }}
table {{ border-collapse: collapse; margin: 1em 0 }}
th, td {{ border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top }}
pre {{ margin: 0; white-space: pre-wrap; font-size: 12px }}
td.ok {{ background: #ecfdf3 }} td.bad {{ background: #fef2f2 }}
</style></head><body>
<h1>{e(title)}</h1>
<table>{rows}</table>
{kl_chart(metrics)}
{reward_chart(metrics)}
<p class="note">{e(reward_note(metrics))}</p>
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
