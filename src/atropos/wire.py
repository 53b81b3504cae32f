"""The trajectory API's wire protocol: every body that crosses env -> API -> trainer.

One source of truth for request shapes. The structs are msgspec types, so decoding and type
checking happen in one C pass; cross-field rules (lengths, finiteness) live in `check_group`.
Field names and defaults are atroposlib 0.4.0's, so old clients and trainers see no difference;
fields marked *extension* are optional and old clients never send or read them.

Example:
    >>> group = decode_group(b'{"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0]}')
    >>> group.scores, group.env_id
    ([1.0], None)
"""

from __future__ import annotations

import inspect
import json
import math
from typing import Annotated, Any

import msgspec
from msgspec import Meta

SCHEMA_VERSION = 1

# ----- bounds at the door -------------------------------------------------------------------
# Every number the API keeps or computes with is bounded here, once, as a msgspec constraint,
# so a value that passes decoding can never overflow later (SQLite's 64-bit integers, float
# arithmetic, JavaScript's 2^53) and one client's registration can never break another's.

ENV_ID_MAX = 2**31 - 1
"""The largest env id (ids are list indexes; 0 is the first env)."""
STEP_MAX = 2**53 - 1
"""The largest step or policy version (exact in JavaScript; +1 per batch never overflows)."""
SIZE_MAX = 2**20
"""The largest batch_size or group_size, in sequences."""
INT32_MAX = 2**31 - 1
"""Bound of the other integers a trainer or env registers (lengths, intervals, step counts)."""
WEIGHT_MAX = 1e6
"""The largest |weight| of an env (weights are relative; 1.0 is upstream's default)."""
NAME_MAX = 1024
"""Characters in a name, key or id string (wandb names, env names, group ids, batch ids)."""
PATH_MAX = 4096
"""Characters in a path (`checkpoint_dir`)."""
DEPTH_MAX = 64
"""Nesting of lists and maps in a free-form field (`messages`, `images`, `*_params`, ...)."""

_FLOAT_MAX = 1.7976931348623157e308
Finite = Annotated[float, Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
"""A float that is not NaN or infinite (also when it comes as the string "nan" or "inf")."""
PositiveInt = Annotated[int, Meta(ge=1)]
Size = Annotated[int, Meta(ge=1, le=SIZE_MAX)]
Int32 = Annotated[int, Meta(ge=-INT32_MAX - 1, le=INT32_MAX)]
EnvId = Annotated[int, Meta(ge=0, le=ENV_ID_MAX)]
Step = Annotated[int, Meta(ge=0, le=STEP_MAX)]
Weight = Annotated[float, Meta(ge=-WEIGHT_MAX, le=WEIGHT_MAX)]
Name = Annotated[str, Meta(max_length=NAME_MAX)]
PathText = Annotated[str, Meta(max_length=PATH_MAX)]
Message = dict[str, Any]


class Registration(msgspec.Struct):
    """`POST /register`: the trainer's run parameters (all required, as upstream)."""

    wandb_group: Name
    wandb_project: Name
    batch_size: Size
    max_token_len: Int32
    checkpoint_dir: PathText
    save_checkpoint_interval: Int32
    starting_step: Step
    num_steps: Int32


class RegisterEnv(msgspec.Struct):
    """`POST /register-env`: an environment announcing itself."""

    max_token_length: Int32
    desired_name: Name
    weight: Weight
    group_size: Size
    # intended range 0..1; like upstream, other finite values are accepted (negative = none,
    # above 1 = scaled down with the other envs' shares)
    min_batch_allocation: Finite | None = None
    # extension: an env that registers again with the same name and key gets its id back
    env_key: Name | None = None


class EnvIdentifier(msgspec.Struct):
    """`POST /disconnect-env` and the JSON body of `GET /status-env`."""

    env_id: EnvId


REPORT_MAX_NAMES = 64
"""Distinct names (drop reasons, failure kinds) one `/status-env` report may carry."""
REPORT_MAX_NAME_LENGTH = 100
"""Characters in one such name at most."""
REPORT_MAX_COUNT = 2**53 - 1
"""The largest count (exact in JavaScript, so the dashboard shows it as sent)."""

ReportName = Annotated[str, Meta(min_length=1, max_length=REPORT_MAX_NAME_LENGTH)]
ReportCount = Annotated[int, Meta(ge=0, le=REPORT_MAX_COUNT)]
ReportCounts = Annotated[dict[ReportName, ReportCount], Meta(max_length=REPORT_MAX_NAMES)]


REPORT_MAX_SERVERS = 64
"""Inference servers one `/status-env` report may describe."""


class ServerGauge(msgspec.Struct, omit_defaults=True):
    """One of an env's inference servers as its `ServerManager` sees it now (extension): the
    training requests in flight, the cap in force (`capacity`: the adaptive limit when adaptive
    concurrency is on), the configured maximum, sessions homed there, and the server's own
    queue and KV-cache gauges when read (`atropos.inference.concurrency`), and its time to
    first token (p50, p95, p99, seconds) from its own histogram when read
    (`atropos.inference.server_metrics`)."""

    url: Annotated[str, Meta(max_length=300)]
    healthy: bool
    in_flight: Annotated[int, Meta(ge=0)]
    capacity: Annotated[int, Meta(ge=0)]
    max: Annotated[int, Meta(ge=0)]
    sessions: Annotated[int, Meta(ge=0)] = 0
    waiting: float | None = None
    kv_usage: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    ttft_p99: float | None = None


class LatencySummary(msgspec.Struct, omit_defaults=True):
    """One latency stage of an env (extension; `atropos.inference.latency`): `count` and `sum`
    (seconds) since the env started, the quantiles and the max over its recent window (None:
    nothing in the window)."""

    count: Annotated[int, Meta(ge=0)]
    sum: Annotated[float, Meta(ge=0)]
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


LatencyName = Annotated[str, Meta(min_length=1, max_length=32)]


class EnvStatusRequest(EnvIdentifier):
    """`GET` or `POST /status-env`: the env id and (extension) the env's own counts.

    `dropped` maps a reason to the groups the env dropped for it before sending (never seen by
    the API); `failed` maps a kind to the rollouts that failed with it. Both are cumulative since
    the env started: the API keeps the latest of each per env and shows it in `/stats`. Old
    clients send neither and upstream's API ignores both. `servers` (extension) describes the
    env's inference servers now (`ServerGauge`); the API keeps the latest per env. `latency`
    (extension) summarises the env's stages (`LatencySummary`: rollout, server, queue_wait,
    scoring, ttft) and `paced_seconds` counts the seconds its admission was paced, since it
    started; the API keeps the latest of each per env. `outcomes` (extension) counts the env's
    rollouts by how they ended (`scored`, `failed/<reason>`, `truncated/<limit>`,
    `invalid/<why>`: `atropos.envs.outcome`), cumulative since it started, kept as `failed` is.

    >>> got = decode(b'{"env_id": 0, "dropped": {"identical_scores": 3}}', EnvStatusRequest)
    >>> got.dropped, got.failed, got.servers, got.latency, got.paced_seconds
    ({'identical_scores': 3}, None, None, None, None)
    """

    dropped: ReportCounts | None = None
    failed: ReportCounts | None = None
    servers: Annotated[list[ServerGauge], Meta(max_length=REPORT_MAX_SERVERS)] | None = None
    latency: Annotated[dict[LatencyName, LatencySummary], Meta(max_length=16)] | None = None
    paced_seconds: Annotated[float, Meta(ge=0)] | None = None
    outcomes: ReportCounts | None = None


class BatchAck(msgspec.Struct):
    """`POST /batch/ack` (extension): the trainer is done with a leased batch."""

    batch_id: Name


class EvalResult(msgspec.Struct):
    """`POST /eval_results` (extension): an evaluation an env ran of one policy version
    (`atropos env serve --env.eval_every N`): its metrics, how long it took, and how many
    versions the env skipped so far because an evaluation was still running."""

    env_id: EnvId
    policy_version: Step
    metrics: Annotated[dict[ReportName, float], Meta(max_length=REPORT_MAX_NAMES)]
    seconds: Annotated[float, Meta(ge=0)] = 0.0
    skipped: Annotated[int, Meta(ge=0)] = 0


class PolicyPublished(msgspec.Struct):
    """`POST /policy_version` (extension): the inference servers now serve the weights of
    trainer step `version`; environments stamp the groups they start from now on with it."""

    version: Step


class ScoredData(msgspec.Struct):
    """One group: G sequences of one item, scored together.

    `tokens` hold prompt + completion; `masks` hold -100 where nothing is trained and the token
    id elsewhere; `inference_logprobs` hold 1.0 at masked positions (upstream's sentinel).
    """

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[Finite]
    advantages: list[list[Finite]] | None = None
    ref_logprobs: list[list[Finite]] | None = None
    messages: list[list[Message]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[Finite]] | None = None
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any = None
    env_id: EnvId | None = None
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[Finite]]] | None = None


# Extension fields sit in their own struct so that a stored group encodes as exactly upstream's
# keys followed by only those extension keys that are set: old trainers see upstream's shape.
class GroupExtension(msgspec.Struct, omit_defaults=True):
    """Extension fields of a group (all optional)."""

    group_id: Name | None = None  # idempotency key: a retried send is stored once
    policy_version: Step | None = None  # trainer step whose weights generated the group
    token_source: Name | None = None  # "server" (ids from the inference server) or "retokenized"


class Group(ScoredData):
    """A group as received: upstream's fields plus the extension fields."""

    group_id: Name | None = None
    policy_version: Step | None = None
    token_source: Name | None = None

    def upstream_part(self) -> ScoredData:
        """The group without extension fields."""
        return ScoredData(**{f: getattr(self, f) for f in ScoredData.__struct_fields__})

    def extension_part(self) -> GroupExtension:
        """Only the extension fields."""
        return GroupExtension(self.group_id, self.policy_version, self.token_source)


class Registered(msgspec.Struct):
    """The answer to `POST /register`: the trainer's id (an int, as upstream)."""

    uuid: int


class BatchAnswer(msgspec.Struct):
    """The answer to `GET /batch`: one batch of groups, or `batch: null` while none is ready.

    Upstream's answer is `{"batch": [...]}` (and `{"status": "error", "message": ...}` before a
    trainer registered); a leased batch (extension, `?lease=`) adds `batch_id`, `lease_expires`
    and `step`. Groups decode as `Group`, so a trainer reads the same fields the API checked.

    >>> body = b'{"batch": [{"tokens": [[1]], "masks": [[1]], "scores": [0]}]}'
    >>> answer = decode(body, BatchAnswer)
    >>> answer.batch[0].scores, answer.step, answer.batch_id
    ([0.0], 0, None)
    """

    batch: list[Group] | None = None
    step: Step = 0
    batch_id: Name | None = None
    lease_expires: float | None = None
    status: str | None = None
    message: str | None = None


class ProtocolError(ValueError):
    """A body that breaks the protocol. The message names the field and the rule."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


_json_encoder = msgspec.json.Encoder()
_group_decoder = msgspec.json.Decoder(Group, strict=False)
_group_list_decoder = msgspec.json.Decoder(list[Group], strict=False)
_mp_group_decoder = msgspec.msgpack.Decoder(Group, strict=False)
_mp_group_list_decoder = msgspec.msgpack.Decoder(list[Group], strict=False)


FREE_FORM = ("messages", "generation_params", "overrides", "group_overrides", "images")
"""Fields of a group whose contents are the sender's own (any JSON value)."""
_INT_LOW, _INT_HIGH = -(2**63), 2**64 - 1  # what msgspec encodes; msgpack carries no more
_PLAIN = (str, float, bool, type(None), bytes)


def check_free_form(value: Any, where: str) -> None:
    """Refuse a free-form value that JSON cannot carry back faithfully or that nests deeper
    than `DEPTH_MAX` levels: maps must have string keys, integers fit in 64 bits, and msgpack
    extension types (Ext, timestamps) have no JSON form. Bytes (msgpack `bin`) are kept.

    >>> check_free_form({"a": [1, "x", None]}, "$.images")
    >>> check_free_form({1: 2}, "$.images")
    Traceback (most recent call last):
    ...
    atropos.wire.ProtocolError: $.images: map keys must be strings, found a int key
    """
    level: list[Any] = [value]
    depth = 0  # levels of lists and maps seen so far
    while level:
        inner: list[Any] = []
        containers = False
        for v in level:
            kind = type(v)
            if kind is list:
                containers = True
                inner.extend(v)
            elif kind is dict:
                containers = True
                for key in v:
                    if type(key) is not str:
                        raise ProtocolError(
                            f"{where}: map keys must be strings, found a {type(key).__name__} key",
                            400,
                        )
                inner.extend(v.values())
            elif kind is int:
                if not _INT_LOW <= v <= _INT_HIGH:
                    raise ProtocolError(f"{where}: integer {v} does not fit in 64 bits", 400)
            elif kind not in _PLAIN:
                raise ProtocolError(
                    f"{where}: holds a {kind.__name__}, which has no JSON form (msgpack"
                    " extension types are refused)",
                    400,
                )
        if containers:
            depth += 1
            if depth > DEPTH_MAX:
                raise ProtocolError(
                    f"{where}: nested deeper than {DEPTH_MAX} levels of lists and maps", 400
                )
        level = inner


def check_group(group: Group, where: str = "$") -> list[str]:
    """Check a group's cross-field rules; return the loose-but-accepted findings.

    Raises ProtocolError for anything that would make a batch unusable: no sequences, a masks
    or scores count that differs from the sequence count, a mask row whose length differs from
    its tokens, a non-finite score, or an optional per-sequence array with the wrong number of
    rows. Per-token rows of optional arrays whose length differs from the tokens are accepted
    (upstream accepted them and existing clients send them) and reported as findings.

    >>> check_group(Group(tokens=[[1]], masks=[[1]], scores=[0.5], advantages=[[1.0, 1.0]]))
    ['advantages_row_length']
    >>> check_group(Group(tokens=[[1]], masks=[[1], [2]], scores=[0.5]))
    Traceback (most recent call last):
    ...
    atropos.wire.ProtocolError: $.masks: has 2 rows but tokens has 1 sequences; they must match
    """
    n = _check_sequences(group, where)
    findings = _check_optional_rows(group, where, n)
    for name in FREE_FORM:
        value = getattr(group, name)
        if value is not None:
            check_free_form(value, f"{where}.{name}")
    if group.messages is not None:
        _check_messages(group.messages, where)
        if len(group.messages) != n:
            findings.append("messages_row_count")
    return findings


def _check_sequences(group: Group, where: str) -> int:
    """The number of sequences, once tokens, masks and scores agree on it (else ProtocolError).

    Every sequence has at least one token, a mask row of its length, and a finite score.
    """
    n = len(group.tokens)
    if n == 0:
        raise ProtocolError(f"{where}.tokens: a group needs at least one sequence")
    if len(group.masks) != n:
        raise ProtocolError(
            f"{where}.masks: has {len(group.masks)} rows but tokens has {n} sequences;"
            " they must match"
        )
    if len(group.scores) != n:
        raise ProtocolError(
            f"{where}.scores: has {len(group.scores)} scores but tokens has {n} sequences;"
            " there must be one score per sequence"
        )
    for i, (t, m) in enumerate(zip(group.tokens, group.masks, strict=True)):
        if len(t) != len(m):
            raise ProtocolError(
                f"{where}.masks[{i}]: length {len(m)} differs from tokens[{i}] length {len(t)}"
            )
        if not t:
            raise ProtocolError(f"{where}.tokens[{i}]: a sequence needs at least one token")
    for i, s in enumerate(group.scores):
        if not math.isfinite(s):
            raise ProtocolError(f"{where}.scores[{i}]: {s} is not a finite number")
    return n


def _check_optional_rows(group: Group, where: str, n: int) -> list[str]:
    """Check the optional per-sequence arrays: one row per sequence (else ProtocolError).

    Per-token rows whose length differs from their tokens are accepted: each such array is a
    finding (`<name>_row_length`).
    """
    findings: list[str] = []
    for name in ("advantages", "ref_logprobs", "inference_logprobs"):
        rows: list[list[float]] | None = getattr(group, name)
        if rows is None:
            continue
        if len(rows) != n:
            raise ProtocolError(
                f"{where}.{name}: has {len(rows)} rows but tokens has {n} sequences;"
                " there must be one row per sequence"
            )
        if any(len(r) != len(t) for r, t in zip(rows, group.tokens, strict=True)):
            findings.append(f"{name}_row_length")
    for name in ("overrides", "distill_token_ids", "distill_logprobs"):
        seq_rows: list[Any] | None = getattr(group, name)
        if seq_rows is not None and len(seq_rows) != n:
            raise ProtocolError(
                f"{where}.{name}: has {len(seq_rows)} rows but tokens has {n} sequences;"
                " there must be one row per sequence"
            )
    return findings


def _check_messages(messages: list[list[Message]], where: str) -> None:
    """Every message of every conversation has both a role and a content (else ProtocolError)."""
    for i, conversation in enumerate(messages):
        for j, message in enumerate(conversation):
            if "role" not in message or "content" not in message:
                raise ProtocolError(
                    f"{where}.messages[{i}][{j}]: a message needs both 'role' and 'content'"
                )


def _explain(body: bytes, err: Exception) -> ProtocolError:
    """Turn a decoder error into a message a person can act on (naming the field)."""
    if isinstance(err, UnicodeDecodeError):
        return ProtocolError(
            f"body is not valid UTF-8 ({err.reason}): strings must be UTF-8 without surrogates",
            status=400,
        )
    if isinstance(err, RecursionError):
        return ProtocolError(
            f"body nests lists or maps too deeply (free-form fields allow {DEPTH_MAX} levels)",
            status=400,
        )
    text = str(err)
    if "truncated" in text and b"\\u" in body.lower():
        return ProtocolError(
            "body is not valid JSON: truncated, or a \\u escape names a lone surrogate"
            " (\\ud800-\\udfff not in a pair)",
            status=400,
        )
    if "malformed" in text:
        for token in (b"NaN", b"Infinity"):
            if token in body:
                return ProtocolError(
                    f"body contains {token.decode()}, which is not JSON; scores and logprobs"
                    " must be finite numbers"
                )
        return ProtocolError(f"body is not valid JSON: {text}", status=400)
    where = text.rpartition(" - at ")[2] if " - at " in text else "$"
    if f"{_FLOAT_MAX:e}"[:6] in text or text.startswith("Number out of range"):
        return ProtocolError(f"{where}: must be a finite number (NaN and infinity are refused)")
    if "out of range" in text:
        return ProtocolError(f"{text}: numbers must be finite and fit in 64 bits")
    return ProtocolError(text)


_DECODE_ERRORS = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)


def decode_group(body: bytes, msgpack: bool = False) -> Group:
    """Decode one group; raise ProtocolError naming the field on any type error."""
    try:
        return (_mp_group_decoder if msgpack else _group_decoder).decode(body)
    except _DECODE_ERRORS as err:
        raise _explain(body, err) from None


def decode_group_list(body: bytes, msgpack: bool = False) -> list[Group]:
    """Decode a list of groups (`/scored_data_list`)."""
    try:
        return (_mp_group_list_decoder if msgpack else _group_list_decoder).decode(body)
    except _DECODE_ERRORS as err:
        raise _explain(body, err) from None


def decode(body: bytes, kind: type[Any], msgpack: bool = False) -> Any:
    """Decode a small control body (registration, env id, ack) of the given struct type."""
    try:
        if msgpack:
            return msgspec.msgpack.decode(body, type=kind, strict=False)
        return msgspec.json.decode(body, type=kind, strict=False)
    except _DECODE_ERRORS as err:
        raise _explain(body, err) from None


def encode_group(group: Group) -> bytes:
    """Encode a group for storage and serving: upstream's keys, then any set extension keys."""
    base = _json_encoder.encode(group.upstream_part())
    ext = _json_encoder.encode(group.extension_part())
    if ext == b"{}":
        return base
    return base[:-1] + b"," + ext[1:]


def encode(obj: Any) -> bytes:
    """Encode any response object as JSON."""
    return _json_encoder.encode(obj)


def encode_plain(value: Any) -> bytes:
    """Encode groups as environments build them (`ScoredDataGroup` dicts, lists of them) as
    compact UTF-8 JSON, in one pass: the env's side of `decode_group`/`decode_group_list`.

    msgspec does the work (several times faster than `json.dumps`); values it does not know
    (numpy scalars and other float or int subclasses) go through `json.dumps` instead.

    >>> encode_plain([{"tokens": [[1, 2]], "scores": [0.5], "messages": None}])
    b'[{"tokens":[[1,2]],"scores":[0.5],"messages":null}]'
    """
    try:
        return _json_encoder.encode(value)
    except (TypeError, msgspec.EncodeError):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


# ----- the trainer contract -----------------------------------------------------------------

CONTRACT_VERSION = "1.0"
"""The version of the trainer contract (`docs/trainer-contract.md`): the major number moves
when an integration must change, the minor number for additions it may ignore. The API sends
it in the `Atropos-Contract` header of every answer of its routes (old clients ignore it)."""
CONTRACT_HEADER = "Atropos-Contract"
"""The response header that carries `CONTRACT_VERSION`."""
CONTRACT_TYPES: tuple[type[msgspec.Struct], ...] = (
    Registration,
    Registered,
    BatchAnswer,
    Group,
    BatchAck,
    PolicyPublished,
    RegisterEnv,
    EnvIdentifier,
    EnvStatusRequest,
    EvalResult,
)
"""The bodies the contract's JSON Schema covers (`docs/trainer-contract.schema.json`)."""
SCHEMA_PATH = "docs/trainer-contract.schema.json"
"""Where the generated schema is committed, relative to the repository root."""


def contract_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of every body in `CONTRACT_TYPES`, generated from the structs
    above, so it says exactly what the API decodes (bounds included).

    >>> schema = contract_schema()
    >>> schema["x-contract-version"], schema["$defs"]["BatchAck"]["required"]
    ('1.0', ['batch_id'])
    """
    _, components = msgspec.json.schema_components(CONTRACT_TYPES, ref_template="#/$defs/{name}")
    for component in components.values():  # docstrings, without their doctests
        if "description" in component:
            text = inspect.cleandoc(component["description"]).split("\n>>>")[0]
            component["description"] = text.strip()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Atropos trainer contract",
        "description": (
            "Bodies of the trajectory API's routes, generated from atropos.wire by"
            " `python -m atropos.wire --schema`; see docs/trainer-contract.md."
        ),
        "x-contract-version": CONTRACT_VERSION,
        "$defs": components,
    }


def schema_text() -> str:
    """`contract_schema()` as the committed file holds it (sorted keys, 2-space indent)."""
    return json.dumps(contract_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m atropos.wire --schema [PATH]`: print the contract's JSON Schema, or write it
    to PATH; `--check PATH`: exit 1 when PATH differs from the generated schema."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m atropos.wire", description=main.__doc__)
    parser.add_argument("--schema", nargs="?", const="-", metavar="PATH", help="write it")
    parser.add_argument("--check", metavar="PATH", help="compare PATH with the generated one")
    args = parser.parse_args(argv)
    text = schema_text()
    if args.check:
        if Path(args.check).read_text(encoding="utf-8") != text:
            print(f"{args.check} is stale: run python -m atropos.wire --schema {args.check}")
            return 1
        return 0
    if args.schema in (None, "-"):
        print(text, end="")
    else:
        Path(args.schema).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
