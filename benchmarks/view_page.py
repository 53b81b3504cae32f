"""The static viewer against atroposlib 0.4.0's `jsonl2html`, side by side on one JSONL file.

    .venv/bin/python benchmarks/view_page.py [--groups 2000] [--group-size 8] [--tokens 512]
        [--repeat 3] [--upstream-python PATH] [--no-browser]

Writes a seeded file of `process`-shaped groups (tokens, masks, scores, chat messages), then
times, for each tool in its own process: wall seconds, CPU seconds and peak resident memory
(`wait4`'s rusage of that process alone), and the page's size. Tools: upstream's
`atroposlib.frontend.jsonl2html.generate_html` (from the venv of `scripts/upstream_venv.py
full`), `atropos view` without a tokenizer (the same work: messages and scores), and `atropos
view --tokenizer tiny` (every token decoded and its mask shown). With Debian's chromium and
Playwright present, it also times each page in headless chromium: until the `load` event, and
for ours until the page's script marks it ready (`data-ready`). Medians over `--repeat` runs go
to benchmarks/results/view_page.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from procstat import code_version, machine, upstream_python  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
WORDS = "the of a to in is it that for on was with as by at be this from or an are".split()


def write_groups(path: Path, groups: int, group_size: int, tokens: int, seed: int = 0) -> None:
    """`groups` lines shaped like `atropos env process` output (prompt 1/5 of the tokens)."""
    rng = random.Random(seed)
    prompt_len = tokens // 5
    with path.open("w") as f:
        for g in range(groups):
            question = " ".join(rng.choice(WORDS) for _ in range(40)) + f" (item {g})?"
            toks = [[rng.randrange(3, 1000) for _ in range(tokens)] for _ in range(group_size)]
            row = {
                "tokens": toks,
                "masks": [[-100] * prompt_len + t[prompt_len:] for t in toks],
                "scores": [rng.choice([1.0, -1.0, 0.5]) for _ in range(group_size)],
                "messages": [
                    [
                        {"role": "user", "content": question},
                        {
                            "role": "assistant",
                            "content": " ".join(rng.choice(WORDS) for _ in range(300)),
                        },
                    ]
                    for _ in range(group_size)
                ],
            }
            f.write(json.dumps(row) + "\n")


def run_measured(argv: list[str]) -> dict[str, float]:
    """Wall, CPU and peak RSS of one process (its own rusage, from wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} failed ({proc.returncode}): {err[-2000:]}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def browser_seconds(page: Path, ours: bool) -> dict[str, float] | None:
    """Seconds until `load`, and (ours) until the script has built every group."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not os.path.exists(CHROMIUM):
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            start = time.perf_counter()
            tab.goto(page.as_uri(), wait_until="load", timeout=600_000)
            out = {"load_s": time.perf_counter() - start}
            if ours:
                tab.wait_for_function("document.body.dataset.ready === '1'", timeout=600_000)
                out["ready_s"] = time.perf_counter() - start
            return out
        finally:
            browser.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--groups", type=int, default=2000)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512, help="tokens per sequence")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--upstream-python", default=None, help="default: scripts/upstream_venv.py's")
    p.add_argument("--no-browser", action="store_true")
    p.add_argument("--work", default=str(ROOT / "runs" / "view-bench"))
    p.add_argument("--json", default=str(HERE / "results" / "view_page.json"))
    p.add_argument("--markdown", default=str(HERE / "results" / "view_page.md"))
    args = p.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "groups.jsonl"
    print(f"writing {args.groups} groups of {args.group_size} x {args.tokens} tokens", flush=True)
    write_groups(data, args.groups, args.group_size, args.tokens)
    upstream = args.upstream_python or upstream_python("full")
    ours = str(ROOT / ".venv" / "bin" / "atropos")
    limit = ["--limit", str(args.groups)]
    tools: dict[str, tuple[list[str], Path, bool]] = {
        "upstream jsonl2html": (
            [
                upstream,
                "-c",
                "import sys; from atroposlib.frontend.jsonl2html import generate_html;"
                " generate_html(sys.argv[1], sys.argv[2])",
                str(data),
                str(work / "upstream.html"),
            ],
            work / "upstream.html",
            False,
        ),
        "atropos view": (
            [ours, "view", str(data), "-o", str(work / "ours.html"), *limit],
            work / "ours.html",
            True,
        ),
        "atropos view --tokenizer tiny": (
            [ours, "view", str(data), "-o", str(work / "ours_tok.html"), "--tokenizer", "tiny"]
            + limit,
            work / "ours_tok.html",
            True,
        ),
    }
    results: dict[str, Any] = {}
    for name, (argv, page, is_ours) in tools.items():
        runs = []
        for i in range(args.repeat):
            print(f"{name}: run {i + 1}/{args.repeat}", flush=True)
            run = run_measured(argv)
            if not args.no_browser:
                run.update(browser_seconds(page, is_ours) or {})
            runs.append(run)
        keys = runs[0].keys()
        results[name] = {k: statistics.median(r[k] for r in runs) for k in keys}
        results[name]["page_mib"] = page.stat().st_size / 2**20
        results[name]["runs"] = runs
    doc = {
        "workload": {
            "groups": args.groups,
            "group_size": args.group_size,
            "tokens": args.tokens,
            "jsonl_mib": data.stat().st_size / 2**20,
        },
        "repeat": args.repeat,
        "machine": machine(),
        "code": code_version(),
        "results": results,
    }
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    cols = ["wall_s", "cpu_s", "peak_rss_mib", "page_mib", "load_s", "ready_s"]
    lines = [
        f"{args.groups} groups x {args.group_size} sequences x {args.tokens} tokens"
        f" ({doc['workload']['jsonl_mib']:.0f} MiB JSONL), medians of {args.repeat}",
        "",
        "| tool | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for name, r in results.items():
        cells = [f"{r[c]:.2f}" if c in r else "" for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    Path(args.markdown).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
