"""The isolation each local provider promises, checked against the real thing (bwrap,
unshare, setpriv, prlimit): docs/sandbox.md's table."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from tests.sandbox.conftest import leftovers

from atropos.sandbox import SandboxError, SandboxSpec, _host, open_sandbox

PROVIDERS = ["bubblewrap", "process"]
needs_root = pytest.mark.skipif(not _host.IS_ROOT, reason="a dedicated uid per sandbox needs root")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _exec(
    provider: str, command: str, spec: SandboxSpec | None = None, timeout: float = 20
) -> Any:
    async with await open_sandbox(spec or SandboxSpec(), provider) as box:
        return await box.exec(command, timeout=timeout)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_network_is_off(provider: str, run_root: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        code = (
            f"import socket; socket.create_connection(('127.0.0.1', {port}), 3); print('reached')"
        )
        result = run(_exec(provider, f'python3 -c "{code}"'))
    finally:
        server.close()
    assert result.exit_code != 0 and b"reached" not in result.stdout, result


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_writes_outside_the_work_dir_fail(provider: str, run_root: Path) -> None:
    target = run_root / "outside.txt"
    result = run(
        _exec(
            provider,
            f"touch /etc/x; touch /usr/x; touch {target}; echo in > here.txt && cat here.txt",
        )
    )
    assert result.stdout == b"in\n"
    assert result.stderr.count(b"cannot touch") == 3, result.stderr
    assert not Path("/etc/x").exists() and not Path("/usr/x").exists() and not target.exists()


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_another_sandboxs_files_are_not_visible(provider: str, run_root: Path) -> None:
    async def scenario() -> Any:
        async with (
            await open_sandbox(SandboxSpec(), provider) as a,
            await open_sandbox(SandboxSpec(), provider) as b,
        ):
            await a.put("secret.txt", b"hidden")
            return await b.exec(f"cat {a.work}/secret.txt; ls {a.work}", timeout=10)

    result = run(scenario())
    assert (
        result.exit_code != 0 and b"hidden" not in result.stdout and b"secret" not in result.stdout
    )


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_unix_socket_outside_is_not_reachable(provider: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="atropos-sock-", dir="/tmp"))
    path = folder / "daemon.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen()
    path.chmod(0o660)  # like /var/run/docker.sock: owner and group only
    folder.chmod(0o755)
    try:
        code = f"import socket; socket.socket(socket.AF_UNIX).connect('{path}'); print('reached')"
        result = run(_exec(provider, f'python3 -c "{code}"'))
    finally:
        server.close()
        path.unlink()
        folder.rmdir()
    assert result.exit_code != 0 and b"reached" not in result.stdout, result


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_fork_bomb_is_contained(provider: str, run_root: Path) -> None:
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 500:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(30); os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    pass\n"
        "print(n)\n"
    )
    spec = SandboxSpec(pids=16, files={"bomb.py": bomb.encode()})

    async def scenario() -> tuple[Any, list[str], Any]:
        async with await open_sandbox(spec, provider) as box:
            result = await box.exec(["python3", "bomb.py"], timeout=20)
            after = await box.exec("echo alive", timeout=10)
            uid = box.uid
        return result, leftovers(run_root, [uid] if uid else []), after

    result, left, after = run(scenario())
    assert 0 < int(result.stdout) < 16, result
    assert after.stdout == b"alive\n"
    assert left == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_memory_hog_dies(provider: str, run_root: Path) -> None:
    spec = SandboxSpec(memory_bytes=256 << 20)
    result = run(_exec(provider, "python3 -c \"x = bytearray(1 << 30); print('got it')\"", spec))
    assert result.exit_code != 0 and b"got it" not in result.stdout
    assert b"MemoryError" in result.stderr


@pytest.mark.parametrize("provider", PROVIDERS)
def test_exec_timeout_kills_a_process_ignoring_sigterm(provider: str, run_root: Path) -> None:
    started = time.monotonic()
    result = run(_exec(provider, "trap '' TERM; echo up; sleep 100; echo never", timeout=0.5))
    assert result.timed_out and result.exit_code < 0 and result.stdout == b"up\n"
    assert time.monotonic() - started < 5


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_close_kills_everything_even_sigterm_ignorers(provider: str, run_root: Path) -> None:
    async def scenario() -> tuple[BaseException | None, list[str]]:
        box = await open_sandbox(SandboxSpec(), provider)
        await box.exec("setsid sh -c \"trap '' TERM; sleep 100\" >/dev/null 2>&1 &", timeout=5)
        running = asyncio.ensure_future(box.exec("trap '' TERM; sleep 100", timeout=60))
        await asyncio.sleep(0.3)
        await box.close()
        await box.close()  # idempotent
        try:
            await running
            error = None
        except SandboxError as caught:
            error = caught
        return error, leftovers(run_root, [box.uid] if box.uid else [])

    error, left = run(scenario())
    assert isinstance(error, SandboxError) and error.reason == "closed"
    assert left == []


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_cancellation_closes_the_sandbox(provider: str, run_root: Path) -> None:
    uids: list[int] = []

    async def rollout() -> None:
        async with await open_sandbox(SandboxSpec(), provider) as box:
            uids.append(box.uid or 0)
            await box.exec("sleep 100", timeout=60)

    async def scenario() -> None:
        task = asyncio.ensure_future(rollout())
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(scenario())
    assert leftovers(run_root, uids) == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_output_is_bounded(provider: str, run_root: Path) -> None:
    spec = SandboxSpec(output_bytes=1000)
    result = run(_exec(provider, "head -c 1000000 /dev/zero; echo tail >&2", spec))
    assert result.exit_code == 0 and result.truncated
    assert len(result.stdout) == 1000 and result.stderr == b"tail\n"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_put_and_get_files_and_folders(provider: str, run_root: Path, tmp_path: Path) -> None:
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "a.txt").write_text("A")
    (tmp_path / "local.bin").write_bytes(b"\x00\x01")

    async def scenario() -> tuple[Any, bytes, bytes, bytes]:
        async with await open_sandbox(
            SandboxSpec(files={"given.txt": b"from the spec"}), provider
        ) as box:
            await box.put("/work/data/x.txt", b"hello")
            await box.put("bin/local.bin", tmp_path / "local.bin")
            await box.put("tree", tmp_path / "tree")
            seen = await box.exec(
                "cat given.txt data/x.txt tree/sub/a.txt; echo made > out.txt", timeout=10
            )
            with pytest.raises(ValueError):
                await box.put("../escape", b"no")
            with pytest.raises(ValueError):
                await box.put("/etc/escape", b"no")
            with pytest.raises(FileNotFoundError):
                await box.get("missing")
            return (
                seen,
                await box.get("out.txt"),
                await box.get("bin/local.bin"),
                await box.get("tree"),
            )

    seen, out, local, tree = run(scenario())
    assert seen.stdout == b"from the spechelloA"
    assert out == b"made\n" and local == b"\x00\x01"
    with tarfile.open(fileobj=io.BytesIO(tree)) as tar:
        member = tar.extractfile("tree/sub/a.txt")
        assert member is not None and member.read() == b"A"


@needs_root
@pytest.mark.parametrize("provider", PROVIDERS)
def test_get_does_not_follow_a_planted_symlink(provider: str, run_root: Path) -> None:
    secret = run_root / "host-secret"
    secret.write_text("root only")
    secret.chmod(0o600)

    async def scenario() -> bytes:
        async with await open_sandbox(SandboxSpec(), provider) as box:
            await box.exec(f"ln -s {secret} link", timeout=5)
            return await box.get("link")

    archive = run(scenario())
    assert b"root only" not in archive


def test_unknown_providers_say_what_is_available(run_root: Path) -> None:
    with pytest.raises(SandboxError, match="'nope'.*bubblewrap, docker, process") as caught:
        run(open_sandbox(SandboxSpec(), "nope"))
    assert caught.value.reason == "unavailable"


def test_exec_after_close_and_after_ttl_is_a_sandbox_error(run_root: Path) -> None:
    async def scenario() -> None:
        box = await open_sandbox(SandboxSpec(ttl_seconds=0.2), "bubblewrap")
        await asyncio.sleep(0.3)
        with pytest.raises(SandboxError, match="expired"):
            await box.exec("true", timeout=5)
        await box.close()
        with pytest.raises(SandboxError, match="closed"):
            await box.exec("true", timeout=5)

    run(scenario())
    assert leftovers(run_root) == []


def test_a_start_that_fails_is_a_sandbox_error_and_leaves_nothing(
    run_root: Path, tmp_path: Path
) -> None:
    with pytest.raises(SandboxError) as caught:
        run(open_sandbox(SandboxSpec(root=tmp_path / "no-such-root"), "bubblewrap"))
    assert caught.value.reason == "start_failed"
    assert leftovers(run_root) == []
    assert os.listdir(run_root) == [] or not any(run_root.glob("owner-*/*"))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stdin_never_read_does_not_outlive_the_deadline(provider: str, run_root: Path) -> None:
    async def main() -> Any:
        async with await open_sandbox(SandboxSpec(), provider) as box:
            # 4 MiB fills the pipe long before the command (which never reads) ends
            return await box.exec("sleep 30", timeout=1, stdin=b"x" * (4 << 20))

    started = time.monotonic()
    result = run(main())
    assert result.timed_out and result.exit_code == -9
    assert time.monotonic() - started < 20  # the deadline (1 s), not the command (30 s)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_output_before_a_background_holder_is_kept(provider: str, run_root: Path) -> None:
    # a process that left the exec's group keeps the pipes open past the exec's end: what
    # the command wrote is still returned
    command = "echo before; setsid sleep 30 & echo after >&2"
    result = run(_exec(provider, command))
    assert result.exit_code == 0
    assert result.stdout == b"before\n" and result.stderr == b"after\n"
