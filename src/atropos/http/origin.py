"""Who may talk to a server we ship: the Host names it answers, and no browser page of another
site. Written for the trajectory API first (its flags are named below); `atropos local serve`,
the rollout proxy, the MCP fixture server and the fakes apply the same rules (`rules.HttpRules`).

The threat: a server listens on loopback without a key by default, and a researcher's browser
runs on the same machine. Any page it opens (an ad, a paper's demo, a compromised site) can
send requests to `http://127.0.0.1:8000` without reading the answer: a `fetch` in `no-cors`
mode with a `text/plain` JSON body queues a poisoned group, an `<img src=.../reset_data>` or a
form POST wipes the run. A page may also rebind its own DNS name to 127.0.0.1 (DNS rebinding)
and then read the API as if it were same-origin, with `Host: attacker.example`.

The rules (checked before the API key, on every route):

1. Host: the `Host` header must name this server. On a loopback address that is `localhost`,
   a loopback IP (127.0.0.0/8, `[::1]`), the bound address, or a name given with
   `--allowed-host NAME`. On another address it may also be any IP literal and this machine's
   host name; with an API key, any name (a rebound page cannot know the key). `--allowed-host
   '*'` accepts every name. A rebound page always sends its own (foreign) name, so it is
   refused, reads included.
2. Origin: a browser names the page's origin on every cross-origin request and on same-origin
   writes. When present it must be the API's own origin (`http://` + the `Host` it was sent
   to) or listed with `--cors-origin`; `Origin: null` (sandboxed frames, `file:` pages) is
   refused.
3. Fetch Metadata: `Sec-Fetch-Site: cross-site` or `same-site` (another port of 127.0.0.1 is
   the same site) is refused unless the Origin is listed with `--cors-origin`; `same-origin`,
   `none` (typed in the address bar) and no header at all are accepted.
4. Content type: a request other than GET or HEAD may carry JSON (`application/json`) or
   msgpack (`application/msgpack`, `application/x-msgpack`), or no Content-Type at all; the
   types an HTML form or a simple `fetch` can send (`text/plain`, form encodings) are refused.

Rules 2 and 3 do not apply to GET or HEAD of the pages that hold no data (the server's
`open_paths`: `/health` everywhere; the API adds `/` and `/dashboard`, so following a link to
the dashboard from another site works).

Python clients (atroposlib's `requests` and `aiohttp`, this project's own) send no Origin, no
Sec-Fetch-* headers, `Host: 127.0.0.1:PORT` or `localhost:PORT`, and `application/json`: they
pass every rule unchanged, `GET /reset_data` included.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from atropos.http.body import MSGPACK_TYPES
from atropos.names import is_loopback

BODY_TYPES = ("application/json", *MSGPACK_TYPES)
"""Content types a request with a body may declare (or none at all)."""
CROSS_SITE = ("cross-site", "same-site")


def host_name(header: str) -> str:
    """The name part of a `Host` header value: no port, no IPv6 brackets, lower case.

    >>> host_name("LocalHost:8000"), host_name("[::1]:8000"), host_name("127.0.0.1")
    ('localhost', '::1', '127.0.0.1')
    """
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    name = header.rpartition(":")[0] if header.count(":") == 1 else header
    return name.rstrip(".")


@dataclass(frozen=True)
class Site:
    """What this API serves: the Host names it answers and the browser origins it trusts."""

    names: frozenset[str]  # host names accepted (lower case, no port)
    any_ip: bool  # any IP literal is accepted (bound to a non-loopback address)
    any_name: bool  # any Host at all
    cors_origins: frozenset[str]

    @classmethod
    def of(
        cls,
        bound: str,
        allowed_hosts: Iterable[str] = (),
        api_key: bool = False,
        cors_origins: Iterable[str] = (),
    ) -> Site:
        """The site of an API bound to `bound`, with `--allowed-host` names and a key or not.

        >>> Site.of("127.0.0.1").accepts_host("localhost:8000")
        True
        >>> Site.of("127.0.0.1").accepts_host("attacker.example:8000")
        False
        >>> Site.of("0.0.0.0", api_key=True).accepts_host("gpu-node-7:8000")
        True
        """
        extra = {host_name(h) for h in allowed_hosts}
        loopback = is_loopback(bound, resolve=True)  # once, at startup
        names = {"localhost", host_name(bound), *extra} - {"*"}
        if not loopback:
            names.add(socket.gethostname().lower())
        return cls(
            names=frozenset(names),
            any_ip=not loopback,
            any_name="*" in extra or (api_key and not loopback),
            cors_origins=frozenset(o.rstrip("/").lower() for o in cors_origins),
        )

    def accepts_host(self, header: str | None) -> bool:
        """Whether a request with this `Host` header is for this server (none: HTTP/1.0)."""
        if header is None or self.any_name:
            return True
        name = host_name(header)
        if name in self.names:
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False
        return self.any_ip or address.is_loopback


class Refusal(NamedTuple):
    """A refused request: the status (403 for rules 1 to 3, 415 for rule 4) and why."""

    status: int
    message: str


def refusal(
    method: str,
    path: str,
    headers: Mapping[str, str],
    site: Site,
    open_paths: tuple[str, ...] = ("/health",),
) -> Refusal | None:
    """Why this request must be refused, or None when it passes every rule; `open_paths` are
    the pages rules 2 and 3 leave open to GET and HEAD (they hold no data).

    >>> site = Site.of("127.0.0.1")
    >>> refusal("POST", "/scored_data", {"host": "127.0.0.1:8000"}, site) is None
    True
    >>> refusal("GET", "/reset_data", {"host": "127.0.0.1:8000", "sec-fetch-site": "same-site"},
    ...         site).status
    403
    """
    host = headers.get("host")
    if not site.accepts_host(host):
        return Refusal(
            403,
            f"Host {host!r} is not a name this API serves (DNS rebinding is refused): use"
            " http://127.0.0.1 or http://localhost, or start the API with --allowed-host NAME",
        )
    if not (method in ("GET", "HEAD") and path in open_paths):
        origin = headers.get("origin")
        listed = origin is not None and origin.rstrip("/").lower() in site.cors_origins
        if origin is not None and not listed:
            if origin == "null":
                return Refusal(
                    403, "Origin: null refused: a sandboxed or file: page may not use this API"
                )
            own = host is not None and origin.lower().partition("://")[2] == host.lower()
            if not own or not origin.lower().startswith(("http://", "https://")):
                return Refusal(
                    403,
                    f"cross-origin request from {origin} refused: only this API's own"
                    " pages and origins listed with --cors-origin may call it from a browser",
                )
        if not listed and headers.get("sec-fetch-site", "").lower() in CROSS_SITE:
            return Refusal(
                403,
                "cross-site request refused (Sec-Fetch-Site:"
                f" {headers['sec-fetch-site']}): a page of another site may not use this API;"
                " list its origin with --cors-origin to allow it",
            )
    if method not in ("GET", "HEAD"):
        ctype = headers.get("content-type")
        if ctype is not None and ctype.split(";")[0].strip().lower() not in BODY_TYPES:
            return Refusal(
                415,
                f"Content-Type {ctype.split(';')[0].strip()!r} is not accepted: send"
                " 'Content-Type: application/json' (or application/msgpack)",
            )
    return None
