"""`atropos demo`: the whole loop on one laptop, as four processes, then a report.

1. Held-out accuracy of the warm-start policy (greedy decoding, plain transformers).
2. Start, each as its own process with a log under the run directory: the trajectory API
   (SQLite store), the local inference server on the warm start (or, with `--server vllm`,
   vLLM itself on a copy of it with an untied head, see `vllm_policy`), the `arithmetic`
   environment in serve mode, and the reference trainer syncing weights to the server after
   every step.
3. Show progress from the trainer's metrics until it reaches `--steps`, then stop everything
   (SIGTERM, in reverse order of start) and check that each exited cleanly.
4. Held-out accuracy of the trained policy, and `report.html` with the reward curve, the
   trainer-vs-inference logprob mismatch and held-out samples before and after.
"""

from __future__ import annotations

import json
import secrets
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from atropos.demo.procs import Service, ServiceError, wait_until_up
from atropos.demo.report import write_report
from atropos.install import activate_command, atropos_command, checkout
from atropos.net import free_port

SERVED_NAME = "atropos-tiny"
TEACHER_NAME = "atropos-tiny-teacher"  # the teacher's server in `--distill`


@dataclass
class DemoConfig:
    """The demo's knobs; the defaults are the embedded run of `make demo`."""

    out: Path = Path("runs/demo")
    seed: int = 0
    steps: int = 100
    batch_size: int = 64  # sequences per step: 8 groups of 8
    group_size: int = 8
    lr: float = 5e-4
    eval_items: int = 500
    samples_shown: int = 12
    policy: str = ""  # default: the shipped warm start
    env: str = "arithmetic"  # a registered name or module:Class
    max_workers: int = 16
    startup_timeout: float = 120.0
    extra_trainer_flags: list[str] = field(default_factory=list)
    extra_server_flags: list[str] = field(default_factory=list)  # e.g. --transfer-backend ipc
    extra_env_flags: list[str] = field(default_factory=list)
    teacher: str = ""  # `--distill`'s teacher checkpoint (default: trained by the RL demo first)
    teacher_steps: int = 100  # RL steps of that teacher
    server: str = "local"  # the inference server: "local" (ours) or "vllm"
    vllm_python: str = ""  # a Python with vLLM (default: `atropos.engines`' search)


def service_commands(cfg: DemoConfig, policy: str, ports: dict[str, int]) -> dict[str, list[str]]:
    """The `atropos` argv of every process of the demo."""
    api = f"http://127.0.0.1:{ports['api']}"
    server = f"http://127.0.0.1:{ports['server']}/v1"
    return {
        "api": [
            "api", "serve", "--port", str(ports["api"]), "--store",
            f"sqlite:{cfg.out / 'api.db'}", "--max-staleness", "2",
        ],
        "server": _server_argv(cfg, policy, ports["server"]),
        "env": [
            "env", "serve", cfg.env, "--env.rollout_server_url", api,
            "--env.group_size", str(cfg.group_size), "--env.max_num_workers", str(cfg.max_workers),
            "--env.max_batches_offpolicy", "1", "--env.use_wandb", "false",
            # the demo stops the env once the trainer is done; stale groups may be dropped, so
            # the env must not stop itself at exactly the trainer's step count
            "--env.total_steps", str(cfg.steps * 100), "--env.steps_per_eval", "0",
            "--openai.base_url", server, "--openai.model_name", SERVED_NAME,
            "--openai.server_type", "vllm",
            # our server's key comes by the environment (`run_keys`): a flag would override it
            *(["--openai.api_key", "none"] if cfg.server == "vllm" else []),
            *cfg.extra_env_flags,
        ],
        "trainer": [
            "train", "--model", policy, "--api-url", api, "--server-url", server,
            "--out-dir", str(cfg.out / "trainer"), "--steps", str(cfg.steps),
            "--batch-size", str(cfg.batch_size), "--micro-batch-size", str(cfg.batch_size),
            "--seq-len", "64", "--lr", str(cfg.lr), "--sync", "reload",
            "--checkpoint-every", "50", "--seed", str(cfg.seed), *cfg.extra_trainer_flags,
        ],
    }  # fmt: skip


def _server_argv(cfg: DemoConfig, policy: str, port: int) -> list[str]:
    """Our CPU server's `atropos` arguments, or with `--server vllm` vLLM's whole command line
    (float32, as the trainer computes; eager; one OpenMP thread so the trainer keeps a core)."""
    if cfg.server == "vllm":
        from atropos.engines import find_vllm_python, vllm_argv

        extra = ["--dtype", "float32", "--enforce-eager", "--seed", str(cfg.seed)]
        # the model's own 128 positions: past them vLLM 0.32 on a CPU answers NaN with
        # VLLM_ALLOW_LONG_MAX_MODEL_LEN (the demo's sequences are under 64 tokens)
        extra += ["--max-model-len", "128", "--max-num-seqs", "64"]
        python = find_vllm_python(cfg.vllm_python)
        extra += cfg.extra_server_flags
        return vllm_argv(python, policy, port=port, served_model_name=SERVED_NAME, extra=extra)
    return [
        "local", "serve", policy, "--port", str(port),
        "--served-model-name", SERVED_NAME, "--seed", str(cfg.seed),
        # the trainer's reloads and adapters are written under the run's directory
        "--allowed-paths", str(cfg.out.resolve()), *cfg.extra_server_flags,
    ]  # fmt: skip


def run_keys(cfg: DemoConfig) -> dict[str, dict[str, str]]:
    """Each process's environment for a key made for this run: our servers require it on the
    routes that change their weights, the trainer sends it when it syncs, the environment when
    it generates. Never on a command line (`ps` shows those). None for vLLM's server."""
    if cfg.server != "local":
        return {}
    key = secrets.token_urlsafe(32)
    return {
        "server": {"ATROPOS_LOCAL_API_KEY": key},
        "teacher": {"ATROPOS_LOCAL_API_KEY": key},
        "trainer": {"ATROPOS_TRAIN_SERVER_API_KEY": key},
        "env": {"ATROPOS_OPENAI__API_KEY": key, "ATROPOS_TEACHER__API_KEY": key},
    }


def _server_env(cfg: DemoConfig) -> dict[str, str]:
    """The environment of vLLM (`--server vllm`): dev-mode routes for the trainer's reload,
    offline, one thread, a small KV cache."""
    if cfg.server != "vllm":
        return {}
    from atropos.engines import VLLM_ENV

    return {
        **VLLM_ENV, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    }  # fmt: skip


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return rows


def run_loop(
    cfg: DemoConfig, policy: str, console: Console, teacher: str | None = None
) -> list[dict[str, Any]]:
    """Steps 2 and 3: the four processes until the trainer is done; its metrics rows. With a
    `teacher` checkpoint, a fifth: a local server holding it, which the environment asks for
    the teacher's logprobs while the trainer distills (`atropos.demo.distill`).

    Long because it is the demo's whole supervision: start, wait, watch, stop in order."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.server == "vllm":
        policy = vllm_policy(policy, cfg)
    ports = {"api": free_port(), "server": free_port()}
    argv = service_commands(cfg, policy, ports)
    if teacher is not None:
        ports["teacher"] = free_port()
        argv["teacher"] = _teacher_server(cfg, teacher, ports["teacher"])
        env_flags, trainer_flags = teacher_flags(f"http://127.0.0.1:{ports['teacher']}/v1")
        argv["env"] += env_flags
        argv["trainer"] += trainer_flags
    servers: list[str] = [name for name in ("api", "server", "teacher") if name in argv]
    logs = cfg.out / "logs"
    services = {
        name: Service.atropos(name, args, logs / f"{name}.log") for name, args in argv.items()
    }
    if cfg.server == "vllm":  # not one of ours: its own interpreter and environment
        services["server"] = Service("server", argv["server"], logs / "server.log")
    environ = run_keys(cfg)
    environ["server"] = environ.get("server", {}) | _server_env(cfg)
    (cfg.out / "commands.json").write_text(json.dumps(argv, indent=2))
    metrics_path = cfg.out / "trainer" / "metrics.jsonl"
    started: list[Service] = []
    try:
        for name in servers:
            started.append(services[name].start(environ.get(name)))
        for name in servers:
            url = f"http://127.0.0.1:{ports[name]}/health"
            slow = name == "server" and cfg.server == "vllm"  # vLLM: ~40 s, more when loaded
            wait_until_up(url, max(cfg.startup_timeout, 300.0) if slow else cfg.startup_timeout,
                          services[name])  # fmt: skip
        for name in ("trainer", "env"):
            started.append(services[name].start(environ.get(name)))
        console.print(f"[dim]logs: {logs}/{{{','.join(argv)}}}.log[/dim]")
        with Progress(
            TextColumn("training"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
        ) as bar:  # fmt: skip
            task = bar.add_task("train", total=cfg.steps, info="starting")
            trainer = services["trainer"]
            while trainer.alive():
                for svc in [*(services[n] for n in servers), services["env"]]:
                    if not svc.alive() and (svc.name != "env" or svc.returncode != 0):
                        raise ServiceError(f"{svc.name} exited with {svc.returncode}{svc.tail()}")
                rows = read_metrics(metrics_path)
                if not rows:
                    bar.update(task, info=_queue_info(ports["api"]))
                else:
                    recent = rows[-10:]
                    reward = sum(r["reward_mean"] for r in recent) / len(recent)
                    bar.update(task, completed=rows[-1]["step"], info=f"reward {reward:.2f}")
                time.sleep(0.5)
            if trainer.returncode != 0:
                raise ServiceError(f"trainer exited with {trainer.returncode}{trainer.tail()}")
            bar.update(task, completed=cfg.steps)
    finally:
        codes = {svc.name: svc.stop() for svc in reversed(started)}
        killed = sorted(svc.name for svc in started if svc.killed)
        (cfg.out / "exit_codes.json").write_text(json.dumps({"codes": codes, "killed": killed}))
    if killed:
        raise ServiceError(f"did not stop within the grace period (killed): {', '.join(killed)}")
    return read_metrics(metrics_path)


def teacher_flags(teacher_url: str, top_k: int = 8) -> tuple[list[str], list[str]]:
    """(env flags, trainer flags) that turn the demo's RL loop into distillation toward the
    teacher served at `teacher_url`: its top-k logprobs on every group (`--teacher.*`), groups
    with all-equal rewards kept (they teach as much), and `--loss opd` with no reward."""
    env = [
        "--teacher.base_url", teacher_url, "--teacher.model_name", TEACHER_NAME,
        "--teacher.server_type", "vllm", "--teacher.tokenizer_name", "tiny",
        "--teacher.top_k", str(top_k), "--env.ensure_scores_are_not_same", "false",
    ]  # fmt: skip
    return env, ["--loss", "opd", "--opd-mode", "reverse", "--opd-reward-coef", "0"]


def _teacher_server(cfg: DemoConfig, teacher: str, port: int) -> list[str]:
    return [
        "local", "serve", teacher, "--port", str(port),
        "--served-model-name", TEACHER_NAME, "--seed", str(cfg.seed),
    ]  # fmt: skip


def vllm_policy(policy: str, cfg: DemoConfig) -> str:
    """The policy vLLM serves and the trainer trains: `policy` with a head of its own (vLLM 0.32
    on a CPU does not reload a tied head; `atropos.local.weights.untied_copy`)."""
    from atropos.local.weights import untied_copy

    return str(untied_copy(policy, cfg.out / "policy-untied").resolve())


def held_out(model: str, cfg: DemoConfig) -> tuple[float, list[dict[str, Any]]]:
    """Greedy held-out accuracy and the first `samples_shown` (prompt, completion) rows."""
    from atropos.tiny.warmstart import evaluate_samples

    # the same held-out items whatever the seed, so runs differ only by their training
    rows = evaluate_samples(model, cfg.eval_items, seed=0)
    accuracy = sum(r["correct"] for r in rows) / len(rows)
    return accuracy, rows


def run(cfg: DemoConfig | None = None, console: Console | None = None) -> dict[str, Any]:
    """The demo; returns its summary (also in `{out}/summary.json`)."""
    from atropos.tiny.warmstart import policy_path

    cfg = cfg or DemoConfig()
    console = console or Console(stderr=True)
    catch_signals()
    cfg.out.mkdir(parents=True, exist_ok=True)
    policy = str(Path(cfg.policy or policy_path()).resolve())
    t0 = time.monotonic()
    console.print(f"[bold]Atropos demo[/bold]: RL on held-out-checked arithmetic -> {cfg.out}")
    before, before_rows = held_out(policy, cfg)
    console.print(f"warm start: held-out accuracy {before:.1%} ({len(before_rows)} items)")
    metrics = run_loop(cfg, policy, console)
    final = cfg.out / "trainer" / "checkpoints" / f"step_{cfg.steps}"
    after, after_rows = held_out(str(final), cfg)
    console.print(f"trained:    held-out accuracy {after:.1%} ({len(after_rows)} items)")
    on_policy = [m["logprob_mismatch"] for m in metrics if m.get("logprob_mismatch") is not None]
    summary = {
        "held-out accuracy, warm start": before,
        "held-out accuracy, trained": after,
        "held-out items": len(after_rows),
        "steps": len(metrics),
        "sequences per step": cfg.batch_size,
        "reward, first 10 steps": mean([m["reward_mean"] for m in metrics[:10]]),
        "reward, last 10 steps": mean([m["reward_mean"] for m in metrics[-10:]]),
        "logprob mismatch, mean (on-policy tokens)": mean(on_policy),
        "logprob mismatch, max step": max(on_policy) if on_policy else None,
        "on-policy share of sequences": mean([m["on_policy_fraction"] for m in metrics]),
        "seed": cfg.seed,
        "inference server": cfg.server,
        "wall time (s)": round(time.monotonic() - t0, 1),
    }
    samples = sample_rows(before_rows, after_rows, cfg.samples_shown)
    report = write_report(cfg.out / "report.html", summary, metrics, samples)
    (cfg.out / "summary.json").write_text(
        json.dumps({"summary": summary, "config": asdict(cfg)}, indent=2, default=str)
    )
    console.print(f"report: {report}")
    for line in next_lines():
        console.print(line, markup=False, highlight=False)
    return summary


def next_lines() -> list[str]:
    """What to run next, in this install's commands (`atropos.install`): how to use its
    virtualenv when it is not activated, every built-in environment's extras, the environments."""
    activate = activate_command()
    atropos = "atropos" if activate else atropos_command()
    lines = ["next:"]
    if activate:
        lines.append(
            f"  {activate}   # then `atropos` and `python` are this install's"
            f" (or, without it: {atropos_command()} ...)"
        )
    root = checkout()
    if root is not None and (root / "Makefile").is_file():
        lines.append("  make extras   # the packages of every built-in environment (README)")
    lines.append(f"  {atropos} env list   # the environments; docs/environments.md: your own")
    return lines


def sample_rows(
    before: list[dict[str, Any]], after: list[dict[str, Any]], n: int
) -> list[dict[str, Any]]:
    """The first `n` held-out items with their answers before and after training."""
    return [
        {
            "prompt": b["question"], "answer": b["answer"],
            "before": b["completion"], "before_correct": b["correct"],
            "after": a["completion"], "after_correct": a["correct"],
        }
        for b, a in zip(before[:n], after[:n], strict=True)
    ]  # fmt: skip


def _queue_info(port: int) -> str:
    try:
        status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return "waiting for the API"
    return f"waiting for the first batch: {status.get('queue_size', '?')} groups queued"


def catch_signals() -> None:
    """On the main thread, SIGTERM unwinds the demo (so its `finally` stops the children)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through run_loop's `finally`, which stops everything


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
