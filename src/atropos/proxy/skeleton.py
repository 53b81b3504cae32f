"""Template skeletons: the text a chat template writes for messages of a known shape, with holes
where their contents go, proved content-blind by one traced render.

The one-render window of a proxy session (`atropos.proxy.incremental`) still runs the Jinja
template once per call, for the head, the answer the agent got and the messages it adds; that
render was the largest single step left in a continued call. But the call's messages have the
same *shape* call after call (an assistant message, then a user message; the same roles and
keys, the same head and tools): only their strings change. A `Skeleton` renders that shape once
with every string field of the new messages replaced by a `Traced` marker, a `str` whose every
use the template can make is seen:

- written out (`{{ x }}`, `~`, `+`, a macro's or a `{% set %}` block's text, `join`): the
  marker's text lands in the output, and where it lands is a hole;
- tested (`in`, `==`, `!=`, truthiness, `startswith`, `endswith`, `is...` methods): the answer
  is recorded, and the skeleton is used for a later call only where the same tests give the same
  answers on its strings (so Qwen3's `'</think>' in content` picks the skeleton of the branch
  it took);
- stripped (`trim`, `strip`, `lstrip`, `rstrip`): a new marker, whose hole takes the stripped
  string;
- anything else (indexing, slicing, `split`, `replace`, `length`, `tojson`, `format`, sorting,
  hashing, a filter or test not listed, a global such as `strftime_now`): the render is marked
  *touched* and no skeleton is kept for the shape (the window renders it every call, as
  before).

That covers what Python lets a template do with a `str` in the sandbox: its operators and
methods reach the marker's own methods, and what would turn it into a plain `str` out of sight
(the joins of `~`, of `{% set %}` blocks and macros, `%` formatting, the filters) runs through
the traced environment's `concat`, `str_join` and wrapped filters, tests and globals, which keep
the result traced. A marker's text holds `"`, `\\`, a newline, `<`, `&` and `'` between two
private-use characters, so any escaping (JSON, HTML, `repr`) leaves no whole marker, and an
output with a stray private-use character is refused. The skeleton is kept only if, filled
with the traced call's own strings, it gives the template's real render of that call, byte for
byte.

The traced render uses its own compile of the template, in an overlay of the template's
environment (same filters, tests, globals and sandbox, each wrapped); the tokenizer's compiled
template is not touched.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import re
import weakref
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Message", "Skeleton", "Tracer", "per_template", "shape_of", "traced_template"]

Message = dict[str, Any]  # a chat message as the dialects build it (the window's too)
_OPEN, _CLOSE = "\ue000", "\ue001"
_BODY = "\"\\\n<&'"  # what any escaping would change
_MARK = re.compile(re.escape(_OPEN) + r"(\d+)" + re.escape(_BODY + _CLOSE))

#: String methods whose answer a skeleton records and checks again on a later call's strings.
_TESTS = frozenset(
    {
        "startswith", "endswith", "isspace", "isdigit", "isalpha", "isalnum", "islower",
        "isupper", "istitle", "isnumeric", "isdecimal", "isidentifier", "isascii",
    }
)  # fmt: skip
_STRIPS = frozenset({"strip", "lstrip", "rstrip"})
#: Filters that may see a traced string inside a list or dict (they hand back its items, or
#: count or order them through the markers' own methods); any other filter given one touches.
_ITEM_FILTERS = frozenset(
    {
        "list", "first", "last", "reverse", "map", "select", "reject", "selectattr",
        "rejectattr", "batch", "slice", "default", "d", "length", "count", "items", "attr",
        "dictsort", "sort", "unique", "min", "max", "groupby", "sum", "string",
    }
)  # fmt: skip
#: Tests that may be given a traced string: by type, or by the markers' own methods.
_SAFE_TESTS = frozenset(
    {
        "string", "defined", "undefined", "none", "mapping", "iterable", "sequence", "number",
        "integer", "float", "boolean", "true", "false", "callable", "eq", "equalto", "==",
        "ne", "!=", "in", "lower", "upper", "odd", "even",
    }
)  # fmt: skip
_OPS: dict[str, Callable[..., Any]] = {
    "in": operator.contains,
    "eq": operator.eq,
    "ne": operator.ne,
    "bool": bool,
}


class Tracer:
    """One traced render's markers and what the template did with them."""

    def __init__(self) -> None:
        self.touched: str | None = None  # the first use that makes the shape unusable
        #: marker number -> (field: (message index, key), the strips applied to it)
        self.holes: dict[int, tuple[tuple[int, str], tuple[tuple[str, Any], ...]]] = {}
        self.tests: list[tuple[int, str, tuple[Any, ...], Any]] = []  # (marker, op, args, answer)
        self.values: dict[int, str] = {}  # marker number -> the string it stands for
        self._numbers = itertools.count()

    def marker(
        self, field: tuple[int, str], strips: tuple[tuple[str, Any], ...], value: str
    ) -> Traced:
        """A marker for `field` (message index, key), stripped by `strips`, whose tests answer
        as `value` (the real string, so the render takes the branch the real one takes)."""
        n = next(self._numbers)
        self.holes[n] = (field, strips)
        self.values[n] = value
        return Traced(f"{_OPEN}{n}{_BODY}{_CLOSE}", self, n)

    def joined(self, text: str) -> Traced:
        """A text made by joining markers with other text: it may be written, not tested."""
        return Traced(text, self, -1)

    def touch(self, why: str) -> None:
        if self.touched is None:
            self.touched = why


class Traced(str):
    """A marker standing for one string field of a message (or a text joined from them)."""

    def __new__(cls, text: str, tracer: Tracer, number: int) -> Traced:
        self = super().__new__(cls, text)
        self.__dict__.update(_tracer=tracer, _number=number)
        return self

    # written out ------------------------------------------------------------------------------
    def __str__(self) -> str:
        return self

    def __add__(self, other: Any) -> Any:
        if not isinstance(other, str):
            return NotImplemented
        return _tracer(self).joined(str.__add__(_plain(self), _plain(other)))

    def __radd__(self, other: Any) -> Any:
        if not isinstance(other, str):
            return NotImplemented
        return _tracer(self).joined(str.__add__(_plain(other), _plain(self)))

    # tested -----------------------------------------------------------------------------------
    def __contains__(self, item: Any) -> bool:
        return bool(self._test("in", (item,)))

    def __eq__(self, other: Any) -> bool:
        return bool(self._test("eq", (other,)))

    def __ne__(self, other: Any) -> bool:
        return bool(self._test("ne", (other,)))

    def __bool__(self) -> bool:
        return bool(self._test("bool", ()))

    def __hash__(self) -> int:
        _tracer(self).touch("hashed")
        return str.__hash__(self)

    def _test(self, op: str, args: tuple[Any, ...]) -> Any:
        tracer, number = _tracer(self), _number(self)
        plain = tracer.values.get(number, _plain(self))
        fn = _OPS.get(op) or getattr(str, op)
        answer = fn(plain, *(_plain(a) if isinstance(a, Traced) else a for a in args))
        if number < 0 or any(isinstance(a, Traced) for a in args):
            tracer.touch(f"tested {op}")
        else:
            tracer.tests.append((number, op, args, answer))
        return bool(answer) if op == "bool" else answer

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__"):
            return object.__getattribute__(self, name)
        if name in _TESTS:
            return lambda *args: self._test(name, args)
        if name in _STRIPS:
            return lambda chars=None: self._strip(name, chars)
        if name in ("_test", "_strip"):
            return object.__getattribute__(self, name)
        _tracer(self).touch(f"str.{name}")
        return getattr(_plain(self), name)

    def _strip(self, how: str, chars: Any) -> Any:
        tracer, number = _tracer(self), _number(self)
        hole = tracer.holes.get(number)
        if hole is None or not (chars is None or isinstance(chars, str)):
            tracer.touch(f"str.{how}")
            return getattr(_plain(self), how)(chars)
        value = getattr(tracer.values[number], how)(chars)
        return tracer.marker(hole[0], (*hole[1], (how, chars)), value)


def _touching(name: str) -> Callable[..., Any]:
    """A `str` operator that marks the render touched (its answer depends on the string in
    ways a skeleton does not record), then answers as `str` does."""

    def used(self: Traced, *args: Any) -> Any:
        _tracer(self).touch(name)
        return getattr(str, name)(_plain(self), *(_plain(a) for a in args))

    used.__name__ = name
    return used


for _name in (
    "__len__", "__iter__", "__getitem__", "__mod__", "__rmod__", "__mul__", "__rmul__",
    "__lt__", "__le__", "__gt__", "__ge__", "__repr__", "__format__",
):  # fmt: skip
    setattr(Traced, _name, _touching(_name))
del _name


def _tracer(value: Traced) -> Tracer:
    return object.__getattribute__(value, "__dict__")["_tracer"]  # type: ignore[no-any-return]


def _number(value: Traced) -> int:
    return object.__getattribute__(value, "__dict__")["_number"]  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    return str.__str__(value) if isinstance(value, Traced) else value


def _find(value: Any, depth: int = 3) -> Tracer | None:
    """The tracer of a marker in `value` (a list, tuple or dict, to `depth` levels), if any."""
    if isinstance(value, Traced):
        return _tracer(value)
    if depth and isinstance(value, (list, tuple)):
        for item in value:
            if (found := _find(item, depth - 1)) is not None:
                return found
    elif depth and isinstance(value, dict):
        for item in value.values():
            if (found := _find(item, depth - 1)) is not None:
                return found
    return None


def _args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], Tracer | None]:
    """The call's arguments with any iterator made a list (so its items can be looked at),
    and the tracer of a marker among them."""
    args = tuple(list(a) if isinstance(a, Iterator) else a for a in args)
    for value in (*args, *kwargs.values()):
        if (found := _find(value)) is not None:
            return args, found
    return args, None


def _wrap_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any, **kwargs: Any) -> Any:
        args, tracer = _args(args, kwargs)
        if tracer is None:
            return fn(*args, **kwargs)
        direct = bool(args) and isinstance(args[0], Traced)
        if name == "trim" and direct:  # do_trim(value, chars=None)
            chars = args[1] if len(args) > 1 else kwargs.get("chars")
            return args[0].strip(chars)
        if name == "join":  # the items' text, joined in C: written, not tested
            return tracer.joined(_plain(fn(*args, **kwargs)))
        if name not in _ITEM_FILTERS or (name in ("length", "count") and direct):
            tracer.touch(f"filter {name}")
        return fn(*args, **kwargs)

    return _passing(fn, traced)


def _wrap_test(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any, **kwargs: Any) -> Any:
        args, tracer = _args(args, kwargs)
        if tracer is not None and name not in _SAFE_TESTS:
            tracer.touch(f"test {name}")
        return fn(*args, **kwargs)

    return _passing(fn, traced)


def _wrap_global(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any, **kwargs: Any) -> Any:
        args, tracer = _args(args, kwargs)
        if name in ("strftime_now", "lipsum") and _TRACING:  # the time, or random text
            _TRACING[-1].touch(f"global {name}")
        elif tracer is not None and name not in ("namespace", "dict", "raise_exception"):
            tracer.touch(f"global {name}")
        return fn(*args, **kwargs)

    return _passing(fn, traced)


def _passing(fn: Callable[..., Any], traced: Callable[..., Any]) -> Callable[..., Any]:
    """`traced` with what Jinja reads off `fn` (whether it is passed the context)."""
    if hasattr(fn, "jinja_pass_arg"):
        traced.jinja_pass_arg = fn.jinja_pass_arg  # type: ignore[attr-defined]
    traced.__name__ = getattr(fn, "__name__", "traced")
    return traced


_TRACING: list[Tracer] = []  # the tracer of the render under way (for globals given no marker)
_TEMPLATES: weakref.WeakKeyDictionary[Any, tuple[str, Any]] = weakref.WeakKeyDictionary()


def traced_template(tokenizer: Any, template: Any) -> Any:
    """`tokenizer`'s chat template (its compiled `template`) compiled again in a traced overlay
    of its environment (a Jinja `Template`, rendered as `incremental._direct` renders); None
    when it cannot be made. Compiled once per tokenizer and template source."""
    return per_template(_TEMPLATES, tokenizer, lambda source: _traced(template, source))


def per_template(
    cache: weakref.WeakKeyDictionary[Any, tuple[str, Any]],
    tokenizer: Any,
    make: Callable[[str], Any],
) -> Any:
    """`make(source)` of `tokenizer`'s chat template source, kept in `cache` while the
    tokenizer lives and its template stays (made every call for a tokenizer that cannot be
    weakly referenced: test doubles); None for a tokenizer without a template."""
    source = getattr(tokenizer, "chat_template", None)
    if not isinstance(source, str):
        return None
    try:
        held = cache.get(tokenizer)
    except TypeError:
        held = None
    if held is not None and held[0] == source:
        return held[1]
    made = make(source)
    with contextlib.suppress(TypeError):
        cache[tokenizer] = (source, made)
    return made


def _traced(template: Any, source: str) -> Any:
    try:
        env = template.environment.overlay()
        env.filters = {k: _wrap_filter(k, f) for k, f in env.filters.items()}
        env.tests = {k: _wrap_test(k, f) for k, f in env.tests.items()}
        env.globals = {
            k: _wrap_global(k, f) if callable(f) and not isinstance(f, type) else f
            for k, f in env.globals.items()
        }
        env.concat = _concat
        compiled = env.from_string(source)
    except Exception:  # an environment this overlay cannot copy: no skeletons
        return None
    namespace = compiled.root_render_func.__globals__
    namespace["str_join"] = namespace["markup_join"] = _str_join
    return compiled


def _concat(pieces: Any) -> str:
    pieces = list(pieces)
    text = "".join(pieces)
    for piece in pieces:
        if isinstance(piece, Traced):
            return _tracer(piece).joined(text)
    return text


def _str_join(seq: Any) -> str:
    return _concat([str(piece) for piece in seq])


def shape_of(messages: list[Message], generation: bool) -> tuple[Any, ...] | None:
    """The key a skeleton is kept under: the messages' roles and keys (every other value a
    string), and the generation prompt; None for a message with another value (tool calls, a
    list of parts): those are rendered every call."""
    shape: list[Any] = [generation]
    for message in messages:
        role = message.get("role")
        if not isinstance(role, str):
            return None
        for key, value in message.items():
            if key != "role" and type(value) is not str:
                return None
        shape.append((role, tuple(message)))
    return tuple(shape)


class Skeleton:
    """The text of one shape: literal pieces and the holes between them."""

    __slots__ = ("pieces", "holes", "tests")

    def __init__(
        self,
        pieces: list[str],
        holes: list[tuple[tuple[int, str], tuple[tuple[str, Any], ...]]],
        tests: list[tuple[tuple[int, str], tuple[tuple[str, Any], ...], str, tuple[Any, ...], Any]],
    ) -> None:
        self.pieces = pieces
        self.holes = holes
        self.tests = tests

    @classmethod
    def build(
        cls,
        render: Callable[..., str],
        head: list[Message],
        new: list[Message],
        tools: Any,
        generation: bool,
        expected: str,
        skip: int = 0,
    ) -> Skeleton | None:
        """The skeleton of `head + new` traced by `render`, if the template used the new
        messages' strings only as this module allows and the skeleton filled with them gives
        `expected` (the real render); else None. With `skip`, the skeleton leaves out the
        render's first `skip` characters (the head's text, held by the caller: not kept once
        more per skeleton), which must come before any hole."""
        tracer = Tracer()
        traced = [
            {k: v if k == "role" else tracer.marker((i, k), (), v) for k, v in message.items()}
            for i, message in enumerate(new)
        ]
        _TRACING.append(tracer)
        try:
            text = render(head + traced, tools, generation)
        except Exception:
            return None
        finally:
            _TRACING.pop()
        if tracer.touched is not None:
            return None
        text = str.__str__(text) if isinstance(text, Traced) else text
        pieces: list[str] = []
        holes = []
        at = 0
        for match in _MARK.finditer(text):
            hole = tracer.holes.get(int(match.group(1)))
            if hole is None:
                return None
            pieces.append(text[at : match.start()])
            holes.append(hole)
            at = match.end()
        pieces.append(text[at:])
        if any(_OPEN in p or _CLOSE in p for p in pieces) or len(pieces[0]) < skip:
            return None  # a marker was cut or escaped, or a hole is in the skipped text
        if text[:skip] != expected[:skip]:
            return None
        pieces[0] = pieces[0][skip:]
        tests = []
        for number, op, args, answer in tracer.tests:
            field, strips = tracer.holes[number]
            tests.append((field, strips, op, args, answer))
        skeleton = cls(pieces, holes, tests)
        return skeleton if skeleton.fill(new) == expected[skip:] else None

    def fill(self, new: list[Message]) -> str | None:
        """The text for `new` (messages of this skeleton's shape), or None when one of the
        recorded tests answers otherwise for their strings."""
        for (index, key), strips, op, args, answer in self.tests:
            value = _stripped(new[index][key], strips)
            fn = _OPS.get(op) or getattr(str, op)
            if fn(value, *args) != answer:
                return None
        pieces = self.pieces
        out = [pieces[0]]
        for ((index, key), strips), piece in zip(self.holes, pieces[1:], strict=True):
            out.append(_stripped(new[index][key], strips) if strips else new[index][key])
            out.append(piece)
        return "".join(out)


def _stripped(value: str, strips: tuple[tuple[str, Any], ...]) -> str:
    for how, chars in strips:
        value = getattr(value, how)(chars)
    return value
