"""Session-affine routing: which server a conversation's turns go to, and the hint they carry.

A *session* is one conversation: a `ManagedServer` (`ServerManager.managed_server`), a proxy
session, an agent rollout, or any run of calls that pass the same `session="key"`. Under the
`sticky_least_loaded` policy (the default) its first call goes to the least-loaded healthy
server, which becomes its *home*; later calls go home, so the server's prefix cache still holds
the conversation's earlier turns. A session leaves its home only when the home

* is unhealthy (failed probe or connection error) or has no room (its in-flight cap is reached),
  or failed this very call (the retry goes elsewhere), or
* is over the load ratio: sending the call home would fill at least half of the home's
  in-flight cap (`REHOME_MIN_LOAD`) and make it more than `ratio` times as loaded as the
  least-loaded server would be, counting this call, `(in_flight + 1) / capacity` on both sides
  (`within_ratio`). A home under half full has room: moving would only lose the cached prefix
  (measured: with a cap of 512 and 32 conversations on 2 vLLM replicas, the ratio alone moved
  two conversations in five and cost 6 points of hit rate). With adaptive concurrency on, the
  cap is what the server keeps up with, so "half full" means what it says.

The server that answers becomes the new home, and the session stays there (its prefix is built
there now), even when the old home comes back. `least_loaded` sends every call to the
least-loaded server, as before sessions existed; single calls without a session always do.

The default ratio, 2.0, is a choice: a turn that finds its prefix cached skips the prefill of
the whole conversation so far, which is worth a deeper queue, but not an unbounded one; one
long conversation's burst of calls (`n` split in chunks, tool loops) must not pile onto one
server while another idles. `ServerManagerConfig.rehome_load_ratio` sets it (`inf`: never for
load).

Hints. Each call of a session carries its key in the headers the engines and their routers
read, so a router in front of several replicas behind one `base_url` keeps the session on one
replica too:

* vLLM: `X-Session-ID`. vLLM 0.32 reads it (`vllm/entrypoints/generate/base/serving.py`,
  `SESSION_ID_HEADER = "X-Session-ID"`; the same value as the request body's `session_id` field,
  "stable session identity shared by related requests", in `ChatCompletionRequest` and
  `CompletionRequest`) into the engine request's `session_id`, which labels the KV-cache events
  KV-aware routers consume (`vllm/v1/core/block_pool.py`); vLLM's router (vllm-project/router,
  `consistent_hash` policy) keys on `X-Session-ID` first.
* SGLang: `X-SMG-Routing-Key`, the routing key of the SGLang Model Gateway (sgl-router,
  `--policy manual|consistent_hashing` or `--routing-key-override`; "Sticky Sessions and Routing
  Keys" in its docs). The SGLang engine itself takes no per-request session hint: its
  `session_params` address sessions opened by `/open_session`, which hold KV state server-side
  and are not what a stateless client wants, and its `rid` must be unique per request.
* OpenAI-type and TRL servers get no hint (a hosted API has no use for it).

A header, not a body field: older engines ignore an unknown header, while a body field they do
not know is an error on some (SGLang's `/generate` refuses unknown sampling fields).

>>> homes = SessionHomes(limit=2)
>>> homes.set("a", 0); homes.set("b", 1); homes.set("c", 1)
>>> homes.get("a"), homes.get("c"), len(homes)
(None, 1, 2)
"""

from __future__ import annotations

import itertools
import uuid
from collections import Counter, OrderedDict
from typing import Literal

RoutingPolicy = Literal["sticky_least_loaded", "least_loaded"]
"""How a session's calls are routed (this module's docstring)."""

HINT_HEADERS: dict[str, tuple[str, ...]] = {
    "vllm": ("X-Session-ID",),
    "sglang": ("X-SMG-Routing-Key",),
}
"""The headers that carry a session's key, by `server_type` (none for the others)."""

DEFAULT_SESSION_LIMIT = 1 << 17
"""Session homes remembered at most (least recently used forgotten first): 131,072 keys."""


_KEY_PREFIX = uuid.uuid4().hex[:16]
_KEY_COUNTER = itertools.count()


def new_session_key() -> str:
    """A fresh session key (32 hex digits): a random prefix per process and a counter, unique
    like a uuid4 and made for a fraction of its cost (one per rollout)."""
    return f"{_KEY_PREFIX}{next(_KEY_COUNTER):016x}"


def hint_headers(server_type: str, key: str) -> dict[str, str] | None:
    """The headers that tell a server of `server_type` which session a request belongs to.

    >>> hint_headers("vllm", "k1"), hint_headers("openai", "k1")
    ({'X-Session-ID': 'k1'}, None)
    """
    names = HINT_HEADERS.get(server_type)
    return {name: key for name in names} if names else None


def header_lines(server_type: str, key: str) -> str | None:
    r"""`hint_headers` as HTTP header lines, what `http.HTTPClient.request` sends as they are.

    >>> header_lines("sglang", "k1")
    'X-SMG-Routing-Key: k1\r\n'
    """
    headers = hint_headers(server_type, key)
    return "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else None


REHOME_MIN_LOAD = 0.5
"""A session never leaves a home for load while the home, with this call, is under this share
of its in-flight cap."""


def within_ratio(home_load: float, best_load: float, ratio: float) -> bool:
    """Whether a home whose load with this call would be `home_load` may still take it while
    the least-loaded server would be at `best_load` (loads as `(in_flight + 1) / capacity`).

    >>> within_ratio(4 / 16, 1 / 16, 2.0), within_ratio(10 / 16, 4 / 16, 2.0)
    (True, False)
    """
    return home_load < REHOME_MIN_LOAD or home_load <= ratio * best_load


class SessionHomes:
    """Session key -> home server index, bounded (least recently used forgotten first).

    Sessions that end tell it (`forget`); keys of sessions that never say they ended (a proxy
    session that expires, an agent that crashed) fall out when `limit` newer ones came.
    """

    def __init__(self, limit: int = DEFAULT_SESSION_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self._homes: OrderedDict[str, int] = OrderedDict()
        #: How many remembered sessions live on each server.
        self.per_server: Counter[int] = Counter()
        #: How many times a session left its home (unhealthy, full, failed or over the ratio).
        self.rehomed = 0

    def __len__(self) -> int:
        return len(self._homes)

    def get(self, key: str) -> int | None:
        """The session's home, or None when it has none (new, or forgotten)."""
        return self._homes.get(key)

    def set(self, key: str, index: int) -> None:
        """Make server `index` the session's home (counting a move as a re-homing)."""
        homes = self._homes
        old = homes.get(key)
        if old is None:
            homes[key] = index
            self.per_server[index] += 1
            if len(homes) > self.limit:
                self.per_server[homes.popitem(last=False)[1]] -= 1
            return
        if old != index:
            self.rehomed += 1
            homes[key] = index
            self.per_server[old] -= 1
            self.per_server[index] += 1
        homes.move_to_end(key)

    def forget(self, key: str) -> None:
        """The session ended: drop its home."""
        old = self._homes.pop(key, None)
        if old is not None:
            self.per_server[old] -= 1
