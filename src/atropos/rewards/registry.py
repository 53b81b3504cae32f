"""The reward registry: plain functions registered by name, and weighted combinations of them.

A reward is a plain function of one completion::

    @reward("exact", aliases=("exactmatch",))
    def exact(completion: Completion, *, answer: object = None, strip: bool = True) -> float:
        ...

`completion` is the model's text, or any shape upstream's `get_content` accepted (see
`text_of`); `answer` is the item's gold answer (None when the reward needs none); every other
parameter is keyword-only and set from config (`params`). Rewards declare their parameters
explicitly (no `**kwargs`), so a misspelt parameter in a config fails when it is read.

Lookup by name (`get`) accepts upstream's lossy names as aliases (`reasoningsteps`) and fails
with a "did you mean" suggestion. `build` turns config entries (`{name, weight, params}`) into a
`Combination`; a reward that raises is never scored 0 in silence: the error propagates as a
`RewardError` naming the reward.

>>> @reward("doc_length")
... def doc_length(completion: Completion, *, answer: object = None, per: int = 10) -> float:
...     return len(text_of(completion)) / per
>>> get("doc-length") is doc_length, get("doc_length")("abcde", per=5)
(True, 1.0)
>>> get("doc_lenght")
Traceback (most recent call last):
...
atropos.rewards.registry.RewardNotFound: unknown reward 'doc_lenght'; did you mean 'doc_length'? ...
>>> unregister("doc_length")
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from atropos.names import did_you_mean

Completion = str | Mapping[str, Any] | Sequence[Mapping[str, Any]]
RewardFn = Callable[..., float]
F = TypeVar("F", bound=RewardFn)
Normalization = Literal["none", "sum", "minmax"]
NORMALIZATIONS: tuple[str, ...] = ("none", "sum", "minmax")

_rewards: dict[str, RewardFn] = {}
_aliases: dict[str, str] = {}  # alias -> canonical name


class RewardNotFound(LookupError):
    """No reward is registered under that name (or alias)."""


class RewardError(RuntimeError):
    """A reward function raised; the message names the reward, `__cause__` is the original."""


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def _same(a: RewardFn, b: RewardFn) -> bool:
    """The same function, possibly imported twice (same file and qualified name)."""
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    return a is b or (
        code_a is not None
        and code_b is not None
        and code_a.co_filename == code_b.co_filename
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def reward(name: str, *, aliases: Iterable[str] = ()) -> Callable[[F], F]:
    """Register the decorated function as the reward `name` (and `aliases`); returns it as is.

    Raises:
        ValueError: the name or an alias is taken by another function.
    """

    def register(fn: F) -> F:
        for key in (_key(name), *(_key(a) for a in aliases)):
            taken = _rewards.get(_aliases.get(key, key))
            if taken is not None and not _same(taken, fn):
                raise ValueError(f"reward name {key!r} is already taken by {taken.__qualname__}")
        _rewards[_key(name)] = fn
        for alias in aliases:
            _aliases[_key(alias)] = _key(name)
        return fn

    return register


def unregister(name: str) -> None:
    """Remove the reward `name` and its aliases (for tests)."""
    key = canonical(name)
    del _rewards[key]
    for alias in [a for a, target in _aliases.items() if target == key]:
        del _aliases[alias]


def names() -> list[str]:
    """The registered rewards' canonical names, sorted."""
    return sorted(_rewards)


def aliases() -> dict[str, str]:
    """Every alias and the canonical name it stands for (`{"reasoningsteps": ...}`)."""
    return dict(sorted(_aliases.items()))


def canonical(name: str) -> str:
    """The canonical name of `name` (itself, or the name an alias stands for).

    Raises:
        RewardNotFound: unknown name; the message suggests the closest one and lists them all.
    """
    key = _key(name)
    key = _aliases.get(key, key)
    if key in _rewards:
        return key
    known = [*_rewards, *_aliases]
    hint = did_you_mean(key, known, lambda k: repr(_aliases.get(k, k)))
    raise RewardNotFound(
        f"unknown reward {name!r}{hint} (available: {', '.join(names())}; register a new one"
        " with @atropos.rewards.reward('name'))"
    )


def get(name: str) -> RewardFn:
    """The reward function registered as `name` (a canonical name or an alias)."""
    return _rewards[canonical(name)]


def call(name: str, completion: Completion, *, answer: object = None, **params: Any) -> float:
    """Score one completion with the reward `name`.

    Raises:
        RewardNotFound: unknown name.
        RewardError: the reward raised (the message names it and the error).
    """
    fn = get(name)
    try:
        return float(fn(completion, answer=answer, **params))
    except Exception as e:
        raise RewardError(f"reward {canonical(name)!r} failed: {type(e).__name__}: {e}") from e


def text_of(completion: Completion) -> str:
    """The text of a completion, in any shape upstream's `get_content` accepted.

    A string; a message `{"role": "assistant", "content": ...}` (content a string or a list of
    `{"type": "text", "text": ...}` parts); a choice `{"message": {...}}`; or a list of
    messages (the first assistant message's content).

    >>> text_of("hi"), text_of({"role": "assistant", "content": "hi"})
    ('hi', 'hi')
    >>> text_of({"message": {"content": [{"type": "text", "text": "h"}, {"text": "i"}]}})
    'hi'
    >>> text_of([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    'a'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        if "message" in completion and "content" not in completion:
            return text_of(completion["message"])
        content = completion.get("content")
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        raise TypeError(f"message content must be a string or parts, got {type(content).__name__}")
    if isinstance(completion, Sequence):
        for message in completion:
            if isinstance(message, Mapping) and message.get("role") == "assistant":
                return text_of(message)
        raise ValueError("no assistant message in the list of messages")
    raise TypeError(
        "a completion is a string, a message dict, {'message': {...}} or a list of messages;"
        f" got {type(completion).__name__}"
    )


def override_weights(
    defaults: Mapping[str, float], given: Mapping[str, float] | None, owner: str, kind: str
) -> dict[str, float]:
    """`defaults` with the weights `given` (a reward's parameter) put in place of theirs.

    Raises:
        ValueError: `given` names no `kind` of `defaults`; the message, prefixed with `owner`,
            suggests the closest name and lists them all.

    >>> override_weights({"a": 1.0, "b": 0.5}, {"b": 0}, "demo", "part")
    {'a': 1.0, 'b': 0.0}
    >>> override_weights({"a": 1.0}, {"aa": 2}, "demo", "part")
    Traceback (most recent call last):
    ...
    ValueError: demo: unknown part 'aa'; did you mean 'a'? (parts: a)
    """
    weights = dict(defaults)
    for name, weight in (given or {}).items():
        if name not in weights:
            hint = did_you_mean(name, weights, repr)
            raise ValueError(
                f"{owner}: unknown {kind} {name!r}{hint} ({kind}s: {', '.join(weights)})"
            )
        weights[name] = float(weight)
    return weights


def _parameters(fn: RewardFn) -> dict[str, inspect.Parameter]:
    """The config parameters of a reward: its keyword-only parameters but `answer`."""
    return {
        n: p
        for n, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and n != "answer"
    }


@dataclass(frozen=True)
class Term:
    """One reward of a combination: its name, weight and parameters."""

    name: str
    weight: float = 1.0
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fn(self) -> RewardFn:
        return get(self.name)

    def __call__(self, completion: Completion, *, answer: object = None) -> float:
        """The reward's value, unweighted; a failure raises `RewardError` naming it."""
        try:
            value = float(self.fn(completion, answer=answer, **self.params))
        except Exception as e:
            raise RewardError(f"reward {self.name!r} failed: {type(e).__name__}: {e}") from e
        if math.isnan(value):
            raise RewardError(f"reward {self.name!r} returned NaN")
        return value


@dataclass(frozen=True)
class Combination:
    """A weighted combination of rewards (what `build` returns).

    Normalization, always with the weights honoured (a weight-2 reward counts twice):

    - `none`: the weighted sum, `sum(w * r)`.
    - `sum`: the weighted mean, `sum(w * r) / sum(|w|)` (scores stay on the rewards' scale).
    - `minmax`: the weighted sum, then rescaled to [0, 1] across a group (`score_group`;
      a group whose sums are all equal scores 0.0). One completion alone has no group, so
      `__call__` gives its weighted sum.

    >>> c = build([{"name": "format", "weight": 2.0}, "accuracy"], normalization="sum")
    >>> c("<think>7 * 6</think><answer>42</answer>", answer="42"), c("42", answer="42")
    (1.0, 0.3333333333333333)
    """

    terms: tuple[Term, ...]
    normalization: Normalization = "none"

    def components(self, completion: Completion, *, answer: object = None) -> dict[str, float]:
        """Each reward's unweighted value by name (repeats get `#2`, `#3`)."""
        out: dict[str, float] = {}
        for term in self.terms:
            key, n = term.name, 2
            while key in out:
                key, n = f"{term.name}#{n}", n + 1
            out[key] = term(completion, answer=answer)
        return out

    def __call__(self, completion: Completion, *, answer: object = None) -> float:
        total = sum(t.weight * t(completion, answer=answer) for t in self.terms)
        if self.normalization == "sum":
            scale = sum(abs(t.weight) for t in self.terms)
            return total / scale if scale else 0.0
        return total

    def normalize_group(self, scores: Sequence[float]) -> list[float]:
        """A group's scores (from `__call__`) after group normalization (`minmax` only).

        >>> build(["accuracy"], normalization="minmax").normalize_group([2.0, 4.0, 3.0])
        [0.0, 1.0, 0.5]
        """
        if self.normalization != "minmax":
            return list(scores)
        low, high = min(scores, default=0.0), max(scores, default=0.0)
        if high == low:
            return [0.0 for _ in scores]
        return [(s - low) / (high - low) for s in scores]

    def score_group(
        self, completions: Sequence[Completion], *, answer: object = None
    ) -> list[float]:
        """Every completion of a group scored, then group-normalized."""
        return self.normalize_group([self(c, answer=answer) for c in completions])


def _term(entry: object, where: str) -> Term:
    if isinstance(entry, Term):
        entry = {"name": entry.name, "weight": entry.weight, "params": dict(entry.params)}
    if isinstance(entry, str):
        entry = {"name": entry}
    if not isinstance(entry, Mapping):
        raise ValueError(
            f"{where}: expected a reward name or {{name, weight, params}}, got {entry!r}"
        )
    unknown = set(entry) - {"name", "weight", "params"}
    for key in sorted(map(str, unknown)):
        hint = did_you_mean(key, ["name", "weight", "params"], repr)
        raise ValueError(f"{where}: unknown key {key!r}{hint} (keys: name, weight, params)")
    if not isinstance(entry.get("name"), str):
        raise ValueError(
            f"{where}.name: a reward name is required (available: {', '.join(names())})"
        )
    try:
        name = canonical(entry["name"])
    except RewardNotFound as e:
        raise ValueError(f"{where}.name: {e}") from None
    weight = entry.get("weight", 1.0)
    if (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not math.isfinite(weight)
    ):
        raise ValueError(f"{where}.weight: expected a finite number, got {weight!r}")
    params = entry.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"{where}.params: expected a mapping, got {type(params).__name__}")
    accepted = _parameters(get(name))
    for key in params:
        if key not in accepted:
            hint = did_you_mean(str(key), accepted, repr, lead="", tail="? ")
            raise ValueError(
                f"{where}.params: reward {name!r} has no parameter {key!r}; {hint}"
                f"(parameters: {', '.join(accepted) or 'none'})"
            )
    if name == "combined":  # check the nested entries now, not on the first completion
        if params.get("normalization") == "minmax":
            raise ValueError(
                f"{where}.params.normalization: combined cannot use minmax (per group)"
            )
        build(params.get("rewards") or [], params.get("normalization", "none"), f"{where}.params")
    return Term(name, float(weight), dict(params))


def build(
    entries: Iterable[object], normalization: str = "none", where: str = "rewards"
) -> Combination:
    """A `Combination` from config entries: reward names, or `{name, weight, params}` mappings.

    Every name, weight and parameter is checked here; `where` prefixes error messages (the
    config field or file the entries come from).

    Raises:
        ValueError: an entry is malformed, names an unknown reward (with a suggestion), or
            sets a parameter the reward does not have.

    >>> build([{"name": "acuracy"}])
    Traceback (most recent call last):
    ...
    ValueError: rewards[0].name: unknown reward 'acuracy'; did you mean 'accuracy'? ...
    """
    if normalization not in NORMALIZATIONS:
        hint = did_you_mean(str(normalization), NORMALIZATIONS, repr)
        raise ValueError(
            f"{where}: unknown normalization {normalization!r}{hint} (one of none, sum, minmax)"
        )
    if isinstance(entries, (str, Mapping)):
        entries = [entries]
    terms = tuple(_term(entry, f"{where}[{i}]") for i, entry in enumerate(entries))
    if not terms:
        raise ValueError(f"{where}: no rewards given (available: {', '.join(names())})")
    return Combination(terms, normalization)  # type: ignore[arg-type]
