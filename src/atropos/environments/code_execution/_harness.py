"""The judge of `CodeRunner.run(..., tests=...)`: the tests in one process, the code in another.

Run by `_runner` in the sandbox (passed as text, never imported by the package), it splits a
test run in two processes of the sandbox:

- the **judge** runs the tests (the problem's preamble, setup and asserts: trusted text from the
  dataset). It is the sandbox's child; it alone holds the report pipe, and it writes the verdict
  there (`{"tests": {"passed": ..., "reason": ...}}`) only after the last test has run;
- the **candidate** process, forked by the judge, runs the preamble and the code under test,
  then answers the judge's requests: call this function, compare this object, read this
  attribute. Every name the code defines is, in the judge, a `Remote` that forwards to it.

Threat model (reward hacking). The code under test runs in a process that holds no secret and
no way to report: the report pipe is closed in it before any of its code runs, there is no
marker in any file, argument or environment, and the tests are never in its files or memory
(the judge reads them from a file it removes before the fork). Its only output to the judge is
data: JSON with tagged containers, numbers, strings, `Fraction`, `Decimal`, and opaque handles
for everything else, decoded without running any of its code (never unpickled). So it may
print what it likes, exit early (`os._exit(0)`, `sys.exit(0)`, `atexit` hooks), patch
builtins, `assert` or the harness's functions in its own process, or walk `gc` and frames: the
judge sees a dead or lying peer, and a run counts as passed only on the judge's positive report
after every test ran. The judge is not dumpable (`PR_SET_DUMPABLE` 0), so a same-uid candidate
cannot ptrace it or read its memory (`/proc/<judge>/mem`); it can kill it, which fails the run.

Comparisons are the judge's: what decides a test (`==`, `!=`, `<`, `<=`, `>`, `>=`, truth,
`in`) and arithmetic (`+ - * / // % **`, `abs`, unary `-`) run in the judge on its own decoded
copies of plain data, never in the candidate. A returned object of the code's own class is a
handle, and comparing it, testing its truth, searching it or computing with it (`x == y`,
`assert x`, `y in x`, `abs(x - y) < 1e-6`, in any test form: MBPP asserts, HumanEval's
`check(candidate)`, setup code) fails the test with `NotPlainData`, which no test can catch.
So an object whose `__eq__` is always true fails, so does one whose `__sub__` returns 0 against
a tolerance check, and so does a `tuple` subclass overriding `__eq__` (sent as the plain tuple
of its items). Other operations on handles (calling, reading attributes, `len`, iterating,
indexing, `int`, `float`, `str`) still run in the candidate, which sees no expected value
there: their results are data the judge compares. What stays possible is reward hacking
*inside the rules*: hard-coding the answers to the asserts shown in the prompt passes. (A
function named like a built-in the tests call, `def abs(x): return 0`, is a name the judge
would call; `problems.jobs_for` gives the tests back the built-ins, all but the entry point.)

Differences from running tests and code in one process (honest code is unaffected in the common
case): arguments reach the code as copies (lists, dicts and sets it changes in place are copied
back); values the judge passes that cannot be pickled (a lambda defined by a test) fail the test;
a returned object of another type than the plain ones above is a handle, so `type(x) is Foo` in a
test fails, and so does comparing or computing with it (`obj == obj2`, `assert obj`, `obj + 1`)
even where its methods are honest: use its plain attributes or results instead. Module objects
the code imports are imported anew in the judge by name.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
import struct
import sys
import traceback
from typing import Any

MAX_MESSAGE = 256 * 2**20  # a reply larger than this is refused (the peer is lying or broken)
HEADER = struct.Struct("!Q")
REASON_EXITED = "exited_early"  # the candidate process ended before the tests did
# what decides a test, and arithmetic (which would hand the tests' value to the candidate's
# code, as `abs(f(x) - expected) < 1e-6` does): the judge's alone, on plain data
ARITHMETIC = "add sub mul truediv floordiv mod pow".split()
VERDICT_OPS: tuple[str, ...] = ("eq", "ne", "lt", "le", "gt", "ge", "bool", "contains")
VERDICT_OPS += ("abs", "neg", *ARITHMETIC, *(f"r{name}" for name in ARITHMETIC))

# ----- framing ---------------------------------------------------------------------------------


def send(fd: int, payload: bytes) -> None:
    """Write one length-prefixed message."""
    data = memoryview(HEADER.pack(len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int) -> bytes | None:
    """Read one message; None when the peer is gone or sent a frame too large to be honest."""
    header = _read_exactly(fd, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    return None if size > MAX_MESSAGE else _read_exactly(fd, size)


# ----- the candidate's side (untrusted: everything here may be subverted, and that is fine) -----


def _encode(value: Any, handles: list[Any]) -> Any:
    """A JSON-able, tagged form of `value`; objects that are not plain data become handles."""
    kind = type(value)
    if value is None or kind in (bool, str) or (kind is int and abs(value) < 2**53):
        return value
    if kind is int:
        return {"i": hex(value)}  # no digit limit, unlike str()
    if kind is float:
        return {"f": repr(value)}
    if kind is complex:
        return {"c": [repr(value.real), repr(value.imag)]}
    if kind is bytes:
        return {"b": value.hex()}
    for base, tag in ((list, "l"), (tuple, "t"), (set, "s"), (frozenset, "fs")):
        if isinstance(value, base) and (kind is base or tag == "t"):  # namedtuples as tuples
            return {tag: [_encode(v, handles) for v in value]}
    if isinstance(value, dict) and kind.__module__ in ("builtins", "collections"):
        return {"d": [[_encode(k, handles), _encode(v, handles)] for k, v in value.items()]}
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name == "fractions.Fraction":
        return {"fr": [hex(value.numerator), hex(value.denominator)]}
    if name == "decimal.Decimal":
        return {"dec": str(value)}
    handles.append(value)
    return {"h": len(handles) - 1}


def _operations() -> dict[str, Any]:
    import operator

    ops: dict[str, Any] = {
        "call": lambda f, *a, **k: f(*a, **k),
        "getattr": getattr,
        "setattr": setattr,
        "iter": iter,
        "next": next,
        "len": len,
        "str": str,
        "repr": repr,
        "hash": hash,
        "int": int,
        "float": float,
        "index": operator.index,
        "getitem": operator.getitem,
        "setitem": operator.setitem,
    }
    return ops


def serve(request_fd: int, reply_fd: int, source: str, filename: str) -> int:
    """Run the code, send its names, then answer requests until the judge closes the pipe."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(source, filename, "exec"), namespace)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__ and e.__traceback__.tb_next)
        sys.stderr.flush()
        send(reply_fd, json.dumps({"failed": True}).encode())
        return 1
    for stream in (sys.stdout, sys.stderr):  # its output, before the judge may kill it
        stream.flush()
    handles: list[Any] = []
    names: dict[str, Any] = {}
    for name, value in namespace.items():
        if not name.startswith("__"):
            is_module = type(value) is type(sys)
            names[name] = {"m": value.__name__} if is_module else _encode(value, handles)
    send(reply_fd, json.dumps({"names": names}).encode())
    ops = _operations()

    class Loader(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return handles[pid]

    while (message := receive(request_fd)) is not None:
        try:
            op, args, kwargs = Loader(io.BytesIO(message)).load()
            result = ops[op](*args, **kwargs)
            after = [_encode(a, handles) if type(a) in (list, dict, set) else None for a in args]
            reply = {"ok": _encode(result, handles), "after": after}
        except BaseException as e:
            reply = {"raised": type(e).__name__, "message": str(e)[:2000]}
        send(reply_fd, json.dumps(reply).encode())
    return 0


# ----- the judge's side (trusted: runs the dataset's tests, never the candidate's code) ---------


class CandidateExited(BaseException):
    """The candidate process ended (or broke the protocol) while the tests needed it."""


class NotPlainData(BaseException):
    """A test compared, tested the truth of, or searched an object of the candidate (a
    handle): a failed test that no test can catch as an Exception."""


class Peer:
    """The judge's end of the pipes to the candidate process."""

    def __init__(self, request_fd: int, reply_fd: int) -> None:
        self.request_fd, self.reply_fd = request_fd, reply_fd

    def reply(self) -> dict[str, Any]:
        data = receive(self.reply_fd)
        if data is None:
            raise CandidateExited("the code under test ended before the tests did")
        try:
            message = json.loads(data)
        except (ValueError, RecursionError):
            raise CandidateExited("the code under test sent an unreadable reply") from None
        if not isinstance(message, dict):
            raise CandidateExited("the code under test sent an unreadable reply")
        return message

    def ask(self, op: str, *args: Any, **kwargs: Any) -> Any:
        buffer = io.BytesIO()
        _Dumper(buffer).dump((op, args, kwargs))
        send(self.request_fd, buffer.getvalue())
        message = self.reply()
        if "raised" in message:
            raise _exception(str(message["raised"]), str(message.get("message", "")))
        result = self.decode(message.get("ok"))
        after = message.get("after")
        for original, changed in zip(args, after if isinstance(after, list) else [], strict=False):
            if changed is not None:
                _copy_back(original, self.decode(changed))
        return result

    def decode(self, value: Any) -> Any:
        """The judge's copy of a value the candidate sent; nothing of the candidate's code runs."""
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, list):
            raise CandidateExited("the code under test sent an untagged list")
        if not isinstance(value, dict) or len(value) != 1:
            raise CandidateExited("the code under test sent an unreadable value")
        [(tag, body)] = value.items()
        items = (lambda: [self.decode(v) for v in body]) if isinstance(body, list) else None
        if tag == "h" and isinstance(body, int):
            return Remote(self, body)
        if tag == "i" and isinstance(body, str):
            return int(body, 16)
        if tag == "f" and isinstance(body, str):
            return float(body)
        if tag == "c" and isinstance(body, list) and len(body) == 2:
            return complex(float(body[0]), float(body[1]))
        if tag == "b" and isinstance(body, str):
            return bytes.fromhex(body)
        if tag == "fr" and isinstance(body, list) and len(body) == 2:
            from fractions import Fraction

            return Fraction(int(body[0], 16), int(body[1], 16))
        if tag == "dec" and isinstance(body, str):
            from decimal import Decimal

            return Decimal(body)
        if items is not None and tag in ("l", "t", "s", "fs"):
            kinds = {"l": list, "t": tuple, "s": set, "fs": frozenset}
            return kinds[tag](items())
        if tag == "d" and isinstance(body, list):
            if not all(isinstance(p, list) and len(p) == 2 for p in body):
                raise CandidateExited("the code under test sent an unreadable dict")
            return {self.decode(k): self.decode(v) for k, v in body}
        raise CandidateExited(f"the code under test sent an unknown value tag {tag!r}")


class _Dumper(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj._handle if type(obj) is Remote else None


def _exception(name: str, message: str) -> BaseException:
    """The judge-side exception for one the candidate raised: the built-in of that name, or
    RuntimeError; exits become `CandidateExited`, which no test can catch as an Exception."""
    kind = getattr(builtins, name, None)
    if name in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
        return CandidateExited(f"the code under test raised {name} {message}".strip())
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except Exception:
            pass
    return RuntimeError(f"{name}: {message}")


def _copy_back(original: Any, changed: Any) -> None:
    """Mirror an in-place change the candidate made to a list, dict or set argument."""
    if type(original) is list and type(changed) is list:
        original[:] = changed
    elif type(original) in (dict, set) and type(changed) is type(original):
        original.clear()
        original.update(changed)


class Remote:
    """An object of the candidate process, seen from the judge: every operation is a request."""

    __slots__ = ("_handle", "_peer")

    def __init__(self, peer: Peer, handle: int) -> None:
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_handle", handle)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._peer.ask("getattr", self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._peer.ask("setattr", self, name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._peer.ask("call", self, *args, **kwargs)

    def __iter__(self) -> Any:
        return self._peer.ask("iter", self)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._peer.ask("setitem", self, key, value)


def _forward(op: str) -> Any:
    def method(self: Remote, *args: Any) -> Any:
        return self._peer.ask(op, self, *args)

    method.__name__ = f"__{op}__"
    return method


def _refuse(op: str) -> Any:
    def method(self: Remote, *args: Any) -> Any:
        raise NotPlainData(
            f"the code under test gave an object of its own (a handle), not plain data, where"
            f" the tests ask for `__{op}__`: only None, bool, int, float, complex, str, bytes,"
            " list, tuple, set, dict, Fraction and Decimal are compared and computed with (by"
            " the judge)"
        )

    method.__name__ = f"__{op}__"
    return method


for _op in "next len str repr hash int float index getitem".split():
    setattr(Remote, f"__{_op}__", _forward(_op))
for _op in VERDICT_OPS:  # answered by the judge on plain data, never by the candidate's code
    setattr(Remote, f"__{_op}__", _refuse(_op))


def judge(peer: Peer, tests: str, filename: str) -> tuple[bool, str]:
    """Run `tests` against the candidate's names; (passed, reason) where reason is "" when the
    tests passed, "error" after a failing test (its traceback is on stderr) or `REASON_EXITED`."""
    try:
        first = peer.reply()
        if first.get("failed"):
            return False, "error"  # its traceback is already on stderr
        names = first.get("names")
        if not isinstance(names, dict):
            raise CandidateExited("the code under test sent no names")
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        for name, value in names.items():
            if isinstance(value, dict) and set(value) == {"m"}:
                try:
                    namespace[name] = __import__(str(value["m"]))
                    for part in str(value["m"]).split(".")[1:]:
                        namespace[name] = getattr(namespace[name], part)
                except (ImportError, AttributeError):
                    continue
            else:
                namespace[str(name)] = peer.decode(value)
        exec(compile(tests, filename, "exec"), namespace)
    except CandidateExited as e:
        print(f"{filename}: {e}", file=sys.stderr)
        return False, REASON_EXITED
    except NotPlainData as e:
        print(f"{filename}: NotPlainData: {e}", file=sys.stderr)
        return False, "error"
    except BaseException as e:
        traceback.print_exception(type(e), e, e.__traceback__ and e.__traceback__.tb_next)
        return False, "error"
    return True, ""
