"""The proxy: its settings, its sessions (`Proxy`, embeddable in any process) and its app.

Routes (`KEY` is the proxy's `--api-key` when it has one; a session's own key is its bearer):

Upstream's routes are `POST /sessions/create`, `POST /{uuid}/v1/chat/completions`, `GET
/{uuid}/nodes` and `DELETE /{uuid}`.

| Route | Who | What |
|---|---|---|
| `GET /health` | anyone | `{status, model, sessions}` |
| `POST /sessions` | KEY | a new session: `{id, base_url, anthropic_base_url, api_key}` |
| `GET /sessions` | KEY | the sessions, with their counts |
| `GET /sessions/{id}/trajectory` | KEY or the session | its sequences (`Trajectory.to_dict`) |
| `POST /sessions/{id}/reward` | KEY or the session | `{"reward": float}`: the run's reward |
| `DELETE /sessions/{id}` | KEY or the session | forget it |
| `/s/{id}/v1/...` | the session (or KEY) | the dialects below, for that session |
| `/v1/...` | a session's key | the dialects below, for the session the key names |
| `/v1/...` + `X-Session-ID: NAME` | KEY | the same, for the session NAME (its id or an alias) |
| `POST /sessions/create`, `/{uuid}/...` | KEY when set | upstream's ManagedServerProxy |

Dialects: `chat/completions`, `completions`, `models` (`openai_api`), `responses`
(`responses_api`), `messages` (`anthropic_api`). The key is read from `Authorization: Bearer`
or Anthropic's `x-api-key`. A wrong key is 401, an unknown or expired session 404, a finished
one 410, a body over `max_body_bytes` 413, a malformed request 400; each in the dialect's error
shape, and none of them touches another session. Every route also passes the API's browser
rules (`atropos.api.origin`): no cross-site writes, no foreign `Host`.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atropos.proxy.asgi import ProxyApp
from atropos.proxy.session import Limits, Session, new_session_id, new_session_key
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
        managed = None
        if not self.text_only:  # the context's exit only resets it: the session just ends
            managed = await self.server.managed_server(tokenizer=self.tokenizer).__aenter__()
        session = Session(
            new_session_id(),
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
        del self.sessions[session_id]
        self._by_key.pop(session.key, None)
        for name in self._alias_names.pop(session_id, ()):
            del self._aliases[name]
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


def build_app(proxy: Proxy) -> ProxyApp:
    """The ASGI app of `proxy` (`atropos.proxy.asgi.ProxyApp`)."""
    return ProxyApp(proxy)
