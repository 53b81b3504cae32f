"""Harness tasks: an instruction, the files the harness starts from, and a test command.

A `HarnessTask` comes from one of two sources (`load_tasks`):

- a JSONL file, one task a line: `{"instruction": str, "snapshot": path, "test": str}` with
  optional `"id"`, `"test_files"` ({path: text}, put in after the harness ends, so the harness
  never sees them) and `"reward_file"` (a path the test writes its reward to, a number: it is
  the score instead of the exit status). `snapshot` is a folder or a tarball (`.tar`,
  `.tar.gz`, `.tgz`), relative to the JSONL's folder; it becomes the repository the harness
  works in;
- `swe_patch`: the `swe_patch` environment's tasks (a file with an issue): the file is the
  repository, the issue the instruction, and its `check` code the test, run against the edited
  file.

The test runs in the repository after the harness, in the same sandbox: exit 0 scores 1.0,
any other 0.0 (or the reward file's number)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

__all__ = ["HarnessTask", "SWE_PATCH_DATA", "load_tasks", "swe_patch_tasks"]

SWE_PATCH_DATA = Path(__file__).resolve().parents[1] / "environments" / "data" / "swe_patch"


@dataclass(frozen=True)
class HarnessTask:
    """One task: `files` ({path relative to the repository: bytes}) are the repository."""

    id: str
    instruction: str
    test: str  # a shell command run in the repository after the harness
    files: Mapping[str, bytes] = field(default_factory=dict)
    test_files: Mapping[str, bytes] = field(default_factory=dict)  # put in after the harness
    reward_file: str | None = None  # written by the test: its number is the score


def load_tasks(source: str) -> list[HarnessTask]:
    """`swe_patch`, or the path of a JSONL of tasks (the module docstring has its fields)."""
    if source == "swe_patch":
        return swe_patch_tasks()
    path = Path(source)
    if not path.is_file():
        raise ValueError(
            f"--env.tasks {source!r}: not a file; give a JSONL of {{instruction, snapshot, "
            "test}} lines or 'swe_patch'"
        )
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            tasks.append(_task(json.loads(line), f"{path}:{number}", path.parent))
    if not tasks:
        raise ValueError(f"{path}: no tasks (one JSON object a line)")
    return tasks


def _task(row: Any, where: str, base: Path) -> HarnessTask:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a task is a JSON object, not {type(row).__name__}")
    missing = [k for k in ("instruction", "test") if not str(row.get(k) or "").strip()]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)} (needs instruction and test)")
    files: dict[str, bytes] = {}
    if row.get("snapshot"):
        files = snapshot_files(base / str(row["snapshot"]), where)
    tests = {str(k): str(v).encode() for k, v in (row.get("test_files") or {}).items()}
    return HarnessTask(
        id=str(row.get("id") or where),
        instruction=str(row["instruction"]),
        test=str(row["test"]),
        files=files,
        test_files=tests,
        reward_file=row.get("reward_file"),
    )


def snapshot_files(path: Path, where: str = "") -> dict[str, bytes]:
    """The regular files of a folder or tarball, by path relative to its top."""
    if path.is_dir():
        return {
            str(p.relative_to(path)): p.read_bytes()
            for p in sorted(path.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(path).parts
        }
    if path.is_file() and tarfile.is_tarfile(path):
        files = {}
        with tarfile.open(path) as archive:
            for member in archive.getmembers():
                name = PurePosixPath(member.name)
                if not member.isfile() or name.is_absolute() or ".." in name.parts:
                    continue
                extracted = archive.extractfile(member)
                if extracted is not None:
                    files[str(name).removeprefix("./")] = extracted.read()
        return files
    raise ValueError(f"{where}: snapshot {str(path)!r} is neither a folder nor a tarball")


def swe_patch_tasks(data: Path = SWE_PATCH_DATA) -> list[HarnessTask]:
    """The `swe_patch` tasks (train and test files) as harness tasks."""
    tasks = []
    for split in ("train", "test"):
        for line in (data / f"{split}.jsonl").read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                tasks.append(swe_patch_task(row))
    return tasks


def swe_patch_task(row: Mapping[str, Any]) -> HarnessTask:
    """One `swe_patch` row: its file, its issue, its `check` run against the edited file."""
    path = str(row["path"])
    module = PurePosixPath(path).stem
    check = f"import sys\nsys.path.insert(0, '.')\nfrom {module} import *  # noqa\n{row['check']}\n"
    return HarnessTask(
        id=str(row["id"]),
        instruction=(
            f"Fix this issue in `{path}` (edit the file in place; do not change its tests):\n\n"
            f"{row['issue']}"
        ),
        test="python3 ../verifier/check.py",
        files={path: str(row["code"]).encode()},
        test_files={"../verifier/check.py": check.encode()},
    )


def tarball(files: Mapping[str, bytes]) -> bytes:
    """`files` as an uncompressed tar (for tests and snapshots)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()
