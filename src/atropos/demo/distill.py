"""`atropos demo --distill`: on-policy distillation of the warm start toward an RL-trained teacher.

1. The teacher: `--teacher PATH`, or the RL demo run first (`atropos demo`'s loop, into
   `{out}/teacher-run`; its last checkpoint).
2. Held-out accuracy (greedy) of the student (the shipped warm start) and of the teacher.
3. The same four processes as the RL demo plus a second local server holding the teacher: the
   `arithmetic` environment asks it for the top-k logprobs of each rollout's tokens
   (`--teacher.*`, `atropos.envs.teacher`), and the trainer distills with `--loss opd` (reverse
   KL on the sampled tokens, `--opd-reward-coef 0`: no reward is used). Groups whose rewards are
   all equal are kept (`--env.ensure_scores_are_not_same false`): they teach as much.
4. The student's held-out accuracy after, and `report.html` with the three accuracies, the
   reverse KL to the teacher per step and held-out samples.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from atropos.demo.report import write_report
from atropos.demo.run import DemoConfig, catch_signals, held_out, mean, run_loop, sample_rows


def train_teacher(cfg: DemoConfig, steps: int, console: Console) -> Path:
    """The RL demo's loop, `steps` steps into `{out}/teacher-run`; its final checkpoint."""
    from atropos.tiny.warmstart import policy_path

    run_cfg = replace(cfg, out=cfg.out / "teacher-run", steps=steps)
    console.print(f"no --teacher given: training one by RL first ({steps} steps)")
    run_loop(run_cfg, str(Path(policy_path()).resolve()), console)
    return run_cfg.out / "trainer" / "checkpoints" / f"step_{steps}"


def run_distill(cfg: DemoConfig | None = None, console: Console | None = None) -> dict[str, Any]:
    """Steps 1 to 4 (see the module docstring); the summary (also in `{out}/summary.json`)."""
    from atropos.tiny.warmstart import policy_path

    cfg = cfg or DemoConfig()
    console = console or Console(stderr=True)
    catch_signals()
    cfg.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    student = str(Path(cfg.policy or policy_path()).resolve())
    teacher = Path(cfg.teacher) if cfg.teacher else train_teacher(cfg, cfg.teacher_steps, console)
    teacher = teacher.resolve()
    console.print(f"[bold]Atropos demo --distill[/bold]: {student} -> the teacher {teacher}")
    before, before_rows = held_out(student, cfg)
    teacher_acc, _ = held_out(str(teacher), cfg)
    console.print(f"student: held-out accuracy {before:.1%}; teacher: {teacher_acc:.1%}")
    metrics = run_loop(cfg, student, console, teacher=str(teacher))
    final = cfg.out / "trainer" / "checkpoints" / f"step_{cfg.steps}"
    after, after_rows = held_out(str(final), cfg)
    console.print(f"distilled: held-out accuracy {after:.1%}")
    gap = teacher_acc - before
    kl = [m["reverse_kl"] for m in metrics if m.get("reverse_kl") is not None]
    summary = {
        "held-out accuracy, student before": before,
        "held-out accuracy, teacher": teacher_acc,
        "held-out accuracy, student after": after,
        "share of the gap closed": (after - before) / gap if gap > 0 else None,
        "held-out items": len(after_rows),
        "steps": len(metrics),
        "sequences per step": cfg.batch_size,
        "reverse KL to the teacher, first 10 steps": mean(kl[:10]),
        "reverse KL to the teacher, last 10 steps": mean(kl[-10:]),
        "reward (not trained on), first 10 steps": mean([m["reward_mean"] for m in metrics[:10]]),
        "reward (not trained on), last 10 steps": mean([m["reward_mean"] for m in metrics[-10:]]),
        "teacher": str(teacher),
        "seed": cfg.seed,
        "wall time (s)": round(time.monotonic() - t0, 1),
    }
    samples = sample_rows(before_rows, after_rows, cfg.samples_shown)
    title = "Atropos demo: distilling an RL-trained teacher into the warm start, on CPU"
    report = write_report(cfg.out / "report.html", summary, metrics, samples, title=title)
    (cfg.out / "summary.json").write_text(
        json.dumps({"summary": summary, "config": asdict(cfg)}, indent=2, default=str)
    )
    console.print(f"report: {report}")
    return summary
