"""atroposlib 0.4.0's real client code against our trajectory API, endpoint by endpoint.

`upstream_driver.py` runs in the full upstream venv: a minimal subclass of upstream's
`BaseEnv` calls its real `register_env()`, `get_server_info()`, `get_status()` (GET /status-env
with a JSON body, aiohttp) and `handle_send_to_api()` (singles -> /scored_data, lists ->
/scored_data_list, gzip over 1 KB), and the example trainer's calls are replayed with `requests`
(poll GET /info, POST /register with 8 fields, GET /batch until null). The driver only records;
the tests below judge.

Each scenario runs against our API with both stores and, as a control that keeps these
expectations honest, against upstream's own `run-api`. Where upstream differs on purpose
(it serves the batches of one drain newest first) the test says so.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import COMPAT_DIR, free_port, run_our_server, serve, upstream_env

pytestmark = [pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(900)]

BATCH_SIZE = 8
MAX_TOKEN_LEN = 512
NUM_STEPS = 20
CHECKPOINT_DIR = "/tmp/compat-checkpoints"
UPSTREAM = "upstream-0.4.0"
KINDS = ["ours-memory", "ours-sqlite", UPSTREAM]
# The 14 keys upstream's API returns for every group (`_scored_data_to_dict`).
GROUP_KEYS = {
    "tokens",
    "masks",
    "scores",
    "advantages",
    "ref_logprobs",
    "messages",
    "generation_params",
    "inference_logprobs",
    "overrides",
    "group_overrides",
    "images",
    "env_id",
    "distill_token_ids",
    "distill_logprobs",
}
STATUS_ENV_KEYS = {
    "current_step",
    "queue_size",
    "unallocated_fraction",
    "self_queue_size",
    "max_group_size",
    "env_weight",
}
# The envs the driver registers: env_id -> (max_token_length, weight, group_size, min alloc).
ENVS = {0: (1024, 1.0, 4, None), 1: (512, 1.0, 2, None), 2: (1024, 1.0, 4, None)}
SIZES = {"A": 4, "B": 2, "C": 4, "R": 4}  # group size by tag letter
ENV_OF = {"A": 0, "B": 1, "C": 2, "R": 0}
# Each POST handle_send_to_api made: path, Content-Encoding, groups by tag.
EXPECTED_POSTS = [
    ("/scored_data", "gzip", ["A0"]),
    ("/scored_data_list", "gzip", ["A1", "A2", "A3"]),
    ("/scored_data", None, ["A4"]),  # under 1 KB: sent plain
    ("/scored_data_list", "gzip", ["B0", "B1"]),
    ("/scored_data_list", "gzip", ["A5"]),  # the client dropped a wrong-size and a flat group
    ("/scored_data", "gzip", ["C0"]),
    ("/scored_data_list", "gzip", ["R0", "R1"]),
]


@dataclass
class Run:
    kind: str
    obs: dict[str, Any]
    server_log: str

    @property
    def ours(self) -> bool:
        return self.kind != UPSTREAM


@pytest.fixture(scope="module", params=KINDS)
def run(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    upstream_python: Callable[[str], Path],
) -> Iterator[Run]:
    """One driver run against one server; the server is stopped before the tests judge it."""
    kind: str = request.param
    full = upstream_python("full")
    work = tmp_path_factory.mktemp(kind)
    port = free_port()
    if kind == UPSTREAM:
        light = upstream_python("light")
        cmd = [str(light), "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1"]
        server_cm = serve(
            [*cmd, "--port", str(port)], port, work / "upstream.log", "/info", env=upstream_env()
        )
    else:
        store = "memory" if kind == "ours-memory" else f"sqlite:{work / 'api.db'}"
        server_cm = run_our_server(work, port=port, store=store)
    out = work / "observations.json"
    with server_cm as server:
        done = subprocess.run(
            [str(full), str(COMPAT_DIR / "upstream_driver.py"), server.url, str(out), str(work)],
            env=upstream_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        server_log = server.log_text()
    obs = json.loads(out.read_text()) if out.exists() else {"error": "no observations written"}
    if obs["error"] is not None:
        pytest.fail(
            f"driver failed against {kind} (exit {done.returncode}):\n{obs['error']}\n"
            f"{done.stdout}\n{done.stderr}\nserver log:\n{server_log}"
        )
    yield Run(kind, obs, server_log)


def tag(group: dict[str, Any]) -> str:
    return str(group["group_overrides"]["compat_tag"])


def tags(batches: list[list[dict[str, Any]]]) -> list[list[str]]:
    return [[tag(g) for g in batch] for batch in batches]


def expected_status_env(queue: list[tuple[int, int]], me: int, step: int) -> dict[str, Any]:
    """upstream's `/status-env` answer for `queue` = [(env_id, size)]."""
    ctx, weight, group_size, _ = ENVS[me]
    denom = sum(c * max(0.0, w) for c, w, _, _ in ENVS.values())
    allocated = sum(a for *_, a in ENVS.values() if a is not None)
    big = max([1, *(size for _, size in queue)])
    mine = [size for env, size in queue if env == me]
    own_group = max([group_size, *mine])
    own = sum(mine)
    available = 0
    if big > 1:
        others: dict[int, int] = {}
        for env, size in queue:
            if env != me:
                others[env] = others.get(env, 0) + size
        for env, seqs in others.items():
            alloc = ENVS[env][3]
            reserved = int(BATCH_SIZE * alloc) if alloc is not None else 0
            available += max(0, math.ceil(seqs / big) * big - reserved)
    return {
        "current_step": step,
        "queue_size": (own + available) // own_group,
        "unallocated_fraction": 1.0 - min(1.0, allocated),
        "self_queue_size": own // own_group,
        "max_group_size": big,
        "env_weight": pytest.approx(max(0.01, ctx * weight / denom)),
    }


def posted_groups(obs: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for post in obs["sent"] for g in _as_list(post["payload"])]


def _as_list(payload: Any) -> list[Any]:
    return payload if isinstance(payload, list) else [payload]


# ----- trainer side: /info, /register, /wandb_info --------------------------------------------


def test_trainer_startup_calls(run: Run) -> None:
    """GET /info before /register answers 200 with -1s; POST /register returns an int uuid."""
    o = run.obs
    assert o["info_before_register"] == {
        "status_code": 200,
        "json": {"batch_size": -1, "max_token_len": -1},
    }
    assert o["batch_before_register"] == {
        "status_code": 200,
        "json": {
            "status": "error",
            "message": "Trainer not registered. Call /register first.",
            "batch": [],
        },
    }
    assert o["register"]["status_code"] == 200
    assert set(o["register"]["json"]) == {"uuid"}
    assert isinstance(o["register"]["json"]["uuid"], int)
    assert o["info"] == {
        "status_code": 200,
        "json": {"batch_size": BATCH_SIZE, "max_token_len": MAX_TOKEN_LEN},
    }
    assert o["wandb_info"] == {
        "status_code": 200,
        "json": {"group": "", "project": "compat-project"},
    }


# ----- env side: register_env, get_server_info ------------------------------------------------


def test_register_env_waits_for_trainer_then_gets_id_and_name(run: Run) -> None:
    o = run.obs
    # BaseEnv.register_env() looped on "wait for trainer to start" until the first /batch.
    assert o["register_env_was_waiting"] is True
    waits = [m for m in o["logs"] if "wait for trainer to start" in m["msg"]]
    assert waits, "register_env() never saw 'wait for trainer to start'"
    assert o["first_batch"] == {"status_code": 200, "json": {"batch": None}}
    expected = {"a": (0, "compat-a_0"), "b": (1, "compat-b_0"), "a2": (2, "compat-a_1")}
    for key, (env_id, name) in expected.items():
        env = o["envs"][key]
        assert (env["env_id"], env["wandb_name"]) == (env_id, name), env
        assert env["curr_step"] == 0  # starting_step
        assert env["checkpoint_dir"] == CHECKPOINT_DIR
        assert env["checkpoint_interval"] == 10
        assert env["total_steps"] == NUM_STEPS  # config said -1: taken from the API
        # get_server_info(): GET /info copied into the env
        assert env["batch_size"] == BATCH_SIZE
        assert env["max_token_len"] == MAX_TOKEN_LEN


# ----- env side: handle_send_to_api -> /scored_data, /scored_data_list ------------------------


def test_handle_send_to_api_posts_and_responses(run: Run) -> None:
    o = run.obs
    posts = [
        (
            "/" + p["url"].rsplit("/", 1)[1],
            p["content_encoding"],
            [tag(g) for g in _as_list(p["payload"])],
        )
        for p in o["sent"]
    ]
    assert posts == EXPECTED_POSTS
    for p in o["sent"]:
        assert (p["json_bytes"] >= 1024) == (p["content_encoding"] == "gzip")
        for g in _as_list(p["payload"]):
            assert g["env_id"] == ENV_OF[tag(g)[0]]  # stamped by the client
            assert len(g["tokens"]) == SIZES[tag(g)[0]]
    # The client logs each response body (debug); before the reset they all say "received".
    before_reset = o["logs"][: o["logs_before_reset"]]
    bodies = [
        json.loads(m["msg"])
        for m in before_reset
        if m["logger"] == "atroposlib.envs.base" and m["msg"].startswith("{")
    ]
    assert bodies == [
        {"status": "received"},
        {"status": "received", "groups_processed": 3},
        {"status": "received"},
        {"status": "received", "groups_processed": 2},
        {"status": "received", "groups_processed": 1},
        {"status": "received"},
    ]
    errors = [m for m in before_reset if m["level"] in ("ERROR", "CRITICAL")]
    assert not errors, errors
    # The two invalid groups were dropped by the client itself, with its warnings.
    warnings = " ".join(m["msg"] for m in before_reset if m["level"] == "WARNING")
    assert "token count mismatch (expected 4)" in warnings
    assert "Scores are the same in a group" in warnings


# ----- /status and /status-env (BaseEnv.get_status) -------------------------------------------


def test_status_counts_queued_groups_and_steps(run: Run) -> None:
    o = run.obs

    def status(key: str) -> tuple[int, int]:
        doc = o[key]
        assert doc["status_code"] == 200 and set(doc["json"]) == {"current_step", "queue_size"}
        return doc["json"]["current_step"], doc["json"]["queue_size"]

    assert status("status_after_sends") == (0, 8)  # 8 groups queued, none served
    assert status("status_after_drain1") == (3, 1)  # 3 batches out; A5 left
    assert status("status_before_drain2") == (3, 2)  # + C0
    assert status("status_after_drain2") == (4, 0)


def test_get_status_uses_status_env_with_json_body(run: Run) -> None:
    o = run.obs
    queued = [(0, 4)] * 6 + [(1, 2)] * 2  # A0..A5 from env 0, B0 B1 from env 1
    checks = [
        ("status_env_empty", [], 0),
        ("status_env_after_sends", queued, 0),
        ("status_env_after_drain1", [(0, 4)], 3),
        ("status_env_after_drain2", [], 4),
    ]
    env_ids = {"a": 0, "b": 1, "a2": 2}
    for key, queue, step in checks:
        for name, got in o[key].items():
            assert set(got) == STATUS_ENV_KEYS, (key, name, got)
            want = expected_status_env(queue, env_ids[name], step)
            assert got == want, (key, name)


# ----- trainer side: GET /batch --------------------------------------------------------------


def test_trainer_drains_exact_batches_in_fifo_order(run: Run) -> None:
    o = run.obs
    for response in o["batch_responses"]:
        assert response["status_code"] == 200
        assert response["json"].get("status") != "error", response
        assert "batch" in response["json"]
    drains = [o["drain1"], o["drain2"]]
    for batches in drains:
        for batch in batches:
            assert sum(len(g["tokens"]) for g in batch) == BATCH_SIZE, tags([batch])
    expected1 = [["A0", "A1"], ["A2", "A3"], ["A4", "B0", "B1"]]
    if run.ours:
        # We serve oldest first, so the whole drain is FIFO.
        assert tags(o["drain1"]) == expected1
    else:
        # Upstream forms all three at once and serves its cache newest first;
        # within a batch the order is still FIFO.
        assert tags(o["drain1"]) == expected1[::-1]
    assert tags(o["drain2"]) == [["A5", "C0"]]
    # Every drain ended with a null batch, as get_data() needs to return.
    nulls = [r for r in o["batch_responses"] if r["json"].get("batch", []) is None]
    assert len(nulls) >= 3  # first /batch, end of drain 1, end of drain 2


def test_groups_arrive_intact(run: Run) -> None:
    """Each served group equals what upstream's API would have served for the posted body."""
    o = run.obs
    echo = {tag(g): g for g in o["upstream_echo"]}
    served = [g for batches in (o["drain1"], o["drain2"]) for batch in batches for g in batch]
    assert sorted(tag(g) for g in served) == ["A0", "A1", "A2", "A3", "A4", "A5", "B0", "B1", "C0"]
    for g in served:
        assert set(g) == GROUP_KEYS, tag(g)
        assert g == echo[tag(g)], tag(g)
    a0 = next(g for g in served if tag(g) == "A0")  # the one with every optional field
    assert a0["generation_params"] == {"temperature": 0.7}
    assert a0["overrides"][0] == {"set_advantage_to_zero": True}
    assert a0["messages"][1][1] == {"role": "assistant", "content": "a1"}
    # GET /latest_example: the last accepted group before the drain, verbatim.
    latest = o["latest_example"]
    assert latest["status_code"] == 200
    assert latest["json"] == echo["A5"]
    sent = {tag(g): g for g in posted_groups(o)}
    assert all(sent[t]["tokens"] == echo[t]["tokens"] for t in echo)


# ----- an env that outlives a reset of the API -----------------------------------------------


def test_env_that_outlives_an_api_reset(run: Run) -> None:
    """After `/reset_data` and a trainer re-register, a running BaseEnv keeps sending with the
    env_id it got before (it never registers again).

    Upstream queues such groups (an env_id beyond its registry goes straight to the queue), then
    the env dies at its next `/status-env` poll (a 500). We refuse them at once with a 404 that
    names the env_id, as unknown env ids are bad input (docs/api.md), and queue nothing under an
    id that now means nothing; the env's `/status-env` poll gets the same 404.
    """
    o = run.obs
    assert o["reset"] == {"status_code": 200, "json": "Reset successful"}
    assert o["first_batch_after_reset"] == {"status_code": 200, "json": {"batch": None}}
    if run.kind == UPSTREAM:
        assert o["stale_env_scored_data"]["status_code"] == 200
        assert o["status_after_reset_send"]["json"] == {"current_step": 0, "queue_size": 2}
        assert tags(o["drain_after_reset"]) == [["R0", "R1"]]
        return
    after_reset = o["logs"][o["logs_before_reset"] : o["logs_before_probes"]]
    errors = " ".join(m["msg"] for m in after_reset if m["level"] in ("ERROR", "CRITICAL"))
    assert "404" in errors  # the client saw a client error and did not retry
    refused = o["stale_env_scored_data"]
    assert refused["status_code"] == 404 and "env_id 0 is not registered" in refused["body"]
    assert o["stale_env_status_env"]["status_code"] == 404
    assert o["status_after_reset_send"]["json"] == {"current_step": 0, "queue_size": 0}
