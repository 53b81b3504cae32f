"""In-flight weight updates for `atropos local serve`: vLLM's and SGLang's routes, one receiver.

The trainer opens a process group (`atropos.local.group`, gloo here, nccl for a server on a
GPU), the server joins it as rank `rank_offset`, and each update's tensors arrive by broadcast
straight into the served model, no disk involved. A server started with ``--transfer-backend
ipc`` shares its GPU with the trainer instead: vLLM's init route with an empty `init_info`, and
each `update_info` carries the tensors' CUDA IPC handles (``ipc_handles_pickled``,
`atropos.local.ipc`), copied device to device. Routes (docs/local.md has the fields):

- vLLM: ``POST /init_weight_transfer_engine {"init_info": {master_address, master_port,
  rank_offset, world_size}}``; per update ``POST /start_weight_update``, ``POST /update_weights
  {"update_info": {names, dtype_names, shapes, packed}}`` (once or more), ``POST
  /finish_weight_update`` (ours also takes ``{"policy_version": N}``); ``POST
  /pause?mode=abort|wait|keep``, ``POST /resume``, ``GET /is_paused``, ``GET /get_world_size``.
- SGLang: ``POST /init_weights_update_group {master_address, master_port, rank_offset,
  world_size, group_name, backend}``, ``POST /update_weights_from_distributed {names, dtypes,
  shapes, group_name, weight_version}`` (start, receive and finish in one call), ``POST
  /pause_generation {"mode": abort|retract|in_place}`` (retract and in_place are our `keep`),
  ``POST /continue_generation``; ``POST /begin_weight_update {"selector": "all"}`` and ``POST
  /end_weight_update`` open and close a session as SGLang 0.5.23's do (one at a time), which
  an update may run inside or, as with older SGLang, without.
- ``GET /weights_checksum``: SHA-256 of the served weights, to check a transfer bit for bit.

A rendezvous must be at an address the server accepts (``--transfer-allow``, default loopback:
403 otherwise) and forms within ``--transfer-rendezvous-timeout`` seconds (504 otherwise); a
later init, `/resume` or `/continue_generation` cancels one still waiting (409 for the waiting
call), so nobody can hold the server by naming a rendezvous that never answers.

An update started without a pause pauses in `wait` mode itself and resumes when it finishes. A
broadcast that fails midway leaves the weights mixed: generation stays paused and `/resume` is
refused until a whole update succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from atropos.local.guard import AddressPolicy
from atropos.local.protocol import PAUSE_MODES, RequestError, json_object

if TYPE_CHECKING:
    import torch

    from atropos.local.engine import Engine
    from atropos.local.group import WeightGroup

TRANSFER_TIMEOUT = 300.0  # seconds for each broadcast
RENDEZVOUS_TIMEOUT = 30.0  # seconds for a group to form (--transfer-rendezvous-timeout)
SGLANG_PAUSE = {"abort": "abort", "retract": "keep", "in_place": "keep"}
Handler = Callable[[Request], Awaitable[Response]]


def _ok(message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": True, "message": message, **extra})


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object of a body that may be empty (then {})."""
    raw = await request.body()
    return json_object(raw) if raw.strip() else {}


class TransferError(Exception):
    """A weight-transfer call the server cannot do; `status` is its HTTP status."""

    def __init__(self, message: str, status: int = 500) -> None:
        """Keep the message and the status."""
        super().__init__(message)
        self.message, self.status = message, status


def _list(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    if not isinstance(value, list):
        raise RequestError(f"{key} must be a list, got {value!r}", key)
    return value


def _int(body: dict[str, Any], key: str, lo: int = 0) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise RequestError(f"{key} must be an integer >= {lo}, got {value!r}", key)
    return value


def _str(body: dict[str, Any], key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or not value:
        raise RequestError(f"{key} must be a non-empty string, got {value!r}", key)
    return value


def _version(value: Any, key: str) -> int | None:
    """A policy version: an int, or SGLang's `weight_version` string holding one (else None)."""
    if value is None or isinstance(value, str):
        text = (value or "").strip()
        return int(text) if text.lstrip("-").isdigit() else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{key} must be an integer, got {value!r}", key)
    return value


def parse_update(
    body: dict[str, Any], dtypes_key: str, state: dict[str, torch.Tensor]
) -> list[tuple[str, torch.dtype]]:
    """The (name, dtype) pairs of an update, checked against the model's `state` (every name
    known, every shape equal); a `RequestError` names the first problem."""
    from atropos.local.group import dtype_from_name

    names, dtypes, shapes = _list(body, "names"), _list(body, dtypes_key), _list(body, "shapes")
    if not len(names) == len(dtypes) == len(shapes):
        raise RequestError(
            f"names, {dtypes_key} and shapes must have one entry per tensor: got"
            f" {len(names)}, {len(dtypes)} and {len(shapes)}",
            "names",
        )
    if body.get("packed"):
        raise RequestError("packed transfers are not supported here: send packed false", "packed")
    out = []
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        if not isinstance(name, str) or name not in state:
            raise RequestError(f"the served model has no tensor {name!r}", "names")
        try:
            kind = dtype_from_name(dtype if isinstance(dtype, str) else repr(dtype))
        except ValueError as exc:
            raise RequestError(f"{name}: {exc}", dtypes_key) from None
        if not isinstance(shape, list) or shape != list(state[name].shape):
            raise RequestError(
                f"{name}: shape {shape!r} sent, {list(state[name].shape)} served", "shapes"
            )
        out.append((name, kind))
    return out


@dataclass
class Update:
    """The tensors of one update route, checked: (name, dtype) pairs, and for CUDA IPC the
    handles they are read from (None: they arrive by broadcast)."""

    wanted: list[tuple[str, torch.dtype]]
    handles: list[dict[str, Any]] | None = None


class TransferReceiver:
    """The server's end of the group: join it, receive updates into the model, swap versions.

    Every method blocks (run them in a thread); one call at a time (`TransferError` 409 for a
    second)."""

    def __init__(
        self,
        engine: Engine,
        backend: str = "auto",
        allow: AddressPolicy | None = None,
        rendezvous_timeout: float = RENDEZVOUS_TIMEOUT,
    ) -> None:
        """Serve `engine`'s model; groups whose init names no backend use `backend` ("auto":
        nccl for a model on cuda, else gloo), at addresses `allow` accepts (default loopback),
        formed within `rendezvous_timeout` seconds. No group yet."""
        import threading

        self.engine = engine
        self.allow = allow or AddressPolicy.parse(None)
        self.rendezvous_timeout = rendezvous_timeout
        self.pending: _Rendezvous | None = None  # a group being formed
        if backend == "auto":
            backend = "nccl" if engine.device == "cuda" else "gloo"
        self.backend = backend
        self.group: WeightGroup | None = None
        self.ipc = False  # initialised for CUDA IPC updates (no group)
        self.updating = False  # between start and finish
        self.own_pause = False  # the update paused generation itself (mode wait)
        self.written = False  # this update has begun to write tensors
        self.broken: str | None = None  # why the weights are mixed, after a failed broadcast
        self._lock = threading.Lock()
        self._handoff = threading.Lock()  # guards `pending` and the group it hands over

    @contextlib.contextmanager
    def _one_at_a_time(self) -> Iterator[None]:
        if not self._lock.acquire(blocking=False):
            raise TransferError("another weight-transfer call is running: wait for it", 409)
        try:
            yield
        finally:
            self._lock.release()

    def init(self, info: dict[str, Any], backend: str | None, group_name: str | None) -> None:
        """Join the trainer's group as rank `rank_offset` (leaving any older group); no
        `group_name`: `group.group_name_for(master_port)`."""
        if self.backend == "ipc" and backend is None:
            self._init_ipc(info)
            return
        if "master_address" not in info:
            raise RequestError(
                "init_info names no master_address: a trainer sending CUDA IPC handles needs"
                " this server started with --transfer-backend ipc",
                "init_info",
            )
        address, port = _str(info, "master_address"), _int(info, "master_port", 1)
        self.allow.check(address)
        rank, world = _int(info, "rank_offset", 1), _int(info, "world_size", 2)
        if rank >= world:
            raise RequestError(f"rank_offset {rank} must be below world_size {world}")
        chosen = backend or self.backend
        with self._one_at_a_time(), self._handoff:
            self._cancel_pending()
            if self.group is not None:
                self.group.close()
                self.group = None
            pending = self.pending = _Rendezvous(
                address, port, rank, world, chosen, group_name, self.rendezvous_timeout
            )
        try:
            group = pending.wait()
        except TransferError:
            with self._handoff:
                if self.pending is pending:
                    self.pending = None
            raise
        with self._handoff:
            if self.pending is pending:
                self.pending, self.group = None, group
                return
        group.close()  # superseded between forming and here
        raise TransferError(f"the rendezvous at {pending.where} was cancelled by a later call", 409)

    def cancel_rendezvous(self) -> None:
        """Give up a group still forming (its init call answers 409)."""
        with self._handoff:
            self._cancel_pending()

    def _cancel_pending(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.cancel()

    def _init_ipc(self, info: dict[str, Any]) -> None:
        """Take updates by CUDA IPC (`atropos.local.ipc`): nothing to join, the GPU is shared."""
        if self.engine.device != "cuda":
            raise TransferError(
                f"ipc transfer needs the served model on a GPU; it is on {self.engine.device}", 400
            )
        if "master_address" in info:
            raise RequestError(
                "this server takes weights by CUDA IPC (--transfer-backend ipc), not over a"
                " process group: start the trainer with --transfer-backend ipc",
                "init_info",
            )
        self.cancel_rendezvous()
        with self._one_at_a_time():
            if self.group is not None:
                self.group.close()
                self.group = None
            self.ipc = True

    @property
    def ready(self) -> bool:
        """Whether an init route has run (a group joined, or IPC chosen)."""
        return self.group is not None or self.ipc

    def start(self, mode: str = "wait") -> None:
        """Begin an update: pause in `mode` unless a pause is already in force (then the
        update's end resumes)."""
        if not self.ready:
            raise TransferError("no weight-transfer group: call the init route first", 400)
        with self._one_at_a_time():
            self.broken = None
            if self.engine.paused is None:
                self.engine.pause(mode, TRANSFER_TIMEOUT)
                self.own_pause = True
            self.updating = True

    def check(self, body: dict[str, Any], dtypes_key: str) -> Update:
        """The tensors an update body names, checked against the served model (`parse_update`)
        before anything is paused or received; for IPC, with the handles they arrive by."""
        from atropos.local.ipc import IpcError, read_handles

        if not self.ready:
            raise TransferError("no weight-transfer group: call the init route first", 400)
        wanted = parse_update(body, dtypes_key, self.engine.model.state_dict())
        if not self.ipc:
            return Update(wanted)
        try:
            handles = read_handles(body.get("ipc_handles_pickled"))
        except IpcError as exc:
            raise RequestError(str(exc), "ipc_handles_pickled") from None
        if len(handles) != len(wanted):
            raise RequestError(
                f"{len(handles)} IPC handles for {len(wanted)} tensors", "ipc_handles_pickled"
            )
        return Update(wanted, handles)

    def receive(self, update: Update) -> int:
        """Receive the `check`ed tensors straight into the model; returns their number."""
        from atropos.local.group import GroupError
        from atropos.local.ipc import IpcError

        if not self.ready:
            raise TransferError("no weight-transfer group: call the init route first", 400)
        if not self.updating:
            raise TransferError("no update started: call /start_weight_update first", 400)
        with self._one_at_a_time():

            def write(model: Any) -> int:
                state = model.state_dict()
                self.written = True
                self._write(update, state)
                return len(update.wanted)

            try:
                return self.engine.swap_weights(write)
            except (GroupError, IpcError) as exc:
                self.broken = str(exc)
                raise TransferError(
                    f"{exc}; the weights are mixed until an update succeeds"
                ) from exc

    def _write(self, update: Update, state: dict[str, torch.Tensor]) -> None:
        """Each tensor into `state`: by broadcast over the group, or copied from the trainer's
        memory that its IPC handle maps."""
        if update.handles is None:
            group = self.group
            if group is None:
                raise TransferError("no weight-transfer group: call the init route first", 400)
            for name, dtype in update.wanted:
                group.receive_into(state[name], dtype)
            return
        import torch

        from atropos.local.ipc import open_tensor

        device = next(iter(state.values())).device
        for (name, _), handle in zip(update.wanted, update.handles, strict=True):
            state[name].data.copy_(open_tensor(handle, device))
        torch.cuda.synchronize(device)

    def finish(self, version: int | None) -> int:
        """End the update: the weights are `version` (None: one more); resume an own pause."""
        if not self.updating:
            raise TransferError("no update started: call /start_weight_update first", 400)
        if self.broken:
            raise TransferError(f"this update failed midway ({self.broken}): start again", 409)
        with self._one_at_a_time():
            self.updating = self.written = False
            new = self.engine.set_policy_version(version)
            if self.own_pause:
                self.own_pause = False
                self.engine.resume()
            return new

    def resume(self) -> None:
        """Lift a pause, unless an update has written tensors and not finished (or failed
        midway); an update started that wrote nothing is dropped."""
        if self.broken:
            raise TransferError(
                f"the last weight update failed midway ({self.broken}): send a whole update"
                " before resuming",
                409,
            )
        if self.updating and self.written:
            raise TransferError("a weight update is under way: finish it, then resume", 409)
        self.cancel_rendezvous()
        with self._one_at_a_time():
            self.updating = self.own_pause = False
            self.engine.resume()


class TransferRoutes:
    """The HTTP face of one `TransferReceiver` (the server wraps each handler for its key)."""

    def __init__(
        self,
        engine: Engine,
        backend: str = "auto",
        *,
        allow: AddressPolicy | None = None,
        rendezvous_timeout: float = RENDEZVOUS_TIMEOUT,
    ) -> None:
        """Answer for `engine` (the arguments: see `TransferReceiver`)."""
        self.engine = engine
        self.receiver = TransferReceiver(engine, backend, allow, rendezvous_timeout)
        self.session = False  # between SGLang's /begin_weight_update and /end_weight_update

    def routes(self) -> list[tuple[str, Handler, list[str]]]:
        """(path, handler, methods) of every route in the module docstring."""
        post, get = ["POST"], ["GET"]
        return [
            ("/init_weight_transfer_engine", self.init_vllm, post),
            ("/start_weight_update", self.start, post),
            ("/update_weights", self.update_vllm, post),
            ("/finish_weight_update", self.finish, post),
            ("/pause", self.pause_vllm, post),
            ("/resume", self.resume, post),
            ("/is_paused", self.is_paused, get),
            ("/get_world_size", self.world_size, get),
            ("/init_weights_update_group", self.init_sglang, post),
            ("/update_weights_from_distributed", self.update_sglang, post),
            ("/begin_weight_update", self.begin_sglang, post),
            ("/end_weight_update", self.end_sglang, post),
            ("/pause_generation", self.pause_sglang, post),
            ("/continue_generation", self.resume, post),
            ("/weights_checksum", self.checksum, get),
        ]

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except TransferError as exc:
            kind = _KINDS.get(exc.status, "")
            raise RequestError(exc.message, status=exc.status, kind=kind) from exc
        except TimeoutError as exc:
            raise RequestError(str(exc), status=504, kind="GatewayTimeoutError") from exc

    async def init_vllm(self, request: Request) -> Response:
        """vLLM's `POST /init_weight_transfer_engine {"init_info": {...}}`."""
        info = (await _body(request)).get("init_info")
        if not isinstance(info, dict):
            raise RequestError("init_info must be an object", "init_info")
        await self._run(self.receiver.init, info, None, None)
        return _ok("Weight transfer initialized")

    async def init_sglang(self, request: Request) -> Response:
        """SGLang's `POST /init_weights_update_group {master_address, ..., backend}`."""
        body = await _body(request)
        backend = _str(body, "backend", "nccl")
        if backend not in ("gloo", "nccl"):
            raise RequestError(f"backend must be gloo or nccl, got {backend!r}", "backend")
        name = _str(body, "group_name", "weight_update_group")
        await self._run(self.receiver.init, body, backend, name)
        return _ok("Succeeded to initialize custom process group.")

    async def start(self, request: Request) -> Response:
        """vLLM's `POST /start_weight_update` (`include_draft` is accepted and ignored)."""
        await _body(request)
        await self._run(self.receiver.start)
        return _ok("Weight update started")

    async def update_vllm(self, request: Request) -> Response:
        """vLLM's `POST /update_weights {"update_info": {names, dtype_names, shapes}}`; without
        a started update it starts and finishes one around the tensors (vLLM's older flow)."""
        info = (await _body(request)).get("update_info")
        if not isinstance(info, dict):
            raise RequestError("update_info must be an object", "update_info")
        wanted = await self._run(self.receiver.check, info, "dtype_names")
        whole = not self.receiver.updating
        if whole:
            await self._run(self.receiver.start)
        count = await self._run(self.receiver.receive, wanted)
        version = await self._run(self.receiver.finish, None) if whole else None
        return _ok(f"Weights updated ({count} tensors)", policy_version=version)

    async def update_sglang(self, request: Request) -> Response:
        """SGLang's `POST /update_weights_from_distributed`: start (aborting what runs with
        `abort_all_requests`), receive and finish; a numeric `weight_version` becomes the
        policy version."""
        body = await _body(request)
        version = _version(body.get("weight_version"), "weight_version")
        wanted = await self._run(self.receiver.check, body, "dtypes")
        await self._run(self.receiver.start, "abort" if body.get("abort_all_requests") else "wait")
        count = await self._run(self.receiver.receive, wanted)
        new = await self._run(self.receiver.finish, version)
        return _ok(f"Succeeded to update {count} parameters.", policy_version=new)

    async def begin_sglang(self, request: Request) -> Response:
        """SGLang's `POST /begin_weight_update {"selector": "all"}`: open a session (refused
        while one is open, as SGLang does)."""
        selector = _str(await _body(request), "selector", "all")
        if selector not in ("target", "draft", "all"):
            raise RequestError(
                f"selector must be target, draft or all, got {selector!r}", "selector"
            )
        if self.session:
            raise RequestError(
                "a weight-update session is already open: call /end_weight_update first"
            )
        self.session = True
        return _ok("Success")

    async def end_sglang(self, request: Request) -> Response:
        """SGLang's `POST /end_weight_update`: close the session (refused without one)."""
        await _body(request)
        if not self.session:
            raise RequestError("no weight-update session is open: call /begin_weight_update first")
        self.session = False
        return _ok("Success")

    async def finish(self, request: Request) -> Response:
        """vLLM's `POST /finish_weight_update`; ours takes `{"policy_version": N}` too."""
        version = _version((await _body(request)).get("policy_version"), "policy_version")
        new = await self._run(self.receiver.finish, version)
        return _ok("Weight update finished", policy_version=new)

    async def _pause(self, mode: str) -> Response:
        if mode not in PAUSE_MODES:
            raise RequestError(
                f"mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}", "mode"
            )
        held = await self._run(self.engine.pause, mode, TRANSFER_TIMEOUT)
        body = {"status": "paused", "success": True, "mode": mode, "num_paused_requests": held}
        return JSONResponse(body)

    async def pause_vllm(self, request: Request) -> Response:
        """vLLM's `POST /pause?mode=abort|wait|keep` (default abort, as vLLM's)."""
        query = request.query_params
        waiting = query.get("wait_for_inflight_requests", "").lower() == "true"
        return await self._pause(query.get("mode") or ("wait" if waiting else "abort"))

    async def pause_sglang(self, request: Request) -> Response:
        """SGLang's `POST /pause_generation {"mode": abort|retract|in_place}`."""
        mode = _str(await _body(request), "mode", "abort")
        if mode not in SGLANG_PAUSE:
            raise RequestError(f"mode must be abort, retract or in_place, got {mode!r}", "mode")
        return await self._pause(SGLANG_PAUSE[mode])

    async def resume(self, request: Request) -> Response:
        """vLLM's `POST /resume`, SGLang's `POST /continue_generation` (a body, when sent,
        must be a JSON object, as on every route)."""
        await _body(request)
        await self._run(self.receiver.resume)
        return JSONResponse({"status": "resumed", "success": True})

    async def is_paused(self, request: Request) -> Response:
        """vLLM's `GET /is_paused`."""
        return JSONResponse({"is_paused": self.engine.paused is not None})

    async def world_size(self, request: Request) -> Response:
        """vLLM's `GET /get_world_size`: one worker holds the model here."""
        return JSONResponse({"world_size": 1})

    async def checksum(self, request: Request) -> Response:
        """`GET /weights_checksum`: SHA-256 of the served base weights (between batches)."""
        digest = await asyncio.to_thread(self.engine.weights_checksum)
        return JSONResponse({"sha256": digest, "policy_version": self.engine.policy_version})


class _Rendezvous:
    """One group being formed, in a thread of its own so that the call waiting for it can be
    given up (`cancel`) or time out while torch's rendezvous still blocks; a group formed after
    that is closed at once."""

    def __init__(
        self,
        address: str,
        port: int,
        rank: int,
        world: int,
        backend: str,
        group_name: str | None,
        timeout: float,
    ) -> None:
        """Start joining the group at `address:port` (see `group.join_group`)."""
        import threading

        self.timeout = timeout
        self.where = f"{address}:{port}"
        self.done, self.cancelled = threading.Event(), threading.Event()
        self.group: WeightGroup | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        args = (address, port, rank, world, backend, group_name)
        threading.Thread(target=self._join, args=args, daemon=True).start()

    def _join(
        self, address: str, port: int, rank: int, world: int, backend: str, name: str | None
    ) -> None:
        from atropos.local.group import GroupError, join_group

        group = None
        try:
            group = join_group(
                address, port, rank, world, backend=backend, group_name=name,
                timeout=TRANSFER_TIMEOUT, rendezvous_timeout=self.timeout,
            )  # fmt: skip
        except GroupError as exc:
            self.error = str(exc)
        with self._lock:
            if self.cancelled.is_set() and group is not None:
                group.close()
            else:
                self.group = group
            self.done.set()

    def cancel(self) -> None:
        """Give up: the waiting call answers 409; a group formed later is closed."""
        with self._lock:
            self.cancelled.set()
            if self.group is not None:
                self.group.close()
                self.group = None

    def wait(self) -> WeightGroup:
        """The formed group; `TransferError` when it failed (500), was cancelled (409) or
        did not form within the timeout (504)."""
        deadline = self.timeout + 1.0  # the join's own timeout fires first, with its reason
        step = 0.05
        while not self.done.wait(step):
            deadline -= step
            if self.cancelled.is_set():
                break
            if deadline <= 0:
                self.cancel()
                break
        with self._lock:
            if self.cancelled.is_set():
                if deadline <= 0:
                    raise TransferError(
                        f"the weight-transfer group at {self.where} did not form within"
                        f" {self.timeout:g} s (--transfer-rendezvous-timeout)",
                        504,
                    )
                raise TransferError(
                    f"the rendezvous at {self.where} was cancelled by a later call", 409
                )
            group, self.group = self.group, None  # the caller's now: `cancel` leaves it be
            if group is None:  # the trainer's end never came, or went: a gateway's timeout
                raise TransferError(self.error or "the weight-transfer group did not form", 504)
            return group


_KINDS = {
    400: "BadRequestError",
    409: "ConflictError",
    500: "InternalServerError",
    504: "GatewayTimeoutError",
}
