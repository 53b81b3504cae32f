"""What `atropos local serve` lets a caller point it at: files and rendezvous addresses.

- `PathPolicy`: LoRA adapters and reload checkpoints are read only from under the directories
  given by ``--allowed-paths`` (default: the server's working directory and the system temp
  directory), checked after resolving symlinks. A path outside them gets one message whatever
  it names, so the answer never tells whether an arbitrary file exists; a path no file system
  could hold (too long, a NUL, a component over 255 bytes) is a 400 before anything is opened.
- `AddressPolicy`: a weight-transfer rendezvous (`master_address`) must be one of the
  addresses given by ``--transfer-allow`` (default: loopback, 127.0.0.0/8, ::1 and
  ``localhost``), or the server would join a group anyone names and take its weights from it.

>>> AddressPolicy.parse("").allows("127.0.0.5"), AddressPolicy.parse("").allows("10.0.0.1")
(True, False)
>>> AddressPolicy.parse("10.0.0.0/8,trainer-1").allows("trainer-1")
True
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

from atropos.local.protocol import RequestError

MAX_PATH = 4096  # PATH_MAX on Linux
MAX_NAME = 255  # NAME_MAX, in bytes
LOOPBACK = "127.0.0.0/8,::1,localhost"
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def split_list(text: str | Iterable[str] | None) -> list[str]:
    """`"a, b"` or `["a", "b,c"]` -> the non-empty items."""
    if text is None:
        return []
    parts = [text] if isinstance(text, str) else list(text)
    return [item.strip() for part in parts for item in part.split(",") if item.strip()]


def default_allowed_paths() -> list[str]:
    """The working directory and the system temp directory."""
    return [os.getcwd(), tempfile.gettempdir()]


class PathPolicy:
    """The directories a request's file path must lie under (see the module docstring)."""

    def __init__(self, roots: Iterable[str] | None = None) -> None:
        """Allow `roots` (None: `default_allowed_paths()`), each resolved once here."""
        given = default_allowed_paths() if roots is None else list(roots)
        self.roots = [os.path.realpath(os.path.expanduser(root)) for root in given]

    def check(self, path: str, field: str) -> str:
        """The resolved `path` when it lies under an allowed directory; `RequestError` 400
        for a malformed path, 403 (one message) for any other."""
        if len(path) > MAX_PATH or "\x00" in path:
            raise RequestError(f"{field} is not a valid path", field, kind="InvalidUserInput")
        try:
            encoded = os.fsencode(path)
        except UnicodeError:
            raise RequestError(f"{field} is not a valid path", field) from None
        if any(len(part) > MAX_NAME for part in encoded.split(b"/")):
            raise RequestError(f"{field} is not a valid path", field, kind="InvalidUserInput")
        try:
            resolved = os.path.realpath(os.path.expanduser(path))
        except (OSError, ValueError):
            raise RequestError(f"{field} is not a valid path", field) from None
        if not any(_under(resolved, root) for root in self.roots):
            raise RequestError(
                f"{field} is not under a directory this server reads from (--allowed-paths)",
                field,
                status=403,
                kind="PermissionDenied",
            )
        return resolved


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class AddressPolicy:
    """The rendezvous addresses a server accepts: networks, and host names taken literally."""

    networks: tuple[Network, ...]
    names: frozenset[str]

    @classmethod
    def parse(cls, text: str | Iterable[str] | None) -> AddressPolicy:
        """From ``--transfer-allow``'s value (addresses, CIDR networks or host names; empty or
        None: loopback only); ValueError on an entry that is none of them."""
        networks: list[Network] = []
        names: set[str] = set()
        for item in split_list(text) or split_list(LOOPBACK):
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                if not item.replace("-", "").replace(".", "").replace("_", "").isalnum():
                    raise ValueError(
                        f"{item!r} is not an address, a network or a host name"
                    ) from None
                names.add(item.lower())
        return cls(tuple(networks), frozenset(names))

    def allows(self, address: str) -> bool:
        """Whether `address` (an IP literal, or a host name compared as written, never
        resolved) is one this server accepts."""
        try:
            ip = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            return address.lower() in self.names
        return any(ip.version == net.version and ip in net for net in self.networks)

    def check(self, address: str, field: str = "master_address") -> None:
        """`RequestError` 403 naming the flag unless `allows(address)`."""
        if not self.allows(address):
            raise RequestError(
                f"{field} {address[:100]!r} is not an address this server accepts for a weight"
                " transfer: start it with --transfer-allow HOST[,HOST] naming the trainer's"
                " address (default: loopback only)",
                field,
                status=403,
                kind="PermissionDenied",
            )
