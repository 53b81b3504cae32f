"""The spec's `mounts` and `profile`, and how a signalled command is reported, on the local
providers (bubblewrap, process) against the real thing; the spec's checks of both fields."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.sandbox.conftest import leftovers

from atropos.sandbox import SandboxError, SandboxSpec, _host, open_sandbox

PROVIDERS = ["bubblewrap", "process"]
needs_root = pytest.mark.skipif(not _host.IS_ROOT, reason="a dedicated uid per sandbox needs root")
READ_THEN_WRITE = "cat {path}/tool.txt; echo more >> {path}/tool.txt; echo write $?; touch {path}/new; echo new $?"  # noqa: E501


@pytest.fixture
def tool() -> Iterator[Path]:
    """A host folder to mount: world-readable (the sandbox's uid opens the bind's source),
    owned by us, not writable by others; under /tmp, whose path every uid may traverse."""
    top = Path(tempfile.mkdtemp(prefix="atropos-mount-test-", dir="/tmp"))
    folder = top / "tool"
    folder.mkdir()
    (folder / "tool.txt").write_text("from the host\n")
    for path in (top, folder):
        path.chmod(0o755)
    (folder / "tool.txt").chmod(0o644)
    yield folder
    shutil.rmtree(top, ignore_errors=True)


async def _exec(provider: str, spec: SandboxSpec, command: str) -> Any:
    async with await open_sandbox(spec, provider) as box:
        return await box.exec(command, timeout=20)


def test_bubblewrap_mounts_read_only_at_the_inside_path(run_root: Path, tool: Path) -> None:
    spec = SandboxSpec(mounts={"/opt/agent": tool})
    result = asyncio.run(_exec("bubblewrap", spec, READ_THEN_WRITE.format(path="/opt/agent")))
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "from the host" and lines[1] != "write 0" and lines[2] != "new 0", result
    assert b"Read-only file system" in result.stderr, result
    assert (tool / "tool.txt").read_text() == "from the host\n" and not (tool / "new").exists()


def test_a_mounted_single_file(run_root: Path, tool: Path) -> None:
    spec = SandboxSpec(mounts={"/opt/agent.txt": tool / "tool.txt"})
    result = asyncio.run(_exec("bubblewrap", spec, "cat /opt/agent.txt; echo x >> /opt/agent.txt"))
    assert result.stdout == b"from the host\n" and result.exit_code != 0, result


@needs_root
def test_process_takes_mounts_at_their_own_path(run_root: Path, tool: Path) -> None:
    spec = SandboxSpec(mounts={str(tool): tool})
    result = asyncio.run(_exec("process", spec, READ_THEN_WRITE.format(path=tool)))
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "from the host" and lines[1] != "write 0" and lines[2] != "new 0", result
    assert b"Permission denied" in result.stderr, result  # the sandbox's uid, not ours
    assert (tool / "tool.txt").read_text() == "from the host\n" and not (tool / "new").exists()


def test_process_refuses_a_mount_elsewhere(run_root: Path, tool: Path) -> None:
    with pytest.raises(SandboxError) as refused:
        asyncio.run(_exec("process", SandboxSpec(mounts={"/opt/agent": tool}), "true"))
    assert refused.value.reason == "unsupported" and "same path" in str(refused.value)
    assert not leftovers(run_root)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_task_profile_is_unsupported_locally(provider: str, run_root: Path) -> None:
    with pytest.raises(SandboxError) as refused:
        asyncio.run(_exec(provider, SandboxSpec(profile="task"), "true"))
    assert refused.value.reason == "unsupported" and "docker" in str(refused.value)
    assert not leftovers(run_root)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_signalled_command_reads_minus_the_signal(provider: str, run_root: Path) -> None:
    async def main() -> list[Any]:
        async with await open_sandbox(SandboxSpec(), provider) as box:
            return [
                await box.exec(["python3", "-c", "import os; os.kill(os.getpid(), 9)"], 20),
                await box.exec(["python3", "-c", "import os; os.kill(os.getpid(), 15)"], 20),
                await box.exec(["sh", "-c", "exit 3"], 20),
            ]

    killed, termed, three = asyncio.run(main())
    assert (killed.exit_code, termed.exit_code, three.exit_code) == (-9, -15, 3)
    assert not killed.timed_out


@pytest.mark.parametrize(
    ("mounts", "says"),
    [
        ({"opt/agent": "/usr"}, "must be absolute"),
        ({"/work": "/usr"}, "would hide the work dir"),
        ({"/": "/usr"}, "would hide the work dir"),
        ({"/work/tools": "/usr"}, "under the work dir"),
        ({"/work/../work/x": "/usr"}, "under the work dir"),
        ({"/opt/agent": "/no/such/folder"}, "does not exist"),
    ],
)
def test_bad_mounts_are_one_clear_error(mounts: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        SandboxSpec(mounts=mounts)  # type: ignore[arg-type]


def test_mounts_are_normalized_and_the_profile_checked() -> None:
    spec = SandboxSpec(mounts={"/opt//agent/": "/usr"}, workdir="/home/w")  # type: ignore[dict-item]
    assert spec.mounts == {"/opt/agent": Path("/usr")}
    assert SandboxSpec(mounts={"/home": Path(os.getcwd())}).mounts  # beside /work: fine
    with pytest.raises(ValueError, match="profile must be"):
        SandboxSpec(profile="open")  # type: ignore[arg-type]
