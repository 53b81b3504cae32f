"""Append-only segment files that hold group bodies for the SQLite store.

Why not BLOBs in SQLite: a 100 KB body spans dozens of overflow pages, and deleting a consumed
batch frees every one of them through the WAL, which cost more than reading the batch. Here a
body is appended to the current segment file with one `write()` and SQLite records only where it
lies; consuming a group deletes a small row, and a segment file is unlinked once none of its
bodies is still needed.

Durability: the bytes are written before the SQLite commit that makes them visible, so a crash
between the two leaves unreferenced bytes, never a reference to missing ones. A `write()` sits
in the OS page cache, which survives the process being killed; with `fsync=True` the segment is
also fsynced before the commit, which survives a power cut.

Space: bodies whose commit fails (a refused request) are cut off the segment again (`undo`);
the current segment is emptied whenever no body in it is live, and an old one is unlinked as
soon as none is, so disk use follows the queue, not the traffic. Files are the owner's only
(0600, the directory 0700): bodies are training data.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

__all__ = ["SEGMENT_BYTES", "SegmentLog", "private_dir", "private_file"]

SEGMENT_BYTES = 64 * 2**20  # a new segment starts once the current one passes this size
_NAME = re.compile(r"^seg-(\d{8})\.log$")


class SegmentLog:
    """A directory of append-only segment files, with live-body counts for garbage collection."""

    def __init__(self, directory: Path, fsync: bool = False) -> None:
        self.directory = directory
        self.fsync = fsync
        private_dir(directory)
        self._live: Counter[int] = Counter()
        self._readers: dict[int, int] = {}
        existing = [int(m.group(1)) for p in directory.iterdir() if (m := _NAME.match(p.name))]
        # Never append to a segment from an earlier run: its tail may hold orphaned bytes.
        self.current = max(existing, default=0) + 1
        self._fd = self._open_for_append(self.current)
        self._size = 0

    def _path(self, segment: int) -> Path:
        return self.directory / f"seg-{segment:08d}.log"

    def _open_for_append(self, segment: int) -> int:
        fd = os.open(self._path(segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # whatever the umask, or the mode of a file left by an old version
        return fd

    def append(self, bodies: list[bytes]) -> list[tuple[int, int, int]]:
        """Write bodies in one call; return (segment, offset, length) for each.

        Until the caller commits their places and calls `track`, `undo` takes them back. A
        failed write takes back what it wrote, so offsets always match the file.
        """
        if self._size >= SEGMENT_BYTES:
            os.close(self._fd)
            if self.current not in self._live:  # every body in it consumed already
                self._unlink(self.current)
            self.current += 1
            self._fd = self._open_for_append(self.current)
            self._size = 0
        where = []
        offset = self._size
        for body in bodies:
            where.append((self.current, offset, len(body)))
            offset += len(body)
        data = b"".join(bodies)
        try:
            written = os.write(self._fd, data)
            while written < len(data):  # short writes are legal; finish the job
                written += os.write(self._fd, data[written:])
            if self.fsync:
                os.fsync(self._fd)
        except OSError:
            self._cut(self._size)
            raise
        self._size = offset
        return where

    def undo(self, places: list[tuple[int, int, int]]) -> None:
        """Take back bodies `append` just wrote whose commit failed: their bytes leave the disk."""
        if places and places[0][0] == self.current:
            self._cut(min(self._size, places[0][1]))

    def _cut(self, size: int) -> None:
        """Truncate the current segment to `size` bytes (best effort: on failure the bytes stay,
        unreferenced, and the next append starts after them)."""
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            self._size = os.fstat(self._fd).st_size
        else:
            self._size = size

    def read(self, segment: int, offset: int, length: int) -> bytes:
        """The body at this place."""
        fd = self._readers.get(segment)
        if fd is None:
            fd = self._readers[segment] = os.open(self._path(segment), os.O_RDONLY)
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise OSError(f"segment {segment} is shorter than the store says (offset {offset})")
        return data

    def track(self, segment: int, count: int = 1) -> None:
        """Note that `count` more bodies in `segment` are referenced."""
        self._live[segment] += count

    def release(self, segment: int, count: int = 1) -> None:
        """Note that `count` bodies in `segment` are no longer needed; unlink it when empty."""
        self._live[segment] -= count
        if self._live[segment] <= 0:
            del self._live[segment]
            if segment != self.current:
                self._unlink(segment)
            else:
                self._cut(0)

    def collect(self) -> None:
        """Unlink every old segment that no body references (after a restart)."""
        for p in self.directory.iterdir():
            m = _NAME.match(p.name)
            if m and int(m.group(1)) != self.current and int(m.group(1)) not in self._live:
                self._unlink(int(m.group(1)))

    def _unlink(self, segment: int) -> None:
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)
        self._path(segment).unlink(missing_ok=True)

    def clear(self) -> None:
        """Forget every body (reset): unlink all segments and start a fresh one."""
        self._live.clear()
        os.close(self._fd)
        for segment in list(self._readers):
            self._unlink(segment)
        self.collect()
        self._unlink(self.current)
        self._fd = self._open_for_append(self.current)
        self._size = 0

    def usage(self) -> int:
        """Bytes the segment files hold on disk (allocated blocks)."""
        return sum(
            p.stat().st_blocks * 512 for p in self.directory.iterdir() if _NAME.match(p.name)
        )

    def close(self) -> None:
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()
        os.close(self._fd)


def private_dir(directory: Path, own: bool = True) -> None:
    """Create `directory` and its missing parents readable by their owner only (0700, whatever
    the umask); with `own`, make an existing `directory` 0700 too. Existing parents (a shared
    /tmp) are left as they are."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)
    if own:
        os.chmod(directory, 0o700)


def private_file(path: Path) -> None:
    """Create `path` if missing and make it readable and writable by its owner only (0600)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
