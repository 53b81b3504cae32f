"""Environments of other frameworks' open formats, both ways: run theirs, publish ours.

Two protocols, each a subpackage imported only when asked for:

- `ors`: the Open Reward Standard (PyPI `openreward`): HTTP + SSE; an environment lists splits
  and tasks, opens sessions, exposes tools, and returns a reward inline with each tool output.
- `openenv`: OpenEnv (PyPI `openenv-core`): Gymnasium-style `reset`/`step`/`state` over HTTP.

The spec grammar (what `atropos env process|serve|evaluate SPEC` takes besides a registered name):

- `ors:URL` or `ors:URL#ENV`: the ORS server at `URL` (http or https), its environment `ENV`
  (without `#ENV`: the server's only environment; a server with several names them);
- `openenv:URL`: the OpenEnv server at `URL`;
- `openenv:package.module:Class`: an installed package's OpenEnv environment class, started by
  us in a subprocess.

Each protocol module exposes the same two calls:

- `env_class(spec: str) -> type[BaseEnv]`: an Atropos environment class driving the remote one;
- `publish(env_name, env_argv, host, port) -> None`: serve a registered Atropos environment in
  that protocol until SIGINT or SIGTERM.

>>> parse("ors:http://127.0.0.1:8080#Math")
Spec(protocol='ors', target='http://127.0.0.1:8080', env='Math')
>>> parse("openenv:my_pkg.envs:EchoEnv").is_url
False
>>> is_spec("gsm8k"), is_spec("ors:http://h:1"), is_spec("pkg.mod:Class")
(False, True, False)
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["PROTOCOLS", "Spec", "env_class", "is_spec", "parse", "protocol_module", "publish"]

PROTOCOLS: tuple[str, ...] = ("ors", "openenv")
_CLASS_TARGET = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_ENV_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Spec:
    """A parsed remote environment spec: its protocol, URL (or `module:Class`) and ORS `#ENV`."""

    protocol: str
    target: str
    env: str | None = None

    @property
    def is_url(self) -> bool:
        """Whether the target is a server's URL (else an installed `module:Class`)."""
        return self.target.startswith(("http://", "https://"))

    def __str__(self) -> str:
        return f"{self.protocol}:{self.target}" + (f"#{self.env}" if self.env else "")


def is_spec(text: str) -> bool:
    """Whether `text` names a remote environment (`ors:...`, `openenv:...`), not a registered
    name, a `module:Class` or a file."""
    head, sep, _ = text.partition(":")
    return bool(sep) and head in PROTOCOLS


def parse(text: str) -> Spec:
    """`text` as a `Spec`.

    Raises:
        ValueError: not one of the forms in the module docstring (the message shows them).
    """
    protocol, sep, rest = text.partition(":")
    if not sep or protocol not in PROTOCOLS:
        raise ValueError(f"{text!r}: a remote environment is {', '.join(_FORMS.values())}")
    target, hashed, env = rest.partition("#")
    if protocol == "openenv" and hashed:
        raise ValueError(f"{text!r}: openenv specs take no '#ENV' (an OpenEnv server is one env)")
    if hashed and not _ENV_NAME.fullmatch(env):
        raise ValueError(f"{text!r}: '#ENV' must name an environment (letters, digits, '._-')")
    if target.startswith(("http://", "https://")):
        parts = urlsplit(target)
        if not parts.hostname:
            raise ValueError(f"{text!r}: the URL has no host; e.g. {protocol}:http://HOST:PORT")
        return Spec(protocol, target.rstrip("/"), env or None)
    if protocol == "openenv" and _CLASS_TARGET.fullmatch(target):
        return Spec(protocol, target)
    raise ValueError(
        f"{text!r}: expected {_FORMS[protocol]}"
        f" (a URL starts with http:// or https://; got {target!r})"
    )


_FORMS = {
    "ors": "ors:URL or ors:URL#ENV",
    "openenv": "openenv:URL or openenv:package.module:Class",
}


def protocol_module(protocol: str) -> Any:
    """The module of `protocol` (`atropos.interop.ors`, `atropos.interop.openenv`), imported now.

    Raises:
        ValueError: an unknown protocol (the message lists the known ones).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}: use one of {', '.join(PROTOCOLS)}")
    return importlib.import_module(f"atropos.interop.{protocol}")


def env_class(spec: str) -> type:
    """An Atropos environment class that runs the remote environment `spec` names.

    Raises:
        ValueError: a malformed spec.
    """
    parsed = parse(spec)
    made: type = protocol_module(parsed.protocol).env_class(spec)
    return made


def publish(protocol: str, env_name: str, env_argv: list[str], host: str, port: int) -> None:
    """Serve the registered environment `env_name` (configured by `env_argv`, the flags of
    `atropos env serve NAME`) in `protocol` on `host:port` until SIGINT or SIGTERM."""
    protocol_module(protocol).publish(env_name, env_argv, host, port)
