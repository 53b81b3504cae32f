"""`atropos local serve` against another local process, as an attacker would try it: the
mutating routes need the key when one is set (and change nothing without it), a rendezvous is
joined only at an accepted address and within a deadline a later call can cut short, and files
are read only from under the allowed directories, with one answer for everything outside.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from atropos.local.engine import Engine
from atropos.local.guard import AddressPolicy, PathPolicy
from atropos.local.lora import save_adapter
from atropos.local.protocol import RequestError
from atropos.local.server import LocalServer
from atropos.testing import serve_in_thread

KEY = "k-" + "x" * 30
Q = "model.layers.0.self_attn.q_proj"
MUTATING = [  # (path, body): every route that changes what the server serves
    ("/update_weights_from_disk", {"model_path": "."}),
    ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "."}),
    ("/v1/unload_lora_adapter", {"lora_name": "a"}),
    ("/pause?mode=abort", {}),
    ("/resume", {}),
    ("/init_weight_transfer_engine", {"init_info": {"master_address": "127.0.0.1"}}),
    ("/start_weight_update", {}),
    ("/update_weights", {"update_info": {}}),
    ("/finish_weight_update", {}),
    ("/init_weights_update_group", {"master_address": "127.0.0.1", "master_port": 1}),
    ("/update_weights_from_distributed", {}),
    ("/pause_generation", {}),
    ("/continue_generation", {}),
    ("/begin_weight_update", {}),
    ("/end_weight_update", {}),
]


class Guarded:
    """A server in this process: `http` (no key), `admin` (the key, when one is set)."""

    def __init__(self, url: str, engine: Engine, key: str | None) -> None:
        self.url, self.engine = url, engine
        self.http = httpx.Client(base_url=url, timeout=60)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.admin = httpx.Client(base_url=url, timeout=60, headers=headers)

    def state(self) -> tuple[Any, ...]:
        """What a mutating route could change: weights, version, pause, adapters."""
        checksum = self.admin.get("/weights_checksum").json()
        paused = self.admin.get("/is_paused").json()["is_paused"]
        models = sorted(m["id"] for m in self.admin.get("/v1/models").json()["data"])
        return checksum["sha256"], checksum["policy_version"], paused, models


@contextlib.contextmanager
def guarded(model_dir: Path, key: str | None = None, **options: Any) -> Iterator[Guarded]:
    engine = Engine(str(model_dir), device="cpu").start()
    try:
        app = LocalServer(engine, served_model_name="tiny", api_key=key, **options).app
        with serve_in_thread(app) as url:
            live = Guarded(url, engine, key)
            try:
                yield live
            finally:
                live.http.close()
                live.admin.close()
    finally:
        engine.close()


def adapter(directory: Path, config: dict[str, Any] | None = None) -> Path:
    pair = (torch.full((2, 32), 0.1), torch.full((32, 2), 0.1))
    save_adapter(directory, {Q: pair}, r=2, alpha=2, target_modules=["q_proj"])
    if config is not None:
        path = directory / "adapter_config.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | config))
    return directory


# --- keys ---------------------------------------------------------------------------------


def test_every_mutating_route_needs_the_key_and_changes_nothing_without_it(
    model_dir: Path, other_model_dir: Path, tmp_path: Path
) -> None:
    lora = adapter(tmp_path / "lora")
    with guarded(model_dir, KEY, allowed_paths=[str(tmp_path), str(other_model_dir)]) as live:
        load = {"lora_name": "a", "lora_path": str(lora)}
        assert live.admin.post("/v1/load_lora_adapter", json=load).status_code == 200
        before = live.state()
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            for path, body in MUTATING:
                r = live.http.post(path, json=body, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.json()["error"]["type"] == "AuthenticationError"
            reload = {"model_path": str(other_model_dir)}
            r = live.http.post("/update_weights_from_disk", json=reload, headers=headers)
            assert r.status_code == 401
            assert live.state() == before
        assert live.http.get("/health").status_code == 200  # readiness stays open
        # with the key each works
        assert live.admin.post("/pause?mode=keep").json()["status"] == "paused"
        assert live.admin.get("/is_paused").json()["is_paused"] is True
        assert live.admin.post("/resume").status_code == 200
        r = live.admin.post("/v1/unload_lora_adapter", json={"lora_name": "a"})
        assert r.status_code == 200 and live.state()[3] == ["tiny"]
        r = live.admin.post("/update_weights_from_disk", json={"model_path": str(other_model_dir)})
        assert r.status_code == 200, r.text
        assert live.state()[:2] != before[:2]


def test_without_a_key_a_loopback_server_stays_open_as_vllms(model_dir: Path) -> None:
    with guarded(model_dir) as live:
        assert live.http.post("/pause?mode=keep").status_code == 200
        assert live.http.post("/resume").status_code == 200


# --- the rendezvous -----------------------------------------------------------------------


def test_a_rendezvous_at_an_address_not_allowed_is_refused_at_once(model_dir: Path) -> None:
    with guarded(model_dir) as live:
        before = live.state()
        for address in ("10.1.2.3", "192.168.0.1", "evil.example", "::2", "0.0.0.0"):
            vllm = {"init_info": {"master_address": address, "master_port": 29500,
                                  "rank_offset": 1, "world_size": 2}}  # fmt: skip
            sglang = vllm["init_info"] | {"group_name": "g", "backend": "gloo"}
            for path, body in (("/init_weight_transfer_engine", vllm),
                               ("/init_weights_update_group", sglang)):  # fmt: skip
                start = time.monotonic()
                r = live.http.post(path, json=body)
                assert r.status_code == 403, (address, r.text)
                assert "--transfer-allow" in r.json()["error"]["message"]
                assert time.monotonic() - start < 5
        assert live.state() == before
    allow = AddressPolicy.parse("10.0.0.0/8,trainer-1")
    assert allow.allows("10.1.2.3") and allow.allows("TRAINER-1")
    assert not allow.allows("127.0.0.1") and not allow.allows("trainer-2")
    with pytest.raises(ValueError, match="not an address"):
        AddressPolicy.parse("a b")


@contextlib.contextmanager
def silent_master() -> Iterator[int]:
    """A port that accepts connections and never answers: a rendezvous that hangs."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def _init(port: int) -> dict[str, Any]:
    return {"init_info": {"master_address": "127.0.0.1", "master_port": port,
                          "rank_offset": 1, "world_size": 2}}  # fmt: skip


def test_a_hanging_rendezvous_is_cancelled_by_resume_or_a_new_init(model_dir: Path) -> None:
    with (
        guarded(model_dir, rendezvous_timeout=60) as live,
        silent_master() as port,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        for cancel in ("/resume", "/continue_generation"):
            waiting = pool.submit(live.http.post, "/init_weight_transfer_engine", json=_init(port))
            time.sleep(1.0)  # let it reach the rendezvous (a cancel before it is fine too)
            start = time.monotonic()
            assert live.http.post(cancel).status_code == 200
            r = waiting.result(timeout=20)
            assert r.status_code == 409 and "cancelled" in r.text, r.text
            assert time.monotonic() - start < 15
        first = pool.submit(live.http.post, "/init_weight_transfer_engine", json=_init(port))
        time.sleep(1.0)
        second = pool.submit(live.http.post, "/init_weight_transfer_engine", json=_init(port))
        assert first.result(timeout=20).status_code == 409
        live.http.post("/resume")
        assert second.result(timeout=20).status_code == 409
        assert live.http.post("/start_weight_update").status_code == 400  # no group joined


def test_a_rendezvous_that_never_forms_ends_at_its_deadline(model_dir: Path) -> None:
    with guarded(model_dir, rendezvous_timeout=2) as live, silent_master() as port:
        start = time.monotonic()
        r = live.http.post("/init_weight_transfer_engine", json=_init(port))
        assert r.status_code == 504, r.text
        assert time.monotonic() - start < 15
        assert live.http.post("/pause?mode=keep").status_code == 200  # the server is free
        assert live.http.post("/resume").status_code == 200


# --- paths --------------------------------------------------------------------------------


OUTSIDE = "is not under a directory this server reads from (--allowed-paths)"


def test_paths_outside_the_allowed_directories_get_one_answer(
    model_dir: Path, tmp_path: Path
) -> None:
    allowed, secret = tmp_path / "allowed", tmp_path / "secret"
    adapter(allowed / "ok")
    adapter(secret / "lora", {"peft_type": "SECRET-VALUE"})
    (allowed / "link").symlink_to(secret / "lora")
    with guarded(model_dir, allowed_paths=[str(allowed)]) as live:
        before = live.state()
        answers = set()
        for path in (str(secret / "lora"), str(secret / "nothing"), "/etc/passwd",
                     "/nonexistent/x", str(allowed / "link"), str(allowed / ".." / "secret"),
                     "~root", "relative/path"):  # fmt: skip
            r = live.http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": path})
            assert r.status_code == 403 and "SECRET" not in r.text, r.text
            answers.add(r.json()["error"]["message"])
            r = live.http.post("/update_weights_from_disk", json={"model_path": path})
            assert r.status_code == 403 and r.json()["success"] is False
            answers.add(r.json()["message"])
        assert answers == {f"lora_path {OUTSIDE}", f"model_path {OUTSIDE}"}
        assert live.state() == before
        ok = {"lora_name": "x", "lora_path": str(allowed / "ok")}
        assert live.http.post("/v1/load_lora_adapter", json=ok).status_code == 200


def test_malformed_paths_are_a_400_never_a_500(model_dir: Path, tmp_path: Path) -> None:
    adapter(tmp_path / "bad", {"peft_type": "SECRET-VALUE"})
    with guarded(model_dir, allowed_paths=[str(tmp_path)]) as live:
        for path in ("a" * 5000, str(tmp_path / ("b" * 300)), "x\x00y", str(tmp_path / "\udc80"),
                     str(tmp_path / "a") + "/b" * 2100):  # fmt: skip
            for route, body in (("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": path}),
                                ("/update_weights_from_disk", {"model_path": path})):  # fmt: skip
                raw = json.dumps(body)  # ASCII: a lone surrogate goes as its escape
                r = live.http.post(route, content=raw, headers={"Content-Type": "application/json"})
                assert 400 <= r.status_code < 500, (route, path[:40], r.text)
        r = live.http.post(
            "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "bad")}
        )
        assert r.status_code == 400 and "SECRET" not in r.text, r.text


def test_the_path_policy_resolves_before_it_compares(tmp_path: Path) -> None:
    policy = PathPolicy([str(tmp_path / "a")])
    (tmp_path / "a").mkdir()
    assert policy.check(str(tmp_path / "a" / "x"), "p") == str((tmp_path / "a" / "x").resolve())
    for path in (str(tmp_path / "ab"), str(tmp_path / "a" / ".." / "b")):
        with pytest.raises(RequestError) as caught:
            policy.check(path, "p")
        assert caught.value.status == 403
    assert PathPolicy(None).roots[0] == os.path.realpath(os.getcwd())


# --- the command line ---------------------------------------------------------------------


def test_the_flags_are_checked_before_the_model_loads(model_dir: Path, tmp_path: Path) -> None:
    from atropos.cli.local import add_serve_arguments, check_args

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(
        [
            str(model_dir),
            "--allowed-paths",
            f"{tmp_path}, {model_dir}",
            "--transfer-allow",
            "10.0.0.5,127.0.0.1",
        ]  # fmt: skip
    )
    check_args(args)
    assert args.allowed_paths == [str(tmp_path), str(model_dir)]
    assert args.transfer_allow.allows("10.0.0.5") and not args.transfer_allow.allows("10.0.0.6")
    for bad in (["--allowed-paths", str(tmp_path / "none")], ["--transfer-allow", "a b"],
                ["--transfer-rendezvous-timeout", "0"]):  # fmt: skip
        with pytest.raises(SystemExit) as caught:
            check_args(parser.parse_args([str(model_dir), *bad]))
        assert caught.value.code == 2
