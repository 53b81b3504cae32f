"""Errors of the inference layer: one `InferenceError` that says whether a retry can help.

Every backend translates what goes wrong on the wire (refused connections, timeouts, HTTP errors,
unreadable bodies) into `InferenceError` at one boundary (`base.HTTPBackend._request`), so the
manager decides retry and failover from two fields, `retryable` and `kind`, and never from a
third-party exception type.

>>> InferenceError.from_status(503, "overloaded").retryable
True
>>> InferenceError.from_status(400, "context too long").retryable
False
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "connection",  # refused, reset, DNS: the server is not there (retryable, marks it unhealthy)
    "timeout",  # no answer within the request timeout or the call's deadline (retryable)
    "http_5xx",  # the server failed (retryable)
    "http_429",  # rate limited or overloaded, incl. 408 (retryable)
    "http_4xx",  # the request is wrong: never retried
    "protocol",  # a 2xx answer we cannot read (not retried)
    "unsupported",  # the backend cannot do this at all (not retried)
    "unavailable",  # no healthy server had room before the deadline (retryable by the caller)
]

RETRYABLE_STATUS = frozenset({408, 429})
"""4xx statuses that mean "try again later" rather than "this request is wrong"."""


class InferenceError(Exception):
    """A call to an inference server failed.

    Attributes:
        status_code: the HTTP status, when the server answered.
        retryable: whether the same request may succeed if sent again (possibly elsewhere).
        kind: a short label for metrics (`"timeout"`, `"http_5xx"`, ...).
        server: the base URL of the server that failed, when known.
        retry_after: seconds the server asked us to wait (`Retry-After`), when given.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retryable: bool = False,
        kind: ErrorKind = "protocol",
        server: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.retryable = retryable
        self.kind: ErrorKind = kind
        self.server = server
        self.retry_after = retry_after

    @classmethod
    def from_status(
        cls,
        status: int,
        body: str,
        *,
        server: str | None = None,
        retry_after: float | None = None,
    ) -> InferenceError:
        """The error for an HTTP answer with status >= 400 (5xx, 408 and 429 are retryable)."""
        if status >= 500:
            kind: ErrorKind = "http_5xx"
        elif status in RETRYABLE_STATUS:
            kind = "http_429"
        else:
            kind = "http_4xx"
        text = " ".join(body.split())[:500]
        return cls(
            f"HTTP {status}: {text}" if text else f"HTTP {status}",
            status_code=status,
            retryable=kind != "http_4xx",
            kind=kind,
            server=server,
            retry_after=retry_after,
        )

    def __str__(self) -> str:
        where = f" [{self.server}]" if self.server else ""
        return f"{self.message}{where}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, kind={self.kind!r}, "
            f"status_code={self.status_code!r}, retryable={self.retryable!r})"
        )


class InferenceTimeout(InferenceError, TimeoutError):
    """No answer within the request timeout, or the call's overall deadline passed."""

    def __init__(self, message: str, *, server: str | None = None) -> None:
        super().__init__(message, retryable=True, kind="timeout", server=server)


class UnsupportedOperation(InferenceError, NotImplementedError):
    """The backend cannot perform this call at all (e.g. token ids from a plain OpenAI API)."""

    def __init__(self, message: str, *, server: str | None = None) -> None:
        super().__init__(message, retryable=False, kind="unsupported", server=server)
