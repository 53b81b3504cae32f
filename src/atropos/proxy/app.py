"""The proxy: its settings, its sessions (`Proxy`, embeddable in any process) and its app.

Routes (`KEY` is the proxy's `--api-key` when it has one; a session's own key is its bearer):

| Route | Who | What |
|---|---|---|
| `GET /health` | anyone | `{status, model, sessions}` |
| `POST /sessions` | KEY when set | a new session: `{id, base_url, anthropic_base_url, api_key}` |
| `GET /sessions` | KEY (none set: 401) | the sessions, with their counts |
| `GET /sessions/{id}/trajectory` | KEY or the session | its sequences (`Trajectory.to_dict`) |
| `POST /sessions/{id}/reward` | KEY or the session | `{"reward": float}`: the run's reward |
| `DELETE /sessions/{id}` | KEY or the session | forget it |
| `/s/{id}/v1/...` | the session (or KEY) | the dialects below, for that session |
| `/v1/...` | a session's key | the dialects below, for the session the key names |
| `/v1/...` + `X-Session-ID: NAME` | KEY | the same, for the session NAME (its id or an alias) |
| `POST /sessions/create` | KEY when set | upstream's ManagedServerProxy: `{uuid, api_key, ...}` |
| `/{uuid}/...` | the uuid (+ KEY or the session's key, when KEY is set) | upstream's routes |

Upstream's routes are `POST /{uuid}/v1/chat/completions`, `GET /{uuid}/nodes` and `DELETE
/{uuid}`; `uuid` is what `POST /sessions/create` answered (below), not the session's id.

Dialects: `chat/completions`, `completions`, `models` (`openai_api`), `responses[/compact]`
(`responses_api`), `messages` (`anthropic_api`). The key is read from `Authorization: Bearer`
or Anthropic's `x-api-key`. A wrong key is 401, an unknown or expired session 404, a finished
one 410, a body over `max_body_bytes` 413, a malformed request 400 (a body that is not UTF-8,
not JSON or nested deeper than `fields.MAX_DEPTH`; a field of the wrong type or range, named in
the message and `param`), the inference server's own 4xx that status (its message kept), a
server that is unreachable or fails (5xx) 502, one that does not answer in time 504, a bug in
the proxy 500 (logged); each in the dialect's error shape, and none of them touches another
session. In front of every route are the HTTP rules of every server we ship (`atropos.http`):
no foreign `Host` (DNS rebinding), no page of another site, no content type a form can send,
the body limit; their refusals too are in the dialect of the path.

A session id alone is not a credential. It is public: trajectories, logs, the listing and the
`/s/{id}/` URLs show it, so every route that reaches a session by its id also needs the
session's key (or the proxy's). Upstream's client (atroposlib's `ProxyManagedServer`) sends no
key of its own: it creates a session, reads `uuid` from the answer, then uses
`{proxy}/{uuid}/v1` as an OpenAI base URL (whatever bearer the OpenAI client was given) and
calls `GET /{uuid}/nodes` and `DELETE /{uuid}` bare. So upstream's `uuid` is a capability, not
the id: 256 random bits (`session.new_capability`), issued once to the creator, looked up only
on upstream's routes, never the public id nor the session's key (a leaked URL gives upstream's
three routes only, never the native ones), and kept out of the `Session` itself, so no
trajectory, listing, log line or error message can carry it. With no proxy key the proxy is
meant for one machine: `atropos proxy serve` refuses a non-loopback `--host` without `--api-key`
(or `--insecure`), and `GET /sessions` then answers 401 to everyone (listing every id is of no
use to a holder of one session, and an attacker's first step).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atropos.http import ErrorShape, HttpRules, Rules, Site, guard
from atropos.inference.manager import ServerManager
from atropos.proxy import anthropic_api, openai_api, responses_api
from atropos.proxy.asgi import ProxyApp
from atropos.proxy.session import (
    Limits,
    Session,
    new_capability,
    new_session_id,
    new_session_key,
)
from atropos.proxy.turns import ProxyError

__all__ = ["Proxy", "ProxySettings", "build_app"]


@dataclass
class ProxySettings:
    """How the proxy runs (the `proxy:` section of a config file, `--proxy.*` flags)."""

    model: str = "atropos-policy"  # the name answers carry (default: the servers' model)
    tool_parser: str = "hermes"  # how calls are read from raw output
    limits: Limits = field(default_factory=Limits)
    session_ttl: float = 3600.0  # an idle session is forgotten after this many seconds
    max_sessions: int = 4096
    max_body_bytes: int = 8 << 20
    api_key: str | None = None
    host: str = "127.0.0.1"


class Proxy:
    """The sessions and what they generate with: embeddable in any process.

    Args:
        server: a `ServerManager` (or anything with its `managed_server(tokenizer)` and
            `chat_completion`); text-only when `text_only` (every server is `server_type:
            openai`).
        tokenizer: the policy's tokenizer.
        settings: `ProxySettings`.
        server_configs: the servers' configurations (for messages only).
    """

    def __init__(
        self,
        server: Any,
        tokenizer: Any,
        settings: ProxySettings | None = None,
        *,
        text_only: bool = False,
        server_configs: list[Any] | None = None,
    ) -> None:
        self.server = server
        self.tokenizer = tokenizer
        self.settings = settings or ProxySettings()
        self.text_only = text_only
        self.server_configs = list(server_configs or [])
        self.sessions: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}
        self._aliases: dict[str, Session] = {}
        self._alias_names: dict[str, list[str]] = {}  # session id -> its aliases
        self._by_capability: dict[str, Session] = {}  # upstream's uuid -> its session
        self._capability_of: dict[str, str] = {}  # session id -> its upstream uuid

    async def create_session(
        self, limits: Limits | None = None, metadata: Mapping[str, Any] | None = None
    ) -> Session:
        """A new session (ProxyError 503 when `max_sessions` are open)."""
        self.expire()
        if len(self.sessions) >= self.settings.max_sessions:
            raise ProxyError(
                503,
                f"{len(self.sessions)} sessions are open (max_sessions): delete finished ones",
                "overloaded_error",
            )
        managed, session_id = None, new_session_id()
        if not self.text_only:  # the context's exit only resets it: the session just ends
            opened = self._managed_server(session_id)
            managed = await opened.__aenter__()
        session = Session(
            session_id,
            new_session_key(),
            managed=managed,
            text_server=self.server if self.text_only else None,
            tokenizer=self.tokenizer,
            tool_parser=self.settings.tool_parser,
            limits=limits or self.settings.limits,
            model=self.settings.model,
            metadata=metadata,
        )
        self.sessions[session.id] = session
        self._by_key[session.key] = session
        return session

    def _managed_server(self, session_id: str) -> Any:
        """The session's `ManagedServer` context. A `ServerManager` gets the session's id as
        its routing key (`inference.routing`, `sticky_least_loaded`): every call of the
        session goes to one server (its prefix cache holds the conversation) and carries the
        id in the engine's session header (vLLM's `X-Session-ID`)."""
        if isinstance(self.server, ServerManager):
            return self.server.managed_server(tokenizer=self.tokenizer, session=session_id)
        return self.server.managed_server(tokenizer=self.tokenizer)

    def get(self, session_id: str) -> Session:
        """The session, or ProxyError 404."""
        session = self.sessions.get(session_id)
        if session is None:
            raise ProxyError(
                404, f"unknown or expired session {session_id!r}: POST /sessions", "not_found_error"
            )
        return session

    def by_key(self, key: str) -> Session | None:
        """The session whose key this is (compared in constant time), if any."""
        session = self._by_key.get(key)
        if session is not None and hmac.compare_digest(session.key, key):
            return session
        return None

    def issue_capability(self, session_id: str) -> str:
        """A new upstream `uuid` for the session (`new_capability`): a secret that reaches it on
        upstream's routes only (`by_capability`); it goes with the session."""
        session = self.get(session_id)
        capability = new_capability()
        self._by_capability[capability] = session
        self._capability_of[session.id] = capability
        return capability

    def by_capability(self, capability: str) -> Session:
        """The session this upstream `uuid` addresses, or ProxyError 404 (which never repeats
        the uuid: it is a secret)."""
        session = self._by_capability.get(capability)
        held = self._capability_of.get(session.id, "") if session is not None else ""
        if session is None or not hmac.compare_digest(held, capability):
            raise ProxyError(
                404, "unknown or expired session: POST /sessions/create", "not_found_error"
            )
        return session

    def alias(self, name: str, session_id: str) -> None:
        """Let requests that name `name` in their `X-Session-ID` header (with the proxy's key)
        reach the session `session_id`: a client that multiplexes many rollouts over one
        connection pool and one key, and tells them apart by that header (verifiers'
        interception server sends its trace id), is routed per rollout. The alias goes with the
        session."""
        session = self.get(session_id)
        taken = self._aliases.get(name)
        if taken is not None and taken is not session:
            raise ValueError(f"alias {name!r} already names session {taken.id}")
        if taken is None:
            self._aliases[name] = session
            self._alias_names.setdefault(session.id, []).append(name)

    def by_name(self, name: str) -> Session:
        """The session with this id or alias, or ProxyError 404."""
        session = self._aliases.get(name)
        return session if session is not None else self.get(name)

    def delete(self, session_id: str) -> Session:
        """Forget a session and its aliases; returns it (its trajectory stays readable)."""
        session = self.get(session_id)
        session.close()
        if isinstance(self.server, ServerManager):
            self.server.homes.forget(session_id)  # its routing home goes with it
        del self.sessions[session_id]
        self._by_key.pop(session.key, None)
        for name in self._alias_names.pop(session_id, ()):
            del self._aliases[name]
        self._by_capability.pop(self._capability_of.pop(session_id, ""), None)
        return session

    def describe_servers(self) -> list[str]:
        """Each inference server as `base_url (server_type)`."""
        configs = self.server_configs
        return [f"{c.base_url} ({c.server_type})" for c in configs] or [repr(self.server)]

    def expire(self, now: float | None = None) -> int:
        """Forget sessions idle longer than `session_ttl`; how many were."""
        now = time.monotonic() if now is None else now
        old = [
            s.id for s in self.sessions.values() if now - s.last_used > self.settings.session_ttl
        ]
        for session_id in old:
            self.delete(session_id)
        return len(old)


def build_app(proxy: Proxy) -> HttpRules:
    """The ASGI app of `proxy` (`atropos.proxy.asgi.ProxyApp`) behind the HTTP rules of every
    server we ship (`atropos.http`), which answer in the dialect of the path refused."""
    s = proxy.settings
    site = Site.of(s.host, (), s.api_key is not None)
    return guard(ProxyApp(proxy), Rules(site, ("/health",), s.max_body_bytes, dialect_of))


_KINDS = {"Refused": "refused", "InternalError": "api_error"}


def dialect_of(path: str) -> ErrorShape:
    """The error shape of a path: Anthropic's for `/messages`, OpenAI's (with the Responses
    API's `param`) for everything else."""
    if path.endswith("/messages"):
        shape = anthropic_api.error_body
    elif path.endswith("/responses"):
        shape = responses_api.error_body
    else:
        shape = openai_api.error_body

    def error(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
        kind = _KINDS.get(kind, "invalid_request_error")
        return shape(ProxyError(status, message, kind, param))

    return error
