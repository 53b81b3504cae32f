"""Getting new weights to the inference servers: five ways, one small interface (`Publisher`),
and a pause of their generation around a trainer's own use of the GPU (`Publisher.paused`).

`Publisher.sync(model_or_dir, version)` takes a model (saved here first: a directory per
version under `out_dir`, the newest `keep` kept) or a directory already written; `atropos train`
uses it through `atropos.trainer.sync.WeightSync`, which saves its LoRA adapters itself.

- `none`: the trainer only writes checkpoints.
Several servers (``--server-url A,B``, e.g. replicas started by `atropos launch`) get the same
weights in `reload` and `lora` modes, one after the other.

- `reload`: save a full checkpoint, then ``POST {server}/update_weights_from_disk
  {"model_path", "policy_version"}`` (our local server; SGLang has the same endpoint). The server
  swaps weights between generation batches, so every response comes from one version. vLLM has
  no such route (404; seen with vLLM 0.32): it reloads from disk through its dev-mode routes
  (``VLLM_SERVER_DEV_MODE=1``), so a server that answers 404 is reloaded, from then on, by
  ``POST /pause?mode=wait`` (requests in flight finish under the old weights; new ones wait),
  ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (every
  worker loads the checkpoint in place), ``POST /reset_prefix_cache`` (no KV the old weights
  computed is reused) and ``POST /resume``: every response comes from one version, as with
  ours. Not `keep` with ``reset_running_requests``: recomputing a preempted seeded request
  kills vLLM 0.32's CPU engine ("CPU Generator does not use offset"). vLLM reports no version,
  so its groups carry the published one (`docs/api.md`, "Policy versions"). vLLM 0.32 on a CPU
  keeps the LM head it started with when a model with tied embeddings is reloaded (the head's
  packed GEMM weights are made at load and its tied weight is not in the checkpoint, so the
  reload never repacks it: seen as "ParallelLMHead: Failed to load weights" in its log and a
  served head 9e-2 off after two steps): the trainer warns, and
  `atropos.local.weights.untied_copy` makes the same
  model with its own head, which reloads whole (the demo serves vLLM that copy).
- `restart`: the trainer runs the server itself from `server_command` (a template with
  ``{model}``, ``{port}`` and optionally ``{version}``, e.g. ``vllm serve {model} --port
  {port} --served-model-name policy``), and on each sync stops it (SIGTERM to its process
  group, SIGKILL after a grace period; never a broad ``pkill``), saves, and starts it on the
  new checkpoint, waiting for ``GET /health``. Environments retry during the gap.
- `lora`: the trainer trains LoRA adapters; each sync saves the adapter and calls vLLM's
  ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace": true}``, so requests
  for model `lora_name` use the new adapter without a restart.
- `transfer`: no disk: the tensors go by broadcast over a process group the servers join, steered
  by vLLM's weight-transfer routes or SGLang's (`atropos.client.transfer`); requests in flight
  are kept (and finish under the new weights), waited for, or aborted (`--transfer-pause`).
  torch.distributed is imported only when the first transfer joins the group.

Every save goes to a fresh directory renamed into place, so a server never reads a half-written
checkpoint; only the newest `keep` directories are kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from atropos.client.transfer import SGLANG_PAUSE, SyncError, TransferClient
from atropos.engines import fill_template

log = logging.getLogger("atropos.client")
SYNC_MODES = ("none", "reload", "restart", "lora", "transfer")
__all__ = ["SYNC_MODES", "Publisher", "SyncError", "prune", "save_model", "server_urls"]


RETRY_STATUS = (502, 503, 504)  # a proxy or server saying "not now": retried until the deadline


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def save_model(model: Any, tokenizer: Any, path: Path, state: dict[str, Any] | None = None) -> Path:
    """Write a loadable HF directory (weights, config, tokenizer) atomically at `path`; the
    weights are `state` when given (gathered from a sharded model), else the model's. A model
    without a tokenizer (None) is written without one."""
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def _tied(model_dir: Path) -> bool:
    """Whether the checkpoint at `model_dir` ties its LM head to its embeddings."""
    import json

    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(config.get("tie_word_embeddings", False))


def prune(folder: Path, prefix: str, keep: int) -> None:
    """Delete all but the newest `keep` directories named ``{prefix}{number}``."""
    found = sorted(
        (int(p.name[len(prefix) :]), p)
        for p in folder.glob(f"{prefix}*")
        if p.is_dir() and p.name[len(prefix) :].isdigit()
    )
    for _, p in found[: max(len(found) - keep, 0)]:
        shutil.rmtree(p, ignore_errors=True)


def server_urls(urls: str | Sequence[str] | None = None) -> list[str]:
    """The inference servers' OpenAI base URLs: `urls` (comma-separated or a list), else
    `$ATROPOS_SERVER_URLS` (what `atropos launch` exports to a trainer)."""
    if urls is None:
        urls = os.environ.get("ATROPOS_SERVER_URLS", "")
    parts = urls.split(",") if isinstance(urls, str) else list(urls)
    return [u.strip().rstrip("/") for u in parts if u.strip()]


class Publisher:
    """Publishes weights as policy `version` to the inference servers (module docstring).

    Args:
        mode: reload, restart, lora, transfer (or none).
        servers: their OpenAI base URLs (comma-separated or a list); default
            `$ATROPOS_SERVER_URLS`.
        out_dir: where a model handed to `sync` is saved (``weights/v{N}``, ``adapters/v{N}``).
        server_key: the servers' key; default `$ATROPOS_TRAIN_SERVER_API_KEY`.
        transfer: `TransferClient`'s options (transfer mode).
    """

    def __init__(
        self,
        mode: str = "reload",
        servers: str | Sequence[str] | None = None,
        *,
        out_dir: Path | str = Path("runs/client"),
        server_command: str = "",
        lora_name: str = "policy",
        keep: int = 2,
        health_timeout: float = 300.0,
        server_key: str | None = None,
        transfer: dict[str, Any] | None = None,
    ) -> None:
        if mode not in SYNC_MODES:
            raise ValueError(f"sync mode {mode!r}: expected one of {', '.join(SYNC_MODES)}")
        if mode == "restart" and "{model}" not in server_command:
            raise ValueError(
                "sync mode 'restart' needs --server-command with a {model} placeholder"
            )
        self.mode, self.out_dir, self.keep = mode, Path(out_dir), keep
        self.urls = server_urls(servers)
        if not self.urls:
            raise ValueError(
                "no inference server URL: give --server-url (or set ATROPOS_SERVER_URLS)"
            )
        if mode == "restart" and len(self.urls) > 1:
            raise ValueError("sync mode 'restart' runs one server: give one --server-url")
        self.url = self.urls[0]
        self.root = self.url.removesuffix("/v1")
        self.roots = [u.removesuffix("/v1") for u in self.urls]
        self.command, self.lora_name = server_command, lora_name
        self.health_timeout = health_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.served_version: int | None = None  # as the server confirmed it (reload mode)
        self.vllm_reload: set[str] = set()  # servers without /update_weights_from_disk (vLLM)
        self.warned_tied = False
        self.sglang_pause: set[str] = set()  # servers that pause by /pause_generation
        server_key = server_key or os.environ.get("ATROPOS_TRAIN_SERVER_API_KEY") or None
        headers = {"Authorization": f"Bearer {server_key}"} if server_key else {}
        self.http = httpx.Client(timeout=600.0, headers=headers)
        self.transfer = (
            TransferClient(self.roots, self.http, **(transfer or {}))
            if mode == "transfer"
            else None
        )

    # ----- restart mode: the trainer owns the server process ---------------------------------

    def start_server(self, model_dir: str, version: int = 0) -> None:
        """Start the server on `model_dir` (restart mode only) and wait until it is healthy."""
        port = httpx.URL(self.root).port or 80
        values = {"model": model_dir, "port": port, "version": version}
        argv = [fill_template(a, values) for a in shlex.split(self.command)]
        log.info("starting inference server: %s", " ".join(argv))
        self.process = subprocess.Popen(argv, start_new_session=True)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.health_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise SyncError(f"inference server exited with {self.process.returncode}")
            try:
                if self.http.get(f"{self.root}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        raise SyncError(f"inference server not healthy after {self.health_timeout:.0f} s")

    def stop_server(self, grace: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL it after `grace` seconds."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    # ----- publishing ------------------------------------------------------------------------

    def sync(
        self,
        model_or_dir: Any,
        version: int,
        *,
        tokenizer: Any = None,
        state: dict[str, Any] | None = None,
        waiting: Any = None,
    ) -> float:
        """Make `version` the served policy; returns the seconds it took.

        `model_or_dir`: a model (saved first, with `tokenizer` when given; `state`: its weights
        gathered from a sharded model) or a directory already holding the checkpoint (reload,
        restart) or the adapter (lora); transfer sends a model's tensors (it gathers one at a
        time itself, `TransferClient.push`). `waiting` is the trainer's context for
        interruptible waits (a server that is restarting)."""
        t0 = time.perf_counter()
        given = Path(model_or_dir) if isinstance(model_or_dir, str | os.PathLike) else None
        if given is not None and self.mode == "transfer":
            raise ValueError("sync mode 'transfer' sends a model's tensors: pass the model")
        if self.mode == "reload":
            path = given or self._saved(model_or_dir, tokenizer, version, state)
            self.served_version = self._reload(path.resolve(), version, waiting)
        elif self.mode == "restart":
            self.stop_server()
            path = given or self._saved(model_or_dir, tokenizer, version, state)
            self.start_server(str(path.resolve()), version)
            self.served_version = version
        elif self.transfer is not None:
            if self.transfer.group is None:
                with waiting("the inference servers to join") if waiting else _nothing():
                    self.transfer.connect(model_or_dir)
            reported = self.transfer.push(model_or_dir, version)
            self.served_version = version if reported is None else reported
        elif self.mode == "lora":
            path = given or self.save_adapter(
                model_or_dir, self.out_dir / "adapters" / f"v{version}", state
            )
            body = {
                "lora_name": self.lora_name,
                "lora_path": str(path.resolve()),
                "load_inplace": True,
            }
            self._post("/v1/load_lora_adapter", body, waiting)
            self.served_version = version
            if given is None:
                prune(path.parent, "v", self.keep)
        return time.perf_counter() - t0

    def _saved(self, model: Any, tokenizer: Any, version: int, state: Any) -> Path:
        """`model` written as ``weights/v{version}`` (older ones pruned to `keep`)."""
        path = save_model(model, tokenizer, self.out_dir / "weights" / f"v{version}", state)
        prune(path.parent, "v", self.keep)
        return path

    def save_adapter(self, model: Any, path: Path, state: dict[str, Any] | None) -> Path:
        """Write `model`'s LoRA adapter atomically at `path` (lora mode, given a model): a PEFT
        model's own `save_pretrained`; `atropos train` writes its adapters itself."""
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, state_dict=state)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
        return path

    def _reload(self, path: Path, version: int, waiting: Any = None) -> int:
        """Every server loads the checkpoint at `path` as `version`; the version the first
        server reports (ours and SGLang's route), else `version`."""
        # SGLang labels the weights it serves with `weight_version` (a string); ours reads
        # `policy_version`
        body = {"model_path": str(path), "policy_version": version, "weight_version": str(version)}
        reported: list[Any] = []
        for root in self.roots:
            if root not in self.vllm_reload:
                r = self._post_one(root, "/update_weights_from_disk", body, waiting)
                if r.status_code != 404:
                    answer = _json(self._check(root, "/update_weights_from_disk", r))
                    reported.append(
                        answer.get("policy_version") if isinstance(answer, dict) else None
                    )
                    continue
                log.info("%s has no /update_weights_from_disk (vLLM): reloading through its"
                         " /collective_rpc", root)  # fmt: skip
                self.vllm_reload.add(root)
            self._reload_vllm(root, path, waiting)
            reported.append(None)
        first = reported[0] if reported else None
        return int(first) if first is not None else version

    def _reload_vllm(self, root: str, path: Path, waiting: Any = None) -> None:
        """vLLM's reload from disk (see the module docstring): pause, load, forget the prefix
        cache, resume; resumed whatever happens once paused."""
        if not self.warned_tied and _tied(path):
            self.warned_tied = True
            log.warning(
                "%s is vLLM and the model ties its LM head to its embeddings: vLLM 0.32 on a"
                " CPU does not reload a tied head (it keeps the one it started with); serve an"
                " untied copy (atropos.local.weights.untied_copy), or use --sync restart or"
                " --sync lora (docs/trainer.md)",
                root,
            )
        paused = self._post_one(root, "/pause", None, waiting, params={"mode": "wait"})
        if paused.status_code == 404:
            raise SyncError(
                f"{root} answers 404 to /update_weights_from_disk and /pause: a vLLM server"
                " reloads weights from disk only through its dev-mode routes; start it with"
                " VLLM_SERVER_DEV_MODE=1 (or use --sync restart, or --sync lora with"
                " --enable-lora)"
            )
        self._check(root, "/pause", paused)
        try:
            rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            self._check(root, "/collective_rpc", self._post_one(root, "/collective_rpc", rpc))
            reset = self._post_one(root, "/reset_prefix_cache", None)
            answer = _json(self._check(root, "/reset_prefix_cache", reset))
            if isinstance(answer, dict) and answer.get("success") is False:
                raise SyncError(
                    f"POST {root}/reset_prefix_cache: vLLM could not forget the KV cache of the"
                    " old weights; responses would reuse it"
                )
        finally:
            self._check(root, "/resume", self._post_one(root, "/resume", None))

    def _post(self, path: str, body: dict[str, Any], waiting: Any = None) -> Any:
        """POST to every server; the first one's JSON answer (None when the answer is not JSON,
        as vLLM's LoRA text)."""
        answers = [
            _json(self._check(root, path, self._post_one(root, path, body, waiting)))
            for root in self.roots
        ]
        return answers[0]

    @staticmethod
    def _check(root: str, path: str, r: httpx.Response) -> httpx.Response:
        if r.status_code >= 400:
            raise SyncError(f"POST {root}{path}: {r.status_code} {r.text[:300]}")
        return r

    def _post_one(
        self,
        root: str,
        path: str,
        body: dict[str, Any] | None,
        waiting: Any = None,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        """POST to one server; its answer, whatever the status, but for one that cannot be
        reached or answers 502/503/504 (restarting, e.g. under `atropos launch`): retried with
        a growing pause until `health_timeout` seconds have passed; `waiting(what)` (the
        trainer's) lets a signal end such a pause at once."""
        deadline = time.monotonic() + self.health_timeout
        pause = 0.5
        while True:
            try:
                r = self.http.post(f"{root}{path}", json=body, params=params)
            except httpx.TransportError as err:
                problem = f"{type(err).__name__}: {err}"
            else:
                if r.status_code not in RETRY_STATUS:
                    return r
                problem = f"{r.status_code} {r.text[:200]}"
            if time.monotonic() + pause > deadline:
                raise SyncError(
                    f"POST {root}{path}: {problem}; the server did not come back within"
                    f" {self.health_timeout:.0f} s"
                )
            log.warning("POST %s%s: %s; retrying in %.1f s", root, path, problem, pause)
            with waiting(f"the inference server at {root}") if waiting else _nothing():
                time.sleep(pause)
            pause = min(pause * 2, 5.0)

    # ----- pausing generation ----------------------------------------------------------------

    @contextlib.contextmanager
    def paused(self, timeout: float = 300.0) -> Iterator[None]:
        """Generation paused on every server for the block (a trainer sleeping and waking its
        share of the GPU): requests in flight finish first, new ones wait until the block
        ends; generation resumes on every exit path.

        vLLM and `atropos local serve`: ``POST /pause?mode=wait`` ... ``POST /resume``.
        SGLang (answers 404 there): ``POST /pause_generation {"mode": "retract"}`` (its running
        requests go back to its queue, their KV cache freed) ... ``POST /continue_generation``.
        `SyncError` when a server is not paused (requests in flight still running) within
        `timeout` seconds."""
        held: list[str] = []
        try:
            for root in self.roots:
                held.append(root)  # resumed even when its pause failed half-way
                self._pause(root, timeout)
            yield
        except BaseException:
            self._resume_all(held, timeout, quietly=True)  # the first error is the one to see
            raise
        self._resume_all(held, timeout)

    def _resume_all(self, roots: list[str], timeout: float, quietly: bool = False) -> None:
        problems = []
        for root in roots:
            try:
                self._resume(root, timeout)
            except (SyncError, httpx.HTTPError) as err:
                problems.append(str(err))
        if problems and not quietly:
            raise SyncError("; ".join(problems))
        for problem in problems:
            log.warning("resuming generation: %s", problem)

    def _pause(self, root: str, timeout: float) -> None:
        try:
            if root not in self.sglang_pause:
                r = self.http.post(f"{root}/pause", params={"mode": "wait"}, timeout=timeout)
                if r.status_code != 404:
                    self._check(root, "/pause", r)
                    return
                self.sglang_pause.add(root)
            body = {"mode": SGLANG_PAUSE["keep"]}
            r = self.http.post(f"{root}/pause_generation", json=body, timeout=timeout)
        except httpx.TimeoutException:
            raise SyncError(
                f"POST {root}/pause: generation was not paused within {timeout:g} s (requests"
                " in flight still running); pass paused(timeout=...) a longer deadline"
            ) from None
        except httpx.TransportError as err:
            raise SyncError(f"POST {root}/pause: {type(err).__name__}: {err}") from None
        if r.status_code == 404:
            raise SyncError(
                f"{root} answers 404 to /pause and /pause_generation: a vLLM server pauses"
                " only with VLLM_SERVER_DEV_MODE=1"
            )
        self._check(root, "/pause_generation", r)

    def _resume(self, root: str, timeout: float) -> None:
        path = "/continue_generation" if root in self.sglang_pause else "/resume"
        self._check(root, path, self.http.post(f"{root}{path}", timeout=timeout))

    def close(self) -> None:
        if self.mode == "restart":
            self.stop_server()
        if self.transfer is not None:
            self.transfer.close()
        self.http.close()


def _json(r: httpx.Response) -> Any:
    """The answer's JSON; None when it is not JSON (vLLM's LoRA route answers text)."""
    try:
        return r.json()
    except ValueError:
        return None
