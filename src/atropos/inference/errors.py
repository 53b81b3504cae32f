"""Errors of the inference layer: one `InferenceError` that says whether a retry can help.

Every backend translates what goes wrong on the wire (refused connections, timeouts, HTTP errors,
unreadable bodies) into `InferenceError` at one boundary (`base.HTTPBackend._request`), so the
manager decides retry and failover from two fields, `retryable` and `kind`, and never from a
third-party exception type.

>>> InferenceError.from_status(503, "overloaded").retryable
True
>>> InferenceError.from_status(400, "context too long").retryable
False

Some errors repeat for every request and item, whatever is retried: a model the server does not
serve (404), a refused key (401/403), a call the backend cannot make, a server never reached, or
every server of a role unreachable for `server_wait` seconds in a row (`pool.ServerPool`). They
carry `fatal=True`, and `fatal_reason(err)` is how the runners tell them from per-item errors:
they stop the run at the first one with its message, instead of failing every item the same way.
A 400 is *not* fatal: it is usually about one request (a prompt longer than the context), and a
run whose every item fails that way stops through the runner's "no group in N items" rule.

>>> InferenceError.from_status(404, "model not found").fatal
True
>>> InferenceError.from_status(400, "context too long").fatal
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
    "unavailable",  # no healthy server had room before the deadline (retryable by the caller;
    # fatal once every server has been unreachable for `server_wait` seconds)
]

RETRYABLE_STATUS = frozenset({408, 429})
"""4xx statuses that mean "try again later" rather than "this request is wrong"."""

FATAL_STATUS: dict[int, str] = {
    401: "the server refused the key: check --openai.api_key",
    403: "the server refused the key: check --openai.api_key",
    404: "check --openai.model_name (the model the server serves, see its /v1/models) and"
    " --openai.base_url",
    405: "the server does not take this call: check --openai.base_url and --openai.server_type",
}
"""4xx statuses that will be the same for every request (the configuration is wrong), and the
fix to name. A 400 is left out on purpose: it is usually about one request (a prompt too long)."""

FATAL_BODIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("thinking_token_budget", "reasoning_config"),
        "this vLLM takes --env.max_reasoning_tokens (sent as thinking_token_budget) only when"
        " started with --reasoning-parser or --reasoning-config: start it so, or unset"
        " max_reasoning_tokens",
    ),
)
"""Error answers (any status) that name a server configuration every request runs into: the
words that identify one, and the fix to name."""


def _fatal_body(text: str) -> str | None:
    """The fix for an error body of `FATAL_BODIES`, else None.

    >>> _fatal_body("ValueError: thinking_token_budget is set but reasoning_config is not set")
    ... # doctest: +ELLIPSIS
    'this vLLM takes --env.max_reasoning_tokens ...'
    >>> _fatal_body("maximum context length exceeded") is None
    True
    """
    for words, fix in FATAL_BODIES:
        if all(word in text for word in words):
            return fix
    return None


COMPLETION_PATHS = ("/chat/completions", "/completions")
"""The calls whose 404 from a base URL without /v1 means the /v1 is missing."""


def missing_v1(server: str | None, url: str | None) -> str | None:
    """The fix for a 404 on a completion call to a base URL that does not end in /v1, else
    None (OpenAI-compatible servers serve these calls under /v1).

    >>> missing_v1("http://127.0.0.1:9001", "http://127.0.0.1:9001/chat/completions")
    'the server has no /chat/completions there: add /v1 to --openai.base_url (http://127.0.0.1:9001/v1)'
    >>> missing_v1("http://127.0.0.1:9001/v1", "http://127.0.0.1:9001/v1/completions") is None
    True
    """
    if not server or not url:
        return None
    base = server.rstrip("/")
    path = url.split("?", 1)[0].rstrip("/")
    if base.endswith("/v1") or not path.startswith(base):
        return None
    rest = path[len(base) :]
    if rest not in COMPLETION_PATHS:
        return None
    return f"the server has no {rest} there: add /v1 to --openai.base_url ({base}/v1)"


class FatalError(Exception):
    """An error that will be the same for every item (a missing package, a tokenizer that
    cannot load, a wrong model name): the runners stop at the first one, with its message."""


def fatal_reason(err: BaseException) -> str | None:
    """The message to stop a run with when `err` will repeat for every item, else None.

    Fatal: `FatalError`, an `InferenceError` marked `fatal`, and `ImportError` (a package the
    scoring code needs is not installed; its message should name the extra to install). The
    error's explicit cause (`raise ... from err`) is looked at too.

    >>> fatal_reason(ImportError("the math rewards need math-verify: pip install x"))
    'the math rewards need math-verify: pip install x'
    >>> fatal_reason(ValueError("bad item")) is None
    True
    """
    seen: BaseException | None = err
    for _ in range(8):  # a short, bounded walk down the explicit causes
        if seen is None:
            return None
        if isinstance(seen, (FatalError, ImportError)):
            return str(seen) or type(seen).__name__
        if isinstance(seen, InferenceError) and seen.fatal:
            return str(seen)
        seen = seen.__cause__
    return None


class InferenceError(Exception):
    """A call to an inference server failed.

    Attributes:
        status_code: the HTTP status, when the server answered.
        retryable: whether the same request may succeed if sent again (possibly elsewhere).
        kind: a short label for metrics (`"timeout"`, `"http_5xx"`, ...).
        server: the base URL of the server that failed, when known.
        retry_after: seconds the server asked us to wait (`Retry-After`), when given.
        fatal: whether every request will fail the same way (see `fatal_reason`).
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
        fatal: bool = False,
    ) -> None:
        super().__init__(message)
        self.fatal = fatal
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
        url: str | None = None,
    ) -> InferenceError:
        """The error for an HTTP answer with status >= 400 (5xx, 408 and 429 are retryable;
        the statuses of `FATAL_STATUS` and the bodies of `FATAL_BODIES` are fatal, with the fix
        in the message). A 404 on a completion `url` of a `server` whose base URL does not end
        in /v1 says to add /v1 (`missing_v1`)."""
        if status >= 500:
            kind: ErrorKind = "http_5xx"
        elif status in RETRYABLE_STATUS:
            kind = "http_429"
        else:
            kind = "http_4xx"
        text = " ".join(body.split())[:500]
        message = f"HTTP {status}: {text}" if text else f"HTTP {status}"
        configured = _fatal_body(text)
        fix = (missing_v1(server, url) if status == 404 else None) or FATAL_STATUS.get(status)
        fix = fix or configured
        return cls(
            f"{message} ({fix})" if fix else message,
            status_code=status,
            retryable=kind != "http_4xx" and configured is None,
            kind=kind,
            server=server,
            retry_after=retry_after,
            fatal=fix is not None,
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
        super().__init__(message, retryable=False, kind="unsupported", server=server, fatal=True)
