"""Recent groups of a running API, read through `GET /rollouts` (read-only).

`/rollouts?after=SEQ&limit=N` pages through the groups the API accepted lately (consumed or
not) without leasing, consuming or resetting anything, so a viewer never disturbs a run
(atroposlib 0.4.0's view-run reset the API, registered as a trainer and consumed whole
batches). `Follower` keeps the last `limit` groups and, called again, reads only what came after
its cursor.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import httpx

from atropos.view.read import Collection, Entry, Source, group_problem

PAGE = 1000
"""Groups asked for per request (the API's maximum)."""


class ApiError(RuntimeError):
    """The API could not be read (unreachable, refused the key, answered nonsense)."""


@dataclass
class Follower:
    """The last `limit` groups of the API at `url`, read by cursor."""

    url: str
    limit: int
    api_key: str | None = None
    timeout: float = 30.0
    cursor: int = -1  # the seq of the last group read
    missed: int = 0  # groups the API no longer held when asked for
    bad: int = 0
    recent: deque[Entry] = field(init=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.recent = deque(maxlen=max(self.limit, 1))

    def poll(self, client: httpx.Client | None = None) -> int:
        """Read everything after the cursor; return how many groups came."""
        own = client is None
        client = client or httpx.Client(timeout=self.timeout)
        try:
            return self._poll(client)
        finally:
            if own:
                client.close()

    def _poll(self, client: httpx.Client) -> int:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        came = 0
        while True:
            params = {"after": str(self.cursor), "limit": str(PAGE)}
            try:
                answer = client.get(f"{self.url}/rollouts", params=params, headers=headers)
            except httpx.HTTPError as err:
                raise ApiError(f"could not reach {self.url}: {err}") from None
            if answer.status_code in (401, 403):
                raise ApiError(
                    f"{self.url} refused the key ({answer.status_code}): pass --api-key"
                    " or set ATROPOS_API_KEY"
                )
            if answer.status_code == 404:
                raise ApiError(f"{self.url} has no /rollouts: is it an Atropos API?")
            if answer.status_code != 200:
                raise ApiError(f"{self.url}/rollouts answered {answer.status_code}")
            try:
                body = answer.json()
                rows = body["rollouts"]
                self.missed += int(body.get("missed") or 0)
            except (ValueError, KeyError, TypeError):
                raise ApiError(f"{self.url}/rollouts answered no rollouts list") from None
            for row in rows:
                self._take(row)
            came += len(rows)
            nxt = body.get("next")
            if not rows or not isinstance(nxt, int) or nxt <= self.cursor:
                return came
            self.cursor = nxt
            if body.get("newest") is not None and self.cursor >= body["newest"]:
                return came

    def _take(self, row: Any) -> None:
        group = row.get("group") if isinstance(row, dict) else None
        if group_problem(group) is not None:
            self.bad += 1
            return
        assert isinstance(row, dict) and isinstance(group, dict)
        if group.get("env_id") is None and isinstance(row.get("env_id"), int):
            group = {**group, "env_id": row["env_id"]}
        received = row.get("received")
        self.recent.append(
            Entry(
                group,
                self.url,
                f"seq {row.get('seq')}",
                float(received) if isinstance(received, (int, float)) else None,
            )
        )

    def collection(self) -> Collection:
        """The groups held now, oldest first, as a page's collection."""
        found = Collection(limit=self.limit)
        found.sources.append(Source(self.url, bad=self.bad))
        for entry in self.recent:
            found.add(entry)
        found.bad = self.bad
        if self.missed:
            found.notes.append(
                f"{self.missed} groups had already left the API's window of recent groups"
                " before they could be read."
            )
        found.notes.append(
            f"The last {self.limit:,} groups at most, read from {self.url}/rollouts"
            " (read-only: nothing was consumed or reset)."
        )
        return found
