"""TRL on Atropos against TRL on its own generation, and the demo's loop with TRL as its trainer.

    .venv/bin/python benchmarks/trl_compare.py [--seeds 0 1 2] [--steps 100] [--parts demo native]

Needs the TRL venv (`python scripts/upstream_venv.py trl`, or $ATROPOS_TRL_PYTHON).

* `demo`: `atropos demo`'s loop (API, local server, `arithmetic` environment, as `atropos.demo.run`
  starts them) with `python -m atropos.integrations.trl` in place of `atropos train`, the same
  knobs (64 sequences a step: 8 groups of 8, lr 5e-4, weights reloaded every step), held-out
  accuracy before and after on the demo's 500 items. The demo has no trainer option, so this
  script swaps the trainer's command in `atropos.demo.run` for its run (`with_trl_trainer`).
* `native`: TRL's `GRPOTrainer` alone on the same task: prompts of the environment's training
  items, its reward (`score_answer`), transformers' `generate` for the completions (8 per
  prompt, 8 prompts a step, at most 8 new tokens at temperature 1), the same lr and loss.

Both report steps/s of training (the trainer's own steps, model loading excluded) and held-out
accuracy. Writes benchmarks/results/trl_compare.{json,md}. `demo_seeds.py --trainer trl` runs the
`demo` part alone, over its seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LR, BATCH, GROUP = 5e-4, 64, 8


def trl_python() -> str:
    return os.environ.get("ATROPOS_TRL_PYTHON") or str(
        ROOT / ".cache" / "trl-venv" / "bin" / "python"
    )


@contextlib.contextmanager
def with_trl_trainer(python: str) -> Iterator[None]:
    """`atropos.demo.run` starting `python -m atropos.integrations.trl` as its trainer (with
    the API, server, out dir, steps, batch, lr and seed it gives `atropos train`)."""
    import atropos.demo.run as demo

    original, service = demo.service_commands, demo.Service

    def commands(cfg: Any, policy: str, ports: dict[str, int]) -> dict[str, list[str]]:
        argv = original(cfg, policy, ports)
        ours = argv["trainer"]
        value = {flag: ours[ours.index(flag) + 1] for flag in ("--api-url", "--server-url")}
        out = str((cfg.out / "trainer").resolve())
        argv["trainer"] = [
            "--model", policy, "--api-url", value["--api-url"],
            "--server-url", value["--server-url"], "--out-dir", out,
            "--steps", str(cfg.steps), "--batch-size", str(cfg.batch_size), "--max-len", "64",
            "--lr", str(cfg.lr), "--seed", str(cfg.seed),
        ]  # fmt: skip
        return argv

    class TrlService(service):  # type: ignore[misc,valid-type]
        @classmethod
        def atropos(cls, name: str, args: list[str], log_path: Path) -> Any:
            if name != "trainer":
                return service.atropos(name, args, log_path)
            return service(name, [python, "-m", "atropos.integrations.trl", *args], log_path)

    demo.service_commands, demo.Service = commands, TrlService
    try:
        yield
    finally:
        demo.service_commands, demo.Service = original, service


def demo_seed(seed: int, steps: int, out: Path, python: str) -> dict[str, Any]:
    """One seed of the demo's loop with TRL as the trainer: a row as `demo_seeds.py` makes."""
    from rich.console import Console

    import atropos.demo.run as demo
    from atropos.tiny.warmstart import policy_path

    cfg = demo.DemoConfig(out=out, seed=seed, steps=steps, batch_size=BATCH, lr=LR)
    console = Console(stderr=True)
    policy = str(policy_path().resolve())
    t0 = time.monotonic()
    before, _ = demo.held_out(policy, cfg)
    with with_trl_trainer(python):
        metrics = demo.run_loop(cfg, policy, console)
    after, _ = demo.held_out(str(out / "trainer" / "checkpoints" / f"step_{steps}"), cfg)
    on = [m["logprob_mismatch"] for m in metrics if m.get("logprob_mismatch") is not None]
    rows = [json.loads(x) for x in (out / "trainer" / "metrics.jsonl").read_text().splitlines()]
    train_s = _train_seconds(out / "logs" / "trainer.log")
    return {
        "seed": seed, "seconds": round(time.monotonic() - t0, 1), "steps": len(metrics),
        "held-out accuracy, warm start": before, "held-out accuracy, trained": after,
        "reward, first 10 steps": demo.mean([m["reward_mean"] for m in metrics[:10]]),
        "reward, last 10 steps": demo.mean([m["reward_mean"] for m in metrics[-10:]]),
        "logprob mismatch, mean (on-policy tokens)": demo.mean(on),
        "on-policy share of sequences": demo.mean([m["on_policy_fraction"] for m in metrics]),
        "steps/s": round(len(rows) / train_s, 3) if train_s else None,
        "trainer": "trl",
    }  # fmt: skip


def _train_seconds(log: Path) -> float | None:
    """Seconds from the trainer's first batch request to its last ack (its log's timestamps)."""
    from datetime import datetime

    stamps = []
    for line in log.read_text().splitlines():
        if ("GET " in line and "/batch?" in line) or "/batch/ack" in line:
            stamps.append(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f"))
    return (stamps[-1] - stamps[0]).total_seconds() if len(stamps) > 1 else None


def native(seed: int, steps: int, out: Path) -> dict[str, Any]:
    """TRL alone on the same task (run in the TRL venv: `--native-run`)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from atropos.environments.arithmetic import sample_items, score_answer
    from atropos.tiny.warmstart import policy_path

    torch.manual_seed(seed)
    items = sample_items("train", steps * BATCH // GROUP, seed=seed)
    data = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": i["question"]}] for i in items],
            "answer": [i["answer"] for i in items],
        }
    )

    def reward(completions: list[Any], answer: list[Any], **kw: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [score_answer({"answer": a}, t) for t, a in zip(texts, answer, strict=True)]

    config = GRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=BATCH, num_generations=GROUP,
        gradient_accumulation_steps=1, steps_per_generation=1, max_steps=steps,
        learning_rate=LR, lr_scheduler_type="constant", loss_type="bnpo", beta=0.0,
        temperature=1.0, max_completion_length=8, logging_steps=1, save_strategy="no",
        report_to="none", seed=seed, use_cpu=True, bf16=False, disable_tqdm=True,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(policy_path())
    model = AutoModelForCausalLM.from_pretrained(policy_path(), dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reward], args=config, train_dataset=data,
        processing_class=tokenizer,
    )  # fmt: skip
    t0 = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - t0
    final = out / "checkpoints" / f"step_{steps}"
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    logs = [r for r in trainer.state.log_history if "reward" in r]
    return {
        "seed": seed, "steps": steps, "train seconds": round(seconds, 1),
        "steps/s": round(steps / seconds, 3), "final": str(final),
        "reward, first 10 steps": sum(r["reward"] for r in logs[:10]) / max(len(logs[:10]), 1),
        "reward, last 10 steps": sum(r["reward"] for r in logs[-10:]) / max(len(logs[-10:]), 1),
    }  # fmt: skip


def native_seed(seed: int, steps: int, out: Path, python: str) -> dict[str, Any]:
    """`native` in the TRL venv, then held-out accuracy before and after (the demo's items)."""
    from atropos.demo.run import DemoConfig, held_out
    from atropos.tiny.warmstart import policy_path

    out.mkdir(parents=True, exist_ok=True)
    argv = [python, str(Path(__file__).resolve()), "--native-run", str(seed), str(steps), str(out)]
    subprocess.run(argv, check=True, cwd=ROOT)
    row = json.loads((out / "native.json").read_text())
    cfg = DemoConfig(out=out, seed=seed, steps=steps)
    row["held-out accuracy, warm start"], _ = held_out(str(policy_path()), cfg)
    row["held-out accuracy, trained"], _ = held_out(row.pop("final"), cfg)
    row["trainer"] = "trl-native"
    return row


def render(result: dict[str, Any]) -> str:
    lines = [
        "| trainer | seed | steps | warm start | trained | reward first 10 | reward last 10 "
        "| steps/s | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for part in ("demo", "native"):
        for r in result.get(part, []):
            lines.append(
                f"| {r['trainer']} | {r['seed']} | {r['steps']} "
                f"| {r['held-out accuracy, warm start']:.1%} "
                f"| {r['held-out accuracy, trained']:.1%} | {r['reward, first 10 steps']:.3f} "
                f"| {r['reward, last 10 steps']:.3f} | {r['steps/s']} "
                f"| {r.get('seconds', r.get('train seconds'))} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    if sys.argv[1:2] == ["--native-run"]:  # in the TRL venv, from native_seed
        seed, steps, out = int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
        (out / "native.json").write_text(json.dumps(native(seed, steps, out)))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--parts", nargs="+", choices=("demo", "native"), default=["demo", "native"])
    p.add_argument("--out", default=str(ROOT / "runs" / "trl-compare"))
    p.add_argument("--json", default=str(HERE / "results" / "trl_compare.json"))
    args = p.parse_args()
    python = trl_python()
    result: dict[str, Any] = {"steps": args.steps, "seeds": args.seeds}
    for part, run in (("demo", demo_seed), ("native", native_seed)):
        if part in args.parts:
            result[part] = [
                run(s, args.steps, Path(args.out) / part / str(s), python) for s in args.seeds
            ]
    sys.path.insert(0, str(HERE))
    from seeds import write_result  # a sibling script

    write_result(result, Path(args.json), render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
