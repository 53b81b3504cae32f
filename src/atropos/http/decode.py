"""Request bodies decoded as JSON: every failure is a 400 naming what is wrong, never an
exception a server turns into a 5xx.

msgspec decodes (in C, several times faster than `json`); its nesting limit is Python's
recursion limit, and a deeper body (`[[[[...` 100k levels) is "nested too deeply", not a
`RecursionError` escaping the handler. Bytes that are not UTF-8 are "not valid UTF-8".

>>> json_object(b'{"n": 2}')
{'n': 2}
>>> json_object(b'[' * 100000)
Traceback (most recent call last):
...
atropos.wire.ProtocolError: the body is nested too deeply: flatten it
>>> json_object(b'{"a": "\\xff"}')
Traceback (most recent call last):
...
atropos.wire.ProtocolError: the body is not valid UTF-8: send UTF-8 text
"""

from __future__ import annotations

from typing import Any

import msgspec

from atropos.wire import ProtocolError

__all__ = ["check_utf8", "json_body", "json_object"]

_DECODER = msgspec.json.Decoder()


def json_body(raw: bytes) -> Any:
    """`raw` decoded as JSON; ProtocolError 400 when it is not JSON, not UTF-8 or too deep."""
    try:
        return _DECODER.decode(raw)
    except RecursionError:
        raise ProtocolError("the body is nested too deeply: flatten it", 400) from None
    except UnicodeError:
        raise ProtocolError("the body is not valid UTF-8: send UTF-8 text", 400) from None
    except msgspec.DecodeError as err:
        raise ProtocolError(f"the body is not JSON: {str(err)[:200]}", 400) from None


def json_object(raw: bytes) -> dict[str, Any]:
    """`json_body(raw)`, which must be a JSON object (ProtocolError 400 otherwise)."""
    body = json_body(raw)
    if not isinstance(body, dict):
        raise ProtocolError("the body must be a JSON object", 400)
    return body


def check_utf8(raw: bytes) -> None:
    """ProtocolError 400 unless `raw` is UTF-8. For a body a typed decoder reads only in part
    (msgspec skips the keys a struct does not name, unchecked): ASCII, most bodies of token
    ids, is told in one pass at memory speed and never decoded.

    >>> check_utf8('{"name": "café"}'.encode())
    >>> check_utf8('{"name": "café"}'.encode("latin-1"))
    Traceback (most recent call last):
    ...
    atropos.wire.ProtocolError: the body is not valid UTF-8: send UTF-8 text
    """
    if raw.isascii():
        return
    try:
        raw.decode()
    except UnicodeDecodeError:
        raise ProtocolError("the body is not valid UTF-8: send UTF-8 text", 400) from None
