"""Drive a trajectory API with atroposlib 0.4.0's own client code; write what it saw as JSON.

Runs in the *upstream* virtualenv (`scripts/upstream_venv.py full`), never in ours: it imports
the unmodified `atroposlib.envs.base.BaseEnv` and calls its real methods (`register_env`,
`get_server_info`, `get_status`, `handle_send_to_api`), and it plays the example trainer with
`requests`, making exactly that trainer's calls (poll `GET /info`, `POST /register` with 8
fields, `GET /batch` until null). It asserts nothing: every observation goes into the JSON file,
and `test_upstream_clients.py` judges it.

Usage: python upstream_driver.py BASE_URL OUT_JSON WORK_DIR
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import requests
from tenacity import RetryError, stop_after_attempt

BATCH_SIZE = 8  # sequences per trainer step (micro-batch 2 x grad-accum 4)
MAX_TOKEN_LEN = 512
NUM_STEPS = 20
CHECKPOINT_DIR = "/tmp/compat-checkpoints"
VOCAB = 1000

# ----- what the upstream client code did, recorded without changing it ---------------------

SENT: list[dict[str, Any]] = []  # every body an env POSTed with data=..., as it went on the wire
LOGS: list[dict[str, Any]] = []  # log records of atroposlib and the root logger


class _Capture(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LOGS.append({"level": record.levelname, "logger": record.name, "msg": record.getMessage()})


_original_post = aiohttp.ClientSession.post


def _spy_post(self: aiohttp.ClientSession, url: Any, **kwargs: Any) -> Any:
    data = kwargs.get("data")
    if isinstance(data, bytes):
        headers = kwargs.get("headers") or {}
        encoding = headers.get("Content-Encoding")
        raw = gzip.decompress(data) if encoding == "gzip" else data
        SENT.append(
            {
                "url": str(url),
                "content_encoding": encoding,
                "wire_bytes": len(data),
                "json_bytes": len(raw),
                "payload": json.loads(raw),
            }
        )
    return _original_post(self, url, **kwargs)


aiohttp.ClientSession.post = _spy_post  # type: ignore[method-assign]

# Only now import upstream's modules (they read aiohttp.ClientSession at call time).
from atroposlib.api.server import ScoredData, _scored_data_to_dict  # noqa: E402
from atroposlib.envs.base import BaseEnv, BaseEnvConfig  # noqa: E402
from atroposlib.envs.server_handling.server_manager import APIServerConfig  # noqa: E402


def upstream_echo(payload: dict[str, Any]) -> dict[str, Any]:
    """What upstream's API stores for a posted group, hence what its `/batch` returns."""
    return json.loads(json.dumps(_scored_data_to_dict(ScoredData(**payload))))


def make_tokenizer(work: Path) -> str:
    """A tiny local tokenizer (BaseEnv loads one in __init__; no network here)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    vocab["[UNK]"] = VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = work / "tokenizer"
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(str(path))
    return str(path)


class CompatEnv(BaseEnv):
    """The smallest concrete BaseEnv: no rollouts, only upstream's API plumbing."""

    name = "compat"

    async def setup(self) -> None:
        return None

    async def get_next_item(self) -> None:
        return None

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None


def new_env(url: str, tokenizer: str, name: str, group_size: int, ctx: int, weight: float) -> Any:
    config = BaseEnvConfig(
        group_size=group_size,
        max_token_length=ctx,
        inference_weight=weight,
        tokenizer_name=tokenizer,
        use_wandb=False,
        rollout_server_url=url,
        total_steps=-1,  # take num_steps from the API, as `register_env` allows
        wandb_name=name,
        ensure_scores_are_not_same=True,
        include_messages=False,
    )
    # A fake inference server that is never contacted (testing=True swaps in a harness).
    servers = [APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="unused", api_key="x")]
    return CompatEnv(config, servers, slurm=False, testing=True)


def env_state(env: Any) -> dict[str, Any]:
    return {
        "env_id": env.env_id,
        "wandb_name": env.wandb_prepend,
        "curr_step": env.curr_step,
        "checkpoint_dir": env.checkpoint_dir,
        "checkpoint_interval": env.checkpoint_interval,
        "total_steps": env.config.total_steps,
        "batch_size": env.config.batch_size,
        "max_token_len": env.max_token_len,
        "group_size": env.config.group_size,
        "max_token_length": env.config.max_token_length,
        "weight": env.config.inference_weight,
    }


def group(tag: str, size: int, length: int, *, extras: bool = False) -> dict[str, Any]:
    """A distinct, deterministic group. `length` ~ 100+ makes a 4-group's JSON exceed 1 KB."""
    seed = sum(ord(c) * 31**i for i, c in enumerate(tag)) % 997
    tokens = [[(seed + 7 * j + 131 * i) % VOCAB for j in range(length)] for i in range(size)]
    prompt = length // 4
    masks = [[-100] * prompt + row[prompt:] for row in tokens]
    g: dict[str, Any] = {
        "tokens": tokens,
        "masks": masks,
        "scores": [float(i) - size / 2 for i in range(size)],  # all different
        "group_overrides": {"compat_tag": tag},
    }
    if extras:
        g["advantages"] = [[0.25] * length for _ in range(size)]
        g["inference_logprobs"] = [[1.0] * prompt + [-0.5] * (length - prompt) for _ in tokens]
        g["overrides"] = [{"set_advantage_to_zero": i == 0} for i in range(size)]
        g["generation_params"] = {"temperature": 0.7}
        g["messages"] = [
            [{"role": "user", "content": f"q {tag}"}, {"role": "assistant", "content": f"a{i}"}]
            for i in range(size)
        ]
    return g


# ----- the example trainer, with requests --------------------------------------------------


class Trainer:
    def __init__(self, url: str) -> None:
        self.url = url
        self.responses: list[dict[str, Any]] = []  # every /batch response, raw

    def wait_for_api(self, limit: float = 30.0) -> dict[str, Any]:
        """Poll GET /info until it answers 200 (the trainer does this before registering)."""
        deadline = time.monotonic() + limit
        while True:
            try:
                r = requests.get(f"{self.url}/info", timeout=10)
                if r.status_code == 200:
                    return {"status_code": r.status_code, "json": r.json()}
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("GET /info never answered 200")
            time.sleep(0.2)

    def register(self) -> dict[str, Any]:
        r = requests.post(
            f"{self.url}/register",
            json={
                "wandb_group": "",
                "wandb_project": "compat-project",
                "batch_size": BATCH_SIZE,
                "max_token_len": MAX_TOKEN_LEN,
                "starting_step": 0,
                "checkpoint_dir": CHECKPOINT_DIR,
                "save_checkpoint_interval": 10,
                "num_steps": NUM_STEPS,
            },
            timeout=10,
        )
        return {"status_code": r.status_code, "json": r.json()}

    def get_batch(self) -> dict[str, Any]:
        r = requests.get(f"{self.url}/batch", timeout=10)
        doc = {"status_code": r.status_code, "json": r.json()}
        self.responses.append(doc)
        return doc

    def get_data(self, max_idle_polls: int = 3) -> list[list[dict[str, Any]]]:
        """`get_data`: drain every ready batch; on null with nothing yet, sleep 1 s and retry."""
        batches: list[list[dict[str, Any]]] = []
        idle = 0
        while True:
            doc = self.get_batch()["json"]
            if doc.get("status") == "error":
                raise RuntimeError(f"trainer not registered: {doc}")
            if doc.get("batch") is not None:
                batches.append(doc["batch"])
                continue
            if batches or idle >= max_idle_polls:
                return batches
            idle += 1
            time.sleep(1)

    def get(self, path: str) -> dict[str, Any]:
        r = requests.get(f"{self.url}{path}", timeout=10)
        try:
            body: Any = r.json()
        except ValueError:
            body = r.text
        return {"status_code": r.status_code, "json": body}


# ----- the scenario ----------------------------------------------------------------------------


async def status_of(env: Any) -> dict[str, Any]:
    await env.get_status()  # GET /status-env with a JSON body, through aiohttp, as upstream
    return dict(env.status_dict)


async def scenario(url: str, work: Path) -> dict[str, Any]:
    obs: dict[str, Any] = {}
    tokenizer = make_tokenizer(work)
    trainer = Trainer(url)

    # Trainer start-up.
    obs["info_before_register"] = trainer.wait_for_api()
    obs["batch_before_register"] = trainer.get("/batch")
    obs["register"] = trainer.register()
    obs["info"] = trainer.get("/info")
    obs["wandb_info"] = trainer.get("/wandb_info")

    # An env registers before the trainer's first /batch: upstream's register_env() loops on
    # "wait for trainer to start" until the trainer polls /batch.
    env_a = new_env(url, tokenizer, "compat-a", group_size=4, ctx=1024, weight=1.0)
    waiting = asyncio.create_task(env_a.register_env())
    await asyncio.sleep(2.5)
    obs["register_env_was_waiting"] = not waiting.done()
    obs["first_batch"] = trainer.get_batch()  # marks the trainer started; nothing queued
    await asyncio.wait_for(waiting, 30)
    env_b = new_env(url, tokenizer, "compat-b", group_size=2, ctx=512, weight=1.0)
    await env_b.register_env()
    env_a2 = new_env(url, tokenizer, "compat-a", group_size=4, ctx=1024, weight=1.0)
    await env_a2.register_env()
    for env in (env_a, env_b, env_a2):
        await env.get_server_info()  # GET /info: batch_size and max_token_len into the env
    obs["envs"] = {"a": env_state(env_a), "b": env_state(env_b), "a2": env_state(env_a2)}
    obs["status_env_empty"] = {"a": await status_of(env_a), "b": await status_of(env_b)}

    # Data, through handle_send_to_api: single groups go to /scored_data, lists to
    # /scored_data_list; bodies of 1 KB or more are gzipped by the client.
    sends: list[dict[str, Any]] = []

    async def send(env: Any, data: Any, label: str) -> None:
        before = len(SENT)
        await env.handle_send_to_api(data)
        sends.append({"label": label, "posts": list(range(before, len(SENT)))})

    await send(env_a, group("A0", 4, 120, extras=True), "A0 single, large")
    await send(env_a, [group(f"A{i}", 4, 120) for i in (1, 2, 3)], "A1-A3 list, large")
    await send(env_a, group("A4", 4, 6), "A4 single, small")
    await send(env_b, [group("B0", 2, 150), group("B1", 2, 150)], "B0-B1 list")
    bad_size = group("X-size", 3, 120)  # group_size is 4: the client drops it
    same = group("X-same", 4, 120)
    same["scores"] = [0.5] * 4  # ensure_scores_are_not_same: the client drops it
    await send(env_a, [bad_size, group("A5", 4, 120), same, None], "A5 among invalid")
    obs["sends"] = sends
    obs["status_after_sends"] = trainer.get("/status")
    obs["status_env_after_sends"] = {
        "a": await status_of(env_a),
        "b": await status_of(env_b),
        "a2": await status_of(env_a2),
    }
    obs["latest_example"] = trainer.get("/latest_example")

    # The trainer drains every ready batch.
    obs["drain1"] = trainer.get_data()
    obs["status_after_drain1"] = trainer.get("/status")
    obs["status_env_after_drain1"] = {"a": await status_of(env_a)}

    # One more group from the second compat-a instance completes the leftover A5 to a batch.
    await send(env_a2, group("C0", 4, 120), "C0 single from a2")
    obs["status_before_drain2"] = trainer.get("/status")
    obs["drain2"] = trainer.get_data()
    obs["status_after_drain2"] = trainer.get("/status")
    obs["status_env_after_drain2"] = {"a": await status_of(env_a), "b": await status_of(env_b)}

    obs["logs_before_reset"] = len(LOGS)

    # Reset + trainer re-registration while an env keeps running with its old env_id (an API
    # restart with in-memory state looks the same to the env). BaseEnv never re-registers.
    obs["reset"] = trainer.get("/reset_data")
    obs["register_after_reset"] = trainer.register()
    obs["first_batch_after_reset"] = trainer.get_batch()
    await send(env_a, [group("R0", 4, 120), group("R1", 4, 120)], "R0-R1 after reset")
    obs["status_after_reset_send"] = trainer.get("/status")
    obs["drain_after_reset"] = trainer.get_data(max_idle_polls=1)
    obs["logs_before_probes"] = len(LOGS)
    # What the API said to that env: its group again, by hand, and one get_status() attempt.
    stale = next(p["payload"] for p in SENT if "R0" in json.dumps(p["payload"]))[0]
    r = requests.post(f"{url}/scored_data", json=stale, timeout=10)
    obs["stale_env_scored_data"] = {"status_code": r.status_code, "body": r.text[:500]}
    try:
        await type(env_a).get_status.retry_with(stop=stop_after_attempt(1))(env_a)
        obs["stale_env_status_env"] = {"ok": True, "status": dict(env_a.status_dict)}
    except Exception as err:
        cause = err.last_attempt.exception() if isinstance(err, RetryError) else err
        obs["stale_env_status_env"] = {
            "ok": False,
            "status_code": getattr(cause, "status", None),
            "error": f"{type(cause).__name__}: {getattr(cause, 'message', cause)}",
        }

    obs["batch_responses"] = trainer.responses
    obs["sent"] = SENT
    obs["upstream_echo"] = [
        upstream_echo(g) if isinstance(g, dict) else None
        for post in SENT
        for g in (post["payload"] if isinstance(post["payload"], list) else [post["payload"]])
    ]
    return obs


def main() -> int:
    url, out, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.addHandler(_Capture(level=logging.DEBUG))
    os.environ.setdefault("WANDB_MODE", "disabled")
    started = time.monotonic()
    try:
        obs = asyncio.run(scenario(url, work))
        obs["error"] = None
    except Exception as err:  # report it in the JSON rather than only on stderr
        import traceback

        obs = {"error": "".join(traceback.format_exception(err))}
    obs["seconds"] = time.monotonic() - started
    obs["logs"] = LOGS
    out.write_text(json.dumps(obs, indent=1))
    return 0 if obs["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main())
