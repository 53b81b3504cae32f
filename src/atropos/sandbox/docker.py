"""The `docker` provider: one container per sandbox on a Docker engine (the Engine API on its
Unix socket, `DOCKER_HOST`), every exec an Engine exec in it.

The container: the spec's local image (never pulled: an absent image is one
`SandboxError("image_missing")` naming the command that builds a stand-in), `docker-init`
running a sleep as PID 1 (it reaps orphans; the sleep ends at `ttl_seconds` + 60 s, which stops
the container whatever runs in it), `NetworkMode: none` (only `lo`), a read-only root, a tmpfs
`/tmp`, and the work dir on a tmpfs volume of its own (a volume so that the archive endpoints
reach it; removed with the container). Limits are the container's cgroup: `memory_bytes` is
memory + swap of the whole sandbox (not RLIMIT_AS per process as on the local providers: the
kernel's OOM killer ends a process past it), `pids` the tasks of the whole sandbox, `cpus` cores
(NanoCpus: docker is the provider that caps cores), `disk_bytes` the size of the work dir's and
`/tmp`'s tmpfs each and RLIMIT_FSIZE, `cpu_seconds` RLIMIT_CPU per process. All capabilities
are dropped, no-new-privileges is set, the user is `spec.user` (else the image's).

The work dir starts empty (the image's content at that path is hidden); it belongs to
`spec.user` when that is a number (`uid` or `uid:gid`), else it is mode 1777. Files put in
belong to the container's user (`spec.user`'s numbers, else `copyUIDGID`). That is the
"locked" profile; `profile="task"` keeps the image's own work dir (no volume), a writable root
(the container's layer) and Docker's default capabilities, and changes nothing else.
`spec.mounts` are read-only bind mounts in both.

A start past its deadline never orphans a container: the create request is shielded (once
sent, the engine may make the container whether we wait or not), and `close()` waits up to
`CREATE_WAIT` for its answer and removes what it made; a relay still starting likewise.

An exec past its deadline has its process tree SIGSTOPped then SIGKILLed from the host (the
engine gives its host pid; this needs root, as the tests' engine does), else by a `kill` exec'd
in the container as the spec's user; it reports -9 and `timed_out`. A process that left the
tree (a double fork re-parents it to PID 1) lives until `close()`. The engine reports a signal
as 128 + n; that is returned as -n like the other providers (an `exit 130` reads as -2).

Every container is labelled `atropos.sandbox=1` and `atropos.owner=owner-<pid>-<start time>`
(the local providers' owner label); the first docker sandbox of a process removes the
containers whose owner is dead (`sweep_docker`), as `atropos.sandbox.sweep()` also does.
The engine is assumed to run on this machine (a Unix socket): owners are this machine's pids.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import math
import os
import re
import signal
import tarfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from atropos.images import ImageMissing
from atropos.sandbox import _host
from atropos.sandbox._engine import Engine, EngineError, Output, demux, engine_socket, quoted
from atropos.sandbox._local import BASE_ENV
from atropos.sandbox.relay import Relay
from atropos.sandbox.spec import (
    ClosesOnExit,
    ExecResult,
    SandboxError,
    SandboxSpec,
    inside_url,
    model_target,
    signal_status,
)

LABEL, OWNER = "atropos.sandbox", "atropos.owner"
NEVER = 2**31 - 1  # seconds: the container's sleep without a ttl
RELAY_UID = 65534  # nobody: the model relay's uid on the host once it listens
CREATE_WAIT = 60.0  # seconds close() waits for a create a start deadline left in flight
# an exec's exit codes that can mean its container stopped under it (every process killed,
# or the engine could not start the process in a container whose task is gone); an exec
# ending with one of them is checked against the container (`_alive`)
ENDED_BY_ENGINE = frozenset({-signal.SIGKILL, 126, 127})
_ids = itertools.count()
_swept: set[str] = set()


class DockerSandbox(ClosesOnExit):
    """A sandbox in a container of its own; `start()` makes it, `close()` removes it."""

    provider = "docker"

    def __init__(self, spec: SandboxSpec) -> None:
        if spec.image is None:
            raise SandboxError(
                "unsupported", "the docker provider needs spec.image (a local image)"
            )
        if spec.root is not None:
            raise SandboxError("unsupported", "docker takes spec.image, not spec.root")
        self.spec = spec
        self.network_mode = self._network_mode()
        # a bare uid runs with gid 0 in docker: give it its own group, as the work dir has
        self.user = f"{spec.user}:{spec.user}" if (spec.user or "").isdigit() else spec.user or ""
        try:
            self.engine = Engine(engine_socket())
        except EngineError as error:
            raise SandboxError("unavailable", error.message) from error
        self.owner = _host.owner_label()
        self.name = f"atropos-{os.getpid()}-{next(_ids)}-{uuid.uuid4().hex[:6]}"
        self.id: str | None = None
        self.relay: Relay | None = None  # model-only
        # requests that made something on the engine or host, left to finish when a start
        # deadline passes, so that close() removes what they made (never orphaned)
        self.creating: asyncio.Future[Any] | None = None
        self.relaying: asyncio.Future[Relay] | None = None
        self.started = 0.0
        self.closed = False

    def _network_mode(self) -> str:
        """The container's network for `spec.network`: "none" (only lo) for both policies;
        model-only adds a relay listening on that lo once the container runs (`_relay`)."""
        if self.spec.network == "model-only" and not _host.IS_ROOT:
            raise SandboxError(
                "unsupported",
                "network='model-only' on docker needs root (the relay joins the container's "
                "network namespace from this machine); run as root or use network='none'",
            )
        return "none"

    @property
    def model_url(self) -> str | None:
        """The rollout proxy's URL inside the container (model-only; None otherwise)."""
        return None if self.spec.model_url is None else inside_url(self.spec.model_url)

    async def _relay(self) -> None:
        """Model-only: a relay (atropos.sandbox.relay) listening on 127.0.0.1:PORT in the
        container's network namespace, forwarding to `spec.model_url` on this machine."""
        assert self.spec.model_url is not None and self.id is not None
        info = await self.engine.request("GET", f"/containers/{self.id}/json")
        namespace = f"/proc/{info.json()['State']['Pid']}/ns/net"
        host, port, _ = model_target(self.spec.model_url)
        self.relaying = asyncio.ensure_future(
            asyncio.to_thread(
                Relay, (host, port), port, RELAY_UID, 30.0, namespace, owner=self.owner
            )
        )
        self.relay = await asyncio.shield(self.relaying)

    async def start(self, timeout: float = 30.0) -> DockerSandbox:
        try:
            await asyncio.wait_for(self._start(), timeout)
        except BaseException as error:
            await self.close()
            if isinstance(error, asyncio.TimeoutError):
                raise SandboxError("start_timeout", f"not started in {timeout} s") from error
            if isinstance(error, EngineError):
                raise SandboxError("start_failed", str(error)) from error
            if isinstance(error, (OSError, ValueError)):
                raise SandboxError("start_failed", str(error)) from error
            raise
        self.started = time.monotonic()
        return self

    async def _start(self) -> None:
        if self.engine.socket not in _swept:
            _swept.add(self.engine.socket)
            await sweep_docker(self.engine)
        # shielded: once sent, the engine may make the container whether or not we wait, so a
        # start deadline leaves the request to finish and close() removes what it made
        self.creating = asyncio.ensure_future(
            self.engine.request(
                "POST", "/containers/create", {"name": self.name}, body=self.config()
            )
        )
        try:
            created = await asyncio.shield(self.creating)
        except EngineError as error:
            if error.status == 404 and "image" in error.message.lower():
                raise SandboxError(
                    "image_missing", str(ImageMissing(str(self.spec.image)))
                ) from None
            raise
        self.id = created.json()["Id"]
        await self.engine.request("POST", f"/containers/{self.id}/start")
        if self.spec.model_url is not None:
            await self._relay()
        for path, data in self.spec.files.items():
            await self.put(path, data)

    def config(self) -> dict[str, Any]:
        """The container's create body (docs/sandbox.md: how each limit maps)."""
        spec = self.spec
        ttl = NEVER if spec.ttl_seconds is None else math.ceil(spec.ttl_seconds) + 60
        size = f",size={spec.disk_bytes}" if spec.disk_bytes is not None else ""
        uid = re.fullmatch(r"(\d+)(?::(\d+))?", spec.user or "")
        owner = f"uid={uid[1]},gid={uid[2] or uid[1]},mode=0700" if uid else "mode=1777"
        ulimits = [{"Name": "core", "Soft": 0, "Hard": 0}]
        if spec.disk_bytes is not None:
            ulimits.append({"Name": "fsize", "Soft": spec.disk_bytes, "Hard": spec.disk_bytes})
        if spec.cpu_seconds is not None:
            ulimits.append({"Name": "cpu", "Soft": spec.cpu_seconds, "Hard": spec.cpu_seconds})
        work = {
            "Type": "volume",
            "Target": spec.workdir,
            "VolumeOptions": {
                "NoCopy": True,
                "Labels": {LABEL: "1", OWNER: self.owner},
                "DriverConfig": {
                    "Name": "local",
                    "Options": {"type": "tmpfs", "device": "tmpfs", "o": f"{owner}{size}"},
                },
            },
        }
        mounts = [
            {"Type": "bind", "Source": str(source), "Target": inside, "ReadOnly": True}
            for inside, source in spec.mounts.items()
        ]
        locked = spec.profile == "locked"
        host: dict[str, Any] = {
            "NetworkMode": self.network_mode,
            "ReadonlyRootfs": locked,  # task: the container's own layer, gone with it
            "Tmpfs": {"/tmp": f"rw,nosuid,nodev,exec,mode=1777{size}"},
            "Mounts": [work, *mounts] if locked else mounts,  # task: the image's work dir
            "SecurityOpt": ["no-new-privileges"],
            "Init": True,
            "AutoRemove": False,
            "Ulimits": ulimits,
        }
        if locked:
            host["CapDrop"] = ["ALL"]  # task: Docker's default capabilities
        if spec.memory_bytes is not None:
            host["Memory"] = host["MemorySwap"] = spec.memory_bytes
        if spec.pids is not None:
            host["PidsLimit"] = spec.pids + 2  # docker-init and its sleep
        if spec.cpus is not None:
            host["NanoCpus"] = int(spec.cpus * 1e9)
        return {
            "Image": spec.image,
            "Entrypoint": ["sleep", str(ttl)],
            "Cmd": [],
            "User": self.user,
            "Env": _env_list({**BASE_ENV, "HOME": spec.workdir, **self._model_env(), **spec.env}),
            "WorkingDir": spec.workdir,
            "Labels": {LABEL: "1", OWNER: self.owner},
            "NetworkDisabled": self.network_mode == "none",
            "HostConfig": host,
        }

    async def exec(
        self,
        command: Sequence[str] | str,
        timeout: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        self._check_usable()
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        body = {
            "AttachStdin": stdin is not None,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Cmd": argv,
            "Env": _env_list(env or {}),
            "WorkingDir": self.spec.workdir,
            "User": self.user,
        }
        try:
            made = await self.engine.request("POST", f"/containers/{self.id}/exec", body=body)
            exec_id = made.json()["Id"]
            reader, writer = await self.engine.hijack(
                f"/exec/{exec_id}/start", {"Detach": False, "Tty": False}
            )
        except EngineError as error:
            raise await self._exec_failure(error, f"exec {argv[:1]}") from error
        try:
            return await self._run(exec_id, reader, writer, stdin, timeout)
        except EngineError as error:
            raise await self._exec_failure(error, f"exec {argv[:1]}") from error
        finally:
            writer.close()

    async def _run(
        self,
        exec_id: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        stdin: bytes | None,
        timeout: float,
    ) -> ExecResult:
        deadline = time.monotonic() + timeout
        kept = Output(self.spec.output_bytes)
        output = asyncio.ensure_future(demux(reader, kept))
        feeding = asyncio.ensure_future(_feed(writer, stdin))
        try:
            timed_out, pause = False, 0.25
            while not output.done():
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    await self._kill(exec_id)
                    break
                await asyncio.wait([output], timeout=min(pause, left))
                if not output.done() and not (await self._inspect(exec_id))["Running"]:
                    break  # exited; a background process may hold the stream open
                pause = min(pause * 2, 1.0)
            await asyncio.wait([output], timeout=0.5 if not output.done() else None)
            info = await self._finished(exec_id)
        finally:
            for task in (output, feeding):
                task.cancel()
        if self.closed:
            raise SandboxError("closed", "the sandbox closed while an exec ran")
        code = info.get("ExitCode")
        code = -signal.SIGKILL if timed_out or code is None else signal_status(code)
        if code in ENDED_BY_ENGINE and not timed_out and not await self._alive():
            raise SandboxError("dead", "the sandbox's container stopped while an exec ran")
        return ExecResult(code, bytes(kept.stdout), bytes(kept.stderr), timed_out, kept.truncated)

    async def _inspect(self, exec_id: str) -> dict[str, Any]:
        info: dict[str, Any] = (await self.engine.request("GET", f"/exec/{exec_id}/json")).json()
        return info

    async def _finished(self, exec_id: str, wait: float = 5.0) -> dict[str, Any]:
        """The exec's inspect once the engine has seen it exit (within `wait`)."""
        deadline, pause = time.monotonic() + wait, 0.001
        while True:
            try:
                info = await self._inspect(exec_id)
            except EngineError:
                if self.closed:
                    return {}
                raise
            if not info["Running"] or time.monotonic() > deadline:
                return info
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)

    async def _kill(self, exec_id: str) -> None:
        """SIGKILL the exec's process tree: from the host as root, else from inside."""
        pid = (await self._inspect(exec_id)).get("Pid") or 0
        if pid <= 0:
            return
        if _host.IS_ROOT:
            await asyncio.to_thread(kill_tree, pid)
            return
        inner = [p for p in map(_pid_inside, tree_of(pid)) if p]
        if inner:
            body = {"Cmd": ["kill", "-KILL", *map(str, inner)], "User": self.user}
            made = await self.engine.request("POST", f"/containers/{self.id}/exec", body=body)
            made_id = made.json()["Id"]
            await self.engine.request("POST", f"/exec/{made_id}/start", body={"Detach": True})

    def _check_usable(self) -> None:
        if self.closed:
            raise SandboxError("closed", "the sandbox is closed")
        ttl = self.spec.ttl_seconds
        if ttl is not None and self.started and time.monotonic() - self.started > ttl:
            raise SandboxError("expired", f"the sandbox outlived its time to live ({ttl} s)")

    async def _exec_failure(self, error: EngineError, what: str) -> Exception:
        """`_engine_failure`, where an exec the engine no longer knows is asked about: the
        engine drops a container's execs once the container stops, so a 404 for the exec
        while the container is not alive is the sandbox dying, not a failed start."""
        lost = error.status == 404 and "no such exec" in error.message.lower()
        if lost and not self.closed and not await self._alive():
            return SandboxError("dead", f"the sandbox's container stopped during {what}")
        return self._engine_failure(error, what)

    async def _alive(self) -> bool:
        """Whether the container still has its processes: the engine's `top` of it (it
        lists the container's process 1 while the container lives, and fails once its
        task is gone, before the container's own state may say so). False where the
        engine cannot say."""
        try:
            top = await self.engine.request("GET", f"/containers/{self.id}/top")
        except EngineError:
            return False
        return bool((top.json() or {}).get("Processes"))

    def _engine_failure(self, error: EngineError, what: str) -> Exception:
        if self.closed:
            return SandboxError("closed", f"the sandbox closed during {what}")
        if _gone(error):
            return SandboxError("dead", f"the sandbox's container is gone: {error.message}")
        return SandboxError("dead" if error.status == 0 else "start_failed", f"{what}: {error}")

    async def put(self, path: str, data: bytes | Path) -> None:
        """Write a file (bytes or a local file) or a local folder at `path` in the work dir."""
        self._check_usable()
        name = _host.inside(self.spec.workdir, path)
        ids = re.fullmatch(r"(\d+):(\d+)", self.user)
        owner = (int(ids[1]), int(ids[2])) if ids else None
        archive = _owned_tar(_host.tar_of(name, data), owner)
        query = {"path": self.spec.workdir}
        if owner is None:
            query["copyUIDGID"] = "true"  # the container's user, looked up in its passwd
        try:
            await self.engine.request("PUT", f"/containers/{self.id}/archive", query, data=archive)
        except EngineError as error:
            if _gone(error):
                raise self._engine_failure(error, f"put {path!r}") from error
            raise OSError(f"put {path!r}: {error.message}") from error

    async def get(self, path: str) -> bytes:
        """A file's bytes, or a folder as a tar (names relative to the work dir)."""
        self._check_usable()
        name = _host.inside(self.spec.workdir, path)
        where = self.spec.workdir.rstrip("/") + ("" if name == "." else "/" + name)
        try:
            got = await self.engine.request(
                "GET", f"/containers/{self.id}/archive", {"path": where}
            )
        except EngineError as error:
            if error.status == 404 and not _gone(error):
                raise FileNotFoundError(f"get {path!r}: {error.message}") from error
            raise self._engine_failure(error, f"get {path!r}") from error
        if name == ".":
            return _reroot(got.body)
        return _host.single_file(got.body, Path(name).name)

    async def close(self) -> None:
        """Kill and remove the container and its work volume (idempotent; runs to the end
        even when the caller is cancelled)."""
        if self.closed:
            return
        self.closed = True
        await asyncio.shield(self._remove())

    def _model_env(self) -> dict[str, str]:
        return {} if self.model_url is None else {"ATROPOS_MODEL_URL": self.model_url}

    async def _remove(self) -> None:
        if self.relaying is not None:  # a relay still starting: wait for it, then end it
            with contextlib.suppress(Exception):
                self.relay = await self.relaying
        if self.relay is not None:
            await asyncio.to_thread(self.relay.close)
        if self.creating is not None and self.id is None:  # a create the engine may still do
            with contextlib.suppress(Exception):
                made = await asyncio.wait_for(asyncio.shield(self.creating), CREATE_WAIT)
                self.id = made.json()["Id"]
        with contextlib.suppress(EngineError):
            await self.engine.request(
                "DELETE",
                f"/containers/{quoted(self.id or self.name)}",
                {"force": "true", "v": "true"},
                ok=(204, 404),
            )

    def __repr__(self) -> str:
        return f"<DockerSandbox {self.name} {self.spec.image}>"


def _gone(error: EngineError) -> bool:
    """Whether the engine's error says the container is gone or stopped (or the engine is)."""
    said = error.message.lower()
    return error.status == 0 or "no such container" in said or "is not running" in said


async def _feed(writer: asyncio.StreamWriter, stdin: bytes | None) -> None:
    """Write the exec's stdin, then half-close (the command reads EOF)."""
    if stdin is None:
        return
    with contextlib.suppress(OSError):
        writer.write(stdin)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


def _owned_tar(archive: bytes, owner: tuple[int, int] | None) -> bytes:
    """The tar with an entry for each parent folder it implies (else the engine makes them
    root's), every entry owned by `owner` (uid, gid) when given."""
    source, target = io.BytesIO(archive), io.BytesIO()
    with tarfile.open(fileobj=source) as tar_in, tarfile.open(fileobj=target, mode="w") as out:
        members = tar_in.getmembers()
        named = {member.name.rstrip("/") for member in members}
        parents = {str(p) for m in members for p in Path(m.name).parents if str(p) != "."}
        folders = [tarfile.TarInfo(parent) for parent in sorted(parents - named)]
        for folder in folders:
            folder.type, folder.mode, folder.mtime = tarfile.DIRTYPE, 0o755, int(time.time())
        for member in folders + members:
            if owner is not None:
                member.uid, member.gid = owner
                member.uname = member.gname = ""
            out.addfile(member, tar_in.extractfile(member) if member.isfile() else None)
    return target.getvalue()


def _reroot(archive: bytes) -> bytes:
    """The engine's tar of the work dir (names `work/...`) with names relative to it (`./...`),
    as the local providers give it."""
    source, target = io.BytesIO(archive), io.BytesIO()
    with tarfile.open(fileobj=source) as tar_in, tarfile.open(fileobj=target, mode="w") as out:
        for member in tar_in:
            rest = member.name.split("/", 1)[1] if "/" in member.name else ""
            member.name = f"./{rest}" if rest else "."
            out.addfile(member, tar_in.extractfile(member) if member.isfile() else None)
    return target.getvalue()


def _env_list(env: Mapping[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in env.items()]


async def sweep_docker(engine: Engine | None = None) -> int:
    """Remove the sandbox containers whose owner process is dead, with their work volumes
    (and such volumes whose container went without them); returns how many containers. The
    first docker sandbox of a process runs it on its engine."""
    engine = Engine(engine_socket()) if engine is None else engine
    await asyncio.to_thread(_host.sweep_relays)  # model-only relays (they run as nobody)
    filters = {"filters": json.dumps({"label": [f"{LABEL}=1"]})}
    listed = (await engine.request("GET", "/containers/json", {"all": "1", **filters})).json()
    dead = [c["Id"] for c in listed if not _host.owner_alive(c["Labels"].get(OWNER, ""))]
    for container in dead:
        await engine.request(
            "DELETE", f"/containers/{container}", {"force": "true", "v": "true"}, ok=(204, 404)
        )
    volumes = (await engine.request("GET", "/volumes", filters)).json().get("Volumes") or []
    for volume in volumes:
        if not _host.owner_alive((volume.get("Labels") or {}).get(OWNER, "")):
            await engine.request("DELETE", f"/volumes/{quoted(volume['Name'])}", ok=(204, 404, 409))
    return len(dead)


def tree_of(pid: int) -> list[int]:
    """`pid` and its live descendants (parents first), from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
                if fields[0] not in (b"Z", b"X"):
                    children.setdefault(int(fields[1]), []).append(int(name))
    tree, index = [pid], 0
    while index < len(tree):
        tree += children.get(tree[index], [])
        index += 1
    return tree


def kill_tree(pid: int, wait: float = 5.0) -> None:
    """SIGSTOP `pid`'s tree until no new process appears (a stopped process cannot fork, so
    none escapes by re-parenting), then SIGKILL all of it; repeated until none is left."""
    deadline, seen = time.monotonic() + wait, set()
    while time.monotonic() < deadline:
        tree = [p for p in tree_of(pid) if p not in seen]
        if not tree:
            break
        for each in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGSTOP)
        seen.update(tree)
    while time.monotonic() < deadline:
        for each in seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGKILL)
        seen = {p for p in seen if _alive(p)}
        if not seen:
            return
        time.sleep(0.005)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _pid_inside(pid: int) -> int | None:
    """The pid of host process `pid` in its own PID namespace (its last NSpid)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return None
