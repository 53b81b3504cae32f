"""`--sync transfer`: new weights straight into running inference servers, over a process group.

The trainer is rank 0 of a `torch.distributed` group (`atropos.local.group`: gloo on CPUs,
nccl on GPUs, the same code) that every server's workers join; the tensors go by broadcast and
HTTP only steers. Two dialects, by `server_type`:

- ``vllm`` (vLLM's weight-transfer routes, also `atropos local serve`): once ``POST
  /init_weight_transfer_engine {"init_info": {master_address, master_port, rank_offset,
  world_size}}`` (to vLLM itself: ``{nccl_unique_id_b64, rank_offset, world_size, packed:
  false}``, its engine joining by the NCCL unique id this trainer mints); per sync ``POST
  /pause?mode=M``, ``POST /start_weight_update``, ``POST /update_weights {"update_info":
  {names, dtype_names, shapes}}`` (answered once the broadcast that runs meanwhile has arrived;
  with ``ipc_handles_pickled`` instead of a broadcast for ``--transfer-backend ipc``), ``POST
  /finish_weight_update {"policy_version": N}`` (vLLM ignores the body), ``POST /resume``.
- ``sglang``: once ``POST /init_weights_update_group {master_address, master_port,
  rank_offset, world_size, group_name, backend}``; per sync ``POST /pause_generation {"mode":
  "retract"|"abort"}`` (none for `wait`: SGLang's update itself waits for running requests),
  ``POST /begin_weight_update {"selector": "all"}``, ``POST /update_weights_from_distributed
  {names, dtypes, shapes, group_name, weight_version}``, ``POST /end_weight_update {}``, ``POST
  /continue_generation``. SGLang 0.5.23 refuses the update outside a begin/end session (400);
  a server that answers 404 to the begin (an older SGLang) is sent the update alone from then on.

A push that fails still ends an open session and lifts its pause (a server left paused would
serve nothing, SGLang's ``/health`` included), then raises.

Several servers share one group: world size = 1 + every server's workers (``GET
/get_world_size``, or SGLang's ``GET /get_server_info`` tp_size x dp_size), each server's
`rank_offset` after the previous ones'. Every wait has the deadline `timeout`; a server that
refuses is a `SyncError` carrying its answer.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import httpx

log = logging.getLogger("atropos.client")
SERVER_TYPES = ("vllm", "sglang")
TRANSFER_BACKENDS = ("auto", "nccl", "gloo", "ipc")
IPC = "ipc"  # the group's stand-in when the tensors go by CUDA IPC handles
# keep: `retract` (running requests go back to the queue and are recomputed under the new
# weights); SGLang 0.5.23 refuses an update while `in_place` holds requests in the running
# batch, as it cannot flush the cache the old weights made. wait: no pause (the update waits).
SGLANG_PAUSE = {"keep": "retract", "abort": "abort"}


class SyncError(RuntimeError):
    """The inference server did not take the new weights (`status`: its HTTP answer's, if any)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        """Keep the message and the status."""
        super().__init__(message)
        self.status = status


def _in_thread(fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
    """Run `fn` in a daemon thread (a collective stuck on a dead peer must not hold the exit)."""
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:  # the caller gets it
            future.set_exception(exc)

    threading.Thread(target=run, name="atropos-transfer", daemon=True).start()
    return future


def named_tensors(model: Any) -> list[tuple[str, Any]]:
    """The model's state in order, each parameter once (a weight tied to another is sent under
    its first name; the server's tied copy follows). A sharded model's tensors are DTensors,
    with the whole tensor's shape, gathered one at a time as they are sent (`whole`)."""
    seen: set[int] = set()
    out = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        out.append((name, tensor.detach()))
    return out


def whole(tensor: Any) -> Any:
    """The whole of a sharded tensor (a collective of the trainer's ranks), else the tensor."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def local_address(url: str) -> str:
    """This host's address as the server at `url` reaches it (loopback for a loopback URL)."""
    parsed = urlparse(url)
    host = parsed.hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # sends nothing
        probe.connect((host, parsed.port or 80))
        return str(probe.getsockname()[0])


class TransferClient:
    """The trainer's end of `--sync transfer` for the servers at `roots` (see the module
    docstring): `connect` once, `push` per sync, `close` at the end.

    Args:
        roots: each server's root URL (no ``/v1``).
        http: the client for the HTTP calls (its headers carry the servers' key).
        server_type: "vllm" or "sglang": which routes to speak.
        backend: "auto" (nccl for a model on CUDA, else gloo), "nccl", "gloo", or "ipc" (a
            server on the trainer's GPU maps each tensor by its CUDA IPC handle; vLLM only).
        pause: how each sync treats requests in flight: "keep" (they continue under the new
            weights), "wait" (they finish first) or "abort" (they fail; clients retry).
        master_address: where the servers reach this trainer's store ("": found from the
            first server's URL).
        master_port: the store's port (0: any free one).
        timeout: seconds for the rendezvous, each broadcast and each HTTP call.
    """

    def __init__(
        self,
        roots: list[str],
        http: httpx.Client,
        *,
        server_type: str = "vllm",
        backend: str = "auto",
        pause: str = "keep",
        master_address: str = "",
        master_port: int = 0,
        timeout: float = 300.0,
    ) -> None:
        """Check the choices; nothing is contacted before `connect`."""
        if server_type not in SERVER_TYPES:
            raise ValueError(f"server type {server_type!r}: expected vllm or sglang")
        if backend not in TRANSFER_BACKENDS:
            raise ValueError(f"transfer backend {backend!r}: expected auto, nccl, gloo or ipc")
        if pause not in ("keep", "wait", "abort"):
            raise ValueError(f"transfer pause {pause!r}: expected keep, wait or abort")
        self.roots, self.http, self.server_type = roots, http, server_type
        self.backend, self.pause, self.timeout = backend, pause, timeout
        self.master_address, self.master_port = master_address, master_port
        self.group: Any = None
        self.group_name = ""
        self.broken: str | None = None
        self.sessionless: set[str] = set()  # SGLang servers without /begin_weight_update

    # ----- HTTP ----------------------------------------------------------------------------

    def _call(self, method: str, root: str, path: str, **kwargs: Any) -> Any:
        """One request with the deadline; any failure is a `SyncError` naming the route."""
        try:
            r = self.http.request(method, f"{root}{path}", timeout=self.timeout, **kwargs)
        except httpx.TimeoutException:
            raise SyncError(
                f"{method} {root}{path}: no answer within {self.timeout:g} s (--transfer-timeout)"
            ) from None
        except httpx.HTTPError as exc:
            raise SyncError(f"{method} {root}{path}: {type(exc).__name__}: {exc}") from exc
        if r.status_code >= 400:
            raise SyncError(f"{method} {root}{path}: {r.status_code} {r.text[:500]}", r.status_code)
        try:
            return r.json()
        except ValueError:
            return None

    def _post_all(
        self, path: str, body: Any = None, roots: list[str] | None = None, **kwargs: Any
    ) -> list[Any]:
        """POST to every server (or `roots`) at once; their answers, or the first failure."""
        futures = [
            _in_thread(functools.partial(self._call, "POST", root, path, json=body, **kwargs))
            for root in (self.roots if roots is None else roots)
        ]
        return [self._result(f, f"POST {path}") for f in futures]

    def _result(self, future: concurrent.futures.Future[Any], what: str) -> Any:
        try:
            return future.result(timeout=self.timeout + 5)
        except concurrent.futures.TimeoutError:
            raise SyncError(f"{what}: no answer within {self.timeout:g} s") from None

    def _world_size(self, root: str) -> int:
        """How many workers of the server at `root` hold the model."""
        try:
            answer = self._call("GET", root, "/get_world_size")
        except SyncError:
            if self.server_type != "sglang":
                raise
            info = self._call("GET", root, "/get_server_info")  # SGLang's
            return int(info.get("tp_size") or 1) * int(info.get("dp_size") or 1)
        size = answer.get("world_size") if isinstance(answer, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise SyncError(f"GET {root}/get_world_size: expected {{'world_size': N}}: {answer!r}")
        return size

    def _is_vllm(self, root: str) -> bool:
        """Whether the server at `root` is vLLM itself (its model cards say ``owned_by:
        vllm``): its NCCL engine joins by unique id, not by a store (`_connect_by_unique_id`)."""
        try:
            cards = self._call("GET", root, "/v1/models").get("data") or []
        except (SyncError, AttributeError):
            return False  # no model list: let the init route answer for itself
        return any(isinstance(c, dict) and c.get("owned_by") == "vllm" for c in cards)

    def _wait_all(self, futures: list[concurrent.futures.Future[Any]], what: str) -> list[Any]:
        """Wait for every future (the first failure ends the wait); their results."""
        done, pending = concurrent.futures.wait(
            futures, timeout=self.timeout + 5, return_when=concurrent.futures.FIRST_EXCEPTION
        )
        for future in done:
            error = future.exception()
            if isinstance(error, SyncError):
                raise error
            if error is not None:
                raise SyncError(f"{what}: {type(error).__name__}: {error}") from error
        if pending:
            raise SyncError(f"{what}: not done within {self.timeout:g} s")
        return [future.result() for future in futures]

    # ----- the group -----------------------------------------------------------------------

    def connect(self, model: Any) -> None:
        """Open the group as rank 0 while every server joins it (their init routes)."""
        import torch

        from atropos.local.group import GroupError, group_name_for, join_group, store_listener

        device = next(model.parameters()).device
        backend = self.backend
        if backend == IPC:
            self._connect_ipc(device)
            return
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl" and device.type == "cuda":
            torch.cuda.set_device(device)
        sizes = [self._world_size(root) for root in self.roots]
        world = 1 + sum(sizes)
        if self.server_type == "vllm" and any(self._is_vllm(root) for root in self.roots):
            self._connect_by_unique_id(device, backend, sizes)
            return
        address = self.master_address or local_address(self.roots[0])
        try:
            listener = store_listener(address, self.master_port)
        except GroupError as exc:
            raise SyncError(str(exc)) from exc
        port = listener.getsockname()[1]
        self.group_name = group_name_for(port)
        calls = []
        for i, root in enumerate(self.roots):
            info: dict[str, Any] = {
                "master_address": address,
                "master_port": port,
                "rank_offset": 1 + sum(sizes[:i]),
                "world_size": world,
            }
            body: dict[str, Any]
            if self.server_type == "vllm":
                path, body = "/init_weight_transfer_engine", {"init_info": info}
            else:
                path = "/init_weights_update_group"
                body = info | {"group_name": self.group_name, "backend": backend}
            calls.append(_in_thread(functools.partial(self._call, "POST", root, path, json=body)))
        log.info(
            "weight transfer: opening a %s group of %d at %s:%d", backend, world, address, port
        )
        joined = _in_thread(
            functools.partial(
                join_group,
                address,
                port,
                0,
                world,
                backend=backend,
                timeout=self.timeout,
                listener=listener,
            )
        )
        self.group = self._wait_all([joined, *calls], "forming the weight-transfer group")[0]

    def _connect_by_unique_id(self, device: Any, backend: str, sizes: list[int]) -> None:
        """vLLM's engine: an NCCL group whose workers join by the unique id this trainer mints
        (`init_info.nccl_unique_id_b64`, `atropos.local.group.UniqueIdGroup`), then one warm-up
        all-reduce; every server must be vLLM (ours joins by a store)."""
        import base64

        from atropos.local.group import GroupError, UniqueIdGroup

        if backend != "nccl" or device.type != "cuda":
            raise SyncError(
                "vLLM takes --sync transfer weights only over NCCL from a trainer on a GPU (its"
                f" engine has no gloo group); this trainer's model is on {device} (backend"
                f" {backend}). With vLLM on a CPU use --sync reload (vLLM's /collective_rpc"
                " reload_weights; start vLLM with VLLM_SERVER_DEV_MODE=1), --sync lora (vLLM"
                " with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) or --sync"
                " restart; on a GPU, --transfer-backend nccl, or ipc when vLLM shares the"
                " trainer's GPU"
            )
        if not all(self._is_vllm(root) for root in self.roots):
            raise SyncError(
                "the servers mix vLLM and others: vLLM's engine joins a weight-transfer group by"
                " NCCL unique id, other servers by a store; give one kind per trainer"
            )
        world = 1 + sum(sizes)
        try:
            opener = UniqueIdGroup(world, self.timeout)
            unique_id = base64.b64encode(opener.open()).decode("ascii")
        except GroupError as exc:
            raise SyncError(str(exc)) from exc
        calls = []
        for i, root in enumerate(self.roots):
            info = {
                "nccl_unique_id_b64": unique_id,
                "rank_offset": 1 + sum(sizes[:i]),
                "world_size": world,
                "packed": False,
            }
            body = {"init_info": info}
            calls.append(
                _in_thread(
                    functools.partial(
                        self._call, "POST", root, "/init_weight_transfer_engine", json=body
                    )
                )
            )
        log.info("weight transfer: an NCCL group of %d joined by unique id (vLLM)", world)
        joined = _in_thread(opener.joined)
        self.group = self._wait_all([joined, *calls], "forming vLLM's NCCL group")[0]

    def _connect_ipc(self, device: Any) -> None:
        """CUDA IPC needs no group: each server's engine is told so (an empty `init_info`)."""
        if device.type != "cuda":
            raise SyncError(
                f"--transfer-backend ipc shares GPU memory with the server: the model is on"
                f" {device}; use gloo (CPU) or nccl"
            )
        if self.server_type != "vllm":
            raise SyncError(
                "--transfer-backend ipc speaks vLLM's routes (--server-type vllm); SGLang takes"
                " weights over nccl or gloo here"
            )
        self._post_all("/init_weight_transfer_engine", {"init_info": {}})
        log.info("weight transfer: CUDA IPC handles to %d server(s)", len(self.roots))
        self.group = IPC

    def push(self, model: Any, version: int) -> int | None:
        """Make the model's weights the servers' policy `version` (pause, start, broadcast,
        finish, resume); returns the version the (first) server reports, when it does."""
        if self.group is None:
            raise SyncError("weight transfer: connect() first")
        if self.broken:
            raise SyncError(f"the weight-transfer group broke earlier ({self.broken})")
        tensors = named_tensors(model)
        pausing = self.server_type == "vllm" or self.pause in SGLANG_PAUSE
        try:
            if pausing:
                self._pause_all()
            answers = self._update(tensors, version)
        except BaseException:
            if pausing:  # a failed pause too: another server may have paused
                self._quietly(self._resume_all)
            raise
        if pausing:
            self._resume_all()
        reported = (
            answers[0].get("policy_version") if answers and isinstance(answers[0], dict) else None
        )
        return int(reported) if isinstance(reported, int) else None

    def _update(self, tensors: list[tuple[str, Any]], version: int) -> list[Any]:
        """vLLM's start, update, finish; SGLang's begin, update, end (the end also after a
        failed update); the answers that may carry the version (ours do)."""
        if self.server_type == "vllm":
            self._post_all("/start_weight_update", {})
            self._send(tensors, version)
            return self._post_all("/finish_weight_update", {"policy_version": version})
        opened = self._begin_sglang()
        try:
            answers = self._send(tensors, version)
        except BaseException:
            self._quietly(self._post_all, "/end_weight_update", {}, opened)
            raise
        self._post_all("/end_weight_update", {}, opened)
        return answers

    def _begin_sglang(self) -> list[str]:
        """``POST /begin_weight_update`` to every server; those that opened a session. A 404
        marks an older SGLang (no sessions) in `sessionless`; another failure ends the sessions
        opened and is raised."""
        roots = [root for root in self.roots if root not in self.sessionless]
        body = {"selector": "all"}
        futures = [
            _in_thread(
                functools.partial(self._call, "POST", root, "/begin_weight_update", json=body)
            )
            for root in roots
        ]
        opened, failure = [], None
        for root, future in zip(roots, futures, strict=True):
            try:
                self._result(future, "POST /begin_weight_update")
                opened.append(root)
            except SyncError as exc:
                if exc.status == 404:
                    log.info("%s has no /begin_weight_update: updating without a session", root)
                    self.sessionless.add(root)
                elif failure is None:
                    failure = exc
        if failure is not None:
            self._quietly(self._post_all, "/end_weight_update", {}, opened)
            raise failure
        return opened

    def _quietly(self, fn: Callable[..., Any], *args: Any) -> None:
        """Clean up after a failure: `fn(*args)`, its own failure logged, not raised."""
        try:
            fn(*args)
        except SyncError as exc:
            log.warning("weight transfer: after a failed push: %s", exc)

    def _pause_all(self) -> None:
        """Pause every server in the chosen mode."""
        if self.server_type == "vllm":
            self._post_all("/pause", None, params={"mode": self.pause})
        else:
            self._post_all("/pause_generation", {"mode": SGLANG_PAUSE[self.pause]})

    def _resume_all(self) -> None:
        path = "/resume" if self.server_type == "vllm" else "/continue_generation"
        self._post_all(path, {})

    def _send(self, tensors: list[tuple[str, Any]], version: int) -> list[Any]:
        """The update routes and the broadcast at once (their answers); a failure breaks the
        group."""
        from atropos.local.group import dtype_name

        names = [name for name, _ in tensors]
        dtypes = [dtype_name(t.dtype) for _, t in tensors]
        shapes = [list(t.shape) for _, t in tensors]
        if self.server_type == "vllm":
            path = "/update_weights"
            body: dict[str, Any] = {
                "update_info": {
                    "names": names, "dtype_names": dtypes, "shapes": shapes,  # unpacked
                }
            }  # fmt: skip
        else:
            path = "/update_weights_from_distributed"
            body = {
                "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": self.group_name,
                "flush_cache": True, "weight_version": str(version),
            }  # fmt: skip
        if self.group == IPC:
            return self._send_ipc(tensors, body)
        group = self.group
        calls = [
            _in_thread(functools.partial(self._call, "POST", root, path, json=body))
            for root in self.roots
        ]
        sending = _in_thread(lambda: [group.send(whole(t)) for _, t in tensors])
        try:
            done = self._wait_all([sending, *calls], f"sending {len(tensors)} tensors (v{version})")
            return done[1:]
        except SyncError as exc:
            self.broken = str(exc)
            raise SyncError(f"{exc} (the servers may hold mixed weights)") from exc

    def _send_ipc(self, tensors: list[tuple[str, Any]], body: dict[str, Any]) -> list[Any]:
        """The update route with every tensor's CUDA IPC handle; the servers have copied the
        tensors when it answers, so the next optimizer step may change them."""
        import torch

        from atropos.local.ipc import export_handles

        torch.cuda.synchronize()
        body["update_info"]["ipc_handles_pickled"] = export_handles([t for _, t in tensors])
        try:
            return self._post_all("/update_weights", body)
        except SyncError as exc:
            self.broken = str(exc)
            raise SyncError(f"{exc} (the servers may hold mixed weights)") from exc

    def close(self) -> None:
        """Leave the group (not after a failed broadcast, which may still hold it)."""
        if self.group == IPC:
            self.group = None
            return
        if self.group is not None and not self.broken:
            self.group.close()
        self.group = None
