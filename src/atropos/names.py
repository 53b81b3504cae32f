"""Names a user types: the "did you mean" hint for a misspelt one, and whether a host is local.

A leaf of the package: it imports only the standard library and nothing from `atropos`, so every
layer may use it (the API, whose own imports are otherwise `wire` alone, included). One
implementation of each, so every command line, config file and registry suggests the same way
and every loopback decision (the API's Host check, gzip on loopback, launch keys) agrees.
"""

from __future__ import annotations

import difflib
import ipaddress
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

__all__ = ["did_you_mean", "is_loopback", "is_loopback_url"]


def did_you_mean(
    word: str,
    candidates: Iterable[str],
    show: Callable[[str], str] = str,
    *,
    lead: str = "; ",
    tail: str = "?",
) -> str:
    """`lead + "did you mean " + show(closest) + tail` for the candidate closest to `word`, or
    "" when none is close (difflib's ratio of at least 0.6).

    `show` writes the suggestion as the message names things (`repr` for quoted names, a
    function for a flag or a key path); `lead` and `tail` fit it into the message around it.

    >>> did_you_mean("gropu_size", ["group_size", "batch_size"])
    '; did you mean group_size?'
    >>> did_you_mean("acuracy", ["accuracy"], repr)
    "; did you mean 'accuracy'?"
    >>> did_you_mean("zzz", ["accuracy"])
    ''
    """
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"{lead}did you mean {show(close[0])}{tail}" if close else ""


def is_loopback(host: str, *, resolve: bool = False) -> bool:
    """Whether `host` (an address or a name, IPv6 with or without brackets) is this machine
    alone: `localhost` and its subdomains (RFC 6761), 127.0.0.0/8 and ::1.

    With `resolve`, any other name counts when every address it resolves to is loopback; that
    asks the resolver, so a server calls it once at startup for its bind address, never per
    request.

    >>> is_loopback("127.0.0.1"), is_loopback("[::1]"), is_loopback("localhost")
    (True, True, True)
    >>> is_loopback("0.0.0.0"), is_loopback("api.example.com")
    (False, False)
    """
    host = host.lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    if not resolve:
        return False
    try:
        return all(
            ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None)
        )
    except (OSError, ValueError):
        return False


def is_loopback_url(url: str) -> bool:
    """Whether `url`'s host is this machine (see `is_loopback`; the name is not resolved).

    >>> is_loopback_url("http://127.0.0.1:8000"), is_loopback_url("http://[::1]:80/x")
    (True, True)
    >>> is_loopback_url("http://localhost:8000"), is_loopback_url("http://api.example.com")
    (True, False)
    """
    return is_loopback(urlsplit(url).hostname or "")
