"""Settings that name some members of a fixed set: `--env.formats json,yaml`.

>>> named_subset("json, yaml", ["json", "yaml", "csv"], "format")
['json', 'yaml']
>>> named_subset(None, ["json", "yaml"], "format")
['json', 'yaml']
>>> named_subset(["jsno"], ["json", "yaml"], "format")
Traceback (most recent call last):
...
ValueError: unknown format 'jsno'; did you mean 'json'? (the formats: json, yaml)
"""

from __future__ import annotations

from collections.abc import Iterable

from atropos.names import did_you_mean

__all__ = ["named_subset"]


def named_subset(value: object, known: Iterable[str], what: str) -> list[str]:
    """The names in `value` (a comma-separated string or a list; None or empty: all of
    `known`), each once, in the order given; an unknown one raises ValueError naming the
    closest and listing them all."""
    available = list(known)
    if value is None:
        return available
    names = value.split(",") if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    chosen = list(dict.fromkeys(str(n).strip() for n in names if str(n).strip()))
    for name in chosen:
        if name not in available:
            hint = did_you_mean(name, available, repr)
            raise ValueError(f"unknown {what} {name!r}{hint} (the {what}s: {', '.join(available)})")
    return chosen or available
