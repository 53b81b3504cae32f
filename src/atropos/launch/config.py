"""The run file of `atropos launch`: pydantic models, loading, `--set` overrides, clear errors.

A run file has five sections (docs/launch.md is the reference, checked against these models by
a test):

```yaml
run: {name: arithmetic, backend: local}        # or ray / slurm, with run.ray / run.slurm
api: {port: null, args: {max-staleness: 2}}    # `atropos api serve` settings
inference:                                     # servers: local, vllm, sglang or url
  - {name: policy, type: local, model: tiny}
envs:                                          # registered names or path/to/file.py:Class
  - {name: arithmetic, replicas: 2, env: {group_size: 8}}
trainer: {model: tiny, args: {steps: 20}}      # `atropos train` settings, or command: ...
```

Every mistake is reported at once, one line each, naming the key path and the rule, with the
nearest known key for a misspelt one: ``envs[0].replica: unknown key; did you mean
replicas?``. `--set a.b=VALUE` overrides any field; VALUE is read as YAML (`--set
envs.0.replicas=4`, `--set trainer.args.steps=50`, `--set run.backend=ray`).
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from atropos.names import did_you_mean

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
Args = dict[str, Any]

ARGS_HELP = (
    "more flags of the component's command line, as a mapping: {max-staleness: 2} becomes"
    " --max-staleness 2; true becomes a bare flag, false and null leave it out, a list repeats"
    " the value"
)


class LaunchConfigError(ValueError):
    """A run file that cannot be used; `lines` holds one message per problem."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


# ----- text that ends up in the Slurm script or a process's environment -------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# names of environment variables whose values are secret unless the run file says otherwise
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


def _control(text: str, allowed: str = "") -> str | None:
    """What the first control character of `text` is, in words; None when it has none."""
    for char in _CONTROL.findall(text):
        if char in allowed:
            continue
        if char in "\n\r":
            return "a newline"
        return "a NUL" if char == "\0" else f"a control character ({char!r})"
    return None


def one_line(text: str, what: str, allowed: str = "") -> str:
    """`text` when it holds no control character (but those in `allowed`); ValueError naming
    `what` otherwise.

    >>> one_line("gpu", "a Slurm partition name")
    'gpu'
    """
    found = _control(text, allowed)
    if found is not None:
        raise ValueError(f"{found} cannot be part of {what}")
    return text


def sbatch_word(text: str, what: str) -> str:
    """`text` as an #SBATCH option's value may hold it: one word, no quotes, `#` or `\\`.

    sbatch reads `#SBATCH` lines itself (not the shell), word by word.
    """
    one_line(text, what)
    bad = re.search(r"[\s'\"#\\`$]", text)
    if bad is not None:
        raise ValueError(f"{bad.group(0)!r} cannot be part of {what} (an #SBATCH line's value)")
    return text


class SecretValue(Strict):
    """An environment variable's value with its secrecy said outright.

    A secret value reaches its process through a private file (docs/launch.md, "What launch
    writes and who can read it"), never a file launch writes for others to read, and is shown as
    `***`.
    """

    value: str = Field(description="the value")
    secret: bool = Field(
        True, description="hidden everywhere launch writes or prints (false: shown in full)"
    )


def is_secret(name: str, value: str | SecretValue) -> bool:
    """Whether environment variable `name` is secret: as its entry says, else when its name
    holds KEY, TOKEN, SECRET or PASSWORD.

    >>> is_secret("WANDB_API_KEY", "x"), is_secret("HF_HOME", "x")
    (True, False)
    >>> is_secret("TOKENIZERS_PARALLELISM", SecretValue(value="false", secret=False))
    False
    """
    if isinstance(value, SecretValue):
        return value.secret
    return SECRET_NAME.search(name) is not None


def _check_environ(environ: dict[str, str | SecretValue]) -> dict[str, str | SecretValue]:
    for name, value in environ.items():
        if not name or re.search(r"[\s=]", name) or _control(name) is not None:
            raise ValueError(
                f"{name!r} is not an environment variable's name (no =, spaces or control"
                " characters)"
            )
        text = value.value if isinstance(value, SecretValue) else value
        if "\0" in text:
            raise ValueError(f"{name}: a NUL cannot be part of an environment variable's value")
    return environ


class Restart(Strict):
    """What happens when a component's process exits on its own."""

    policy: Literal["never", "on-failure", "always"] = Field(
        "on-failure",
        description="on-failure: restart after a non-zero exit; always: after any exit;"
        " never: an exit ends the component",
    )
    max_restarts: int = Field(3, ge=0, description="restarts allowed before the run fails")
    backoff: float = Field(1.0, ge=0, description="seconds before the first restart")
    backoff_max: float = Field(30.0, ge=0, description="the wait doubles up to this")


class Placement(Strict):
    """Where a component runs and what it asks of the node."""

    node: int | None = Field(
        None,
        ge=0,
        description="slurm: index of the job's node it runs on (default: the first node for the"
        " API and trainer, spread for the rest); ignored by the local backend",
    )
    cpus: float = Field(
        1.0,
        gt=0,
        description="CPUs it asks for (Ray num_cpus; slurm: counts toward the CPUs the job asks"
        " per node)",
    )
    gpus: int = Field(0, ge=0, description="GPUs it asks for, per replica")
    resources: dict[str, float] = Field(
        default_factory=dict, description="ray: custom resources, e.g. {env_node: 1}"
    )
    environ: dict[str, str | SecretValue] = Field(
        default_factory=dict,
        description="environment variables of its process; {value: ..., secret: true} marks"
        " one secret (names holding KEY, TOKEN, SECRET or PASSWORD are, unless secret: false)",
    )
    restart: Restart = Field(default_factory=Restart)
    ready_timeout: float | None = Field(
        None, gt=0, description="seconds to become ready (default: run.ready_timeout)"
    )

    @field_validator("environ")
    @classmethod
    def _environ(cls, value: dict[str, str | SecretValue]) -> dict[str, str | SecretValue]:
        return _check_environ(value)

    def environ_split(self) -> tuple[dict[str, str], dict[str, str]]:
        """Its environment: (plain values, secret values), each name -> value."""
        plain: dict[str, str] = {}
        hidden: dict[str, str] = {}
        for name, value in self.environ.items():
            text = value.value if isinstance(value, SecretValue) else value
            (hidden if is_secret(name, value) else plain)[name] = text
        return plain, hidden


def command_text(text: str | None) -> str | None:
    """`text` when it splits into words as a shell would (launch runs it as those words)."""
    if text is None:
        return None
    one_line(text, "a command", allowed="\t")
    try:
        shlex.split(text)
    except ValueError as err:
        raise ValueError(f"cannot split it into words: {err}") from None
    return text


def host_text(text: str) -> str:
    """`text` when it can be a host name or address: one word, no control characters."""
    one_line(text, "a host name or address")
    if re.search(r"[\s'\"$`;\\]", text):
        raise ValueError(f"{text!r} is not a host name or address")
    return text


class RaySettings(Strict):
    address: str | None = Field(
        None,
        description="cluster to join (default: $RAY_ADDRESS, else a local cluster is started)",
    )
    namespace: str | None = Field(None, description="Ray namespace (default: atropos-RUN_NAME)")


class SlurmSettings(Strict):
    nodes: int = Field(1, ge=1, description="nodes of the job")
    gpus_per_node: int = Field(0, ge=0, description="GPUs asked per node (--gpus-per-node)")
    cpus_per_node: int | None = Field(
        None,
        ge=1,
        description="CPUs asked per node (default: what the processes of the busiest node ask)",
    )
    partition: str | None = Field(None, description="partition (default: the cluster's)")
    account: str | None = None
    time: str = Field("01:00:00", description="the job's time limit (quoted in YAML)")
    sbatch: list[str] = Field(
        default_factory=list, description="more #SBATCH options, e.g. ['--qos=high']"
    )
    setup: list[str] = Field(
        default_factory=list,
        description="shell lines run first on every node (module load ..., source venv)",
    )
    python: str | None = Field(
        None, description="the Python with atropos installed on the nodes (default: this one)"
    )

    @field_validator("time", mode="before")
    @classmethod
    def _time_text(cls, value: Any) -> Any:
        if isinstance(value, int | float):  # YAML reads an unquoted 01:00:00 as 3600
            raise ValueError(
                'write the time limit as a quoted string, e.g. "01:00:00" or "90" (minutes):'
                " unquoted, YAML reads 01:00:00 as a number"
            )
        return value

    # Every value below is written into job.sbatch: on an #SBATCH line (read by sbatch, word
    # by word), in a quoted shell word, or (setup) as the run file's own shell lines.
    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        return None if value is None else sbatch_word(value, "a Slurm partition name")

    @field_validator("account")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        return None if value is None else sbatch_word(value, "a Slurm account name")

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        return sbatch_word(value, "a Slurm time limit")

    @field_validator("sbatch")
    @classmethod
    def _sbatch(cls, value: list[str]) -> list[str]:
        for option in value:
            one_line(option, "an #SBATCH option")
            if not option.startswith("-"):
                raise ValueError(f"{option!r} is not an sbatch option like --qos=high")
        return value

    @field_validator("setup")
    @classmethod
    def _setup(cls, value: list[str]) -> list[str]:
        for line in value:  # the user's own shell code, one line an entry
            if "\n" in line or "\r" in line:
                raise ValueError(
                    "a newline cannot be part of one setup line: give each line as its own entry"
                )
            one_line(line, "a setup line", allowed="\t")
        return value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        return None if value is None else one_line(value, "an interpreter's path")


class RunSection(Strict):
    name: Name = Field("atropos", description="the run's name (log files, Ray namespace, job)")
    directory: Path | None = Field(None, description="run directory (default: runs/NAME)")
    backend: Literal["local", "ray", "slurm"] = "local"
    ready_timeout: float = Field(
        300.0, gt=0, description="default seconds a component has to become ready"
    )
    grace: float = Field(
        30.0, ge=0, description="seconds between SIGTERM and SIGKILL when a component stops"
    )
    ray: RaySettings = Field(default_factory=RaySettings)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)

    @property
    def run_dir(self) -> Path:
        return self.directory if self.directory is not None else Path("runs") / self.name


class ApiSection(Placement):
    host: str | None = Field(
        None,
        description="address it binds (default: 127.0.0.1 on the local backend, the node's"
        " address on Ray, all addresses on Slurm); beyond loopback, launch makes a key",
    )
    port: int | None = Field(None, ge=0, le=65535, description="port (default: a free one)")
    store: str = Field("sqlite", description="sqlite (RUN_DIR/api.db), sqlite:PATH or memory")
    args: Args = Field(default_factory=dict, description=ARGS_HELP)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return None if value is None else host_text(value)


class InferenceServer(Placement):
    name: Name | None = Field(None, description="handle for envs.servers (default: TYPE + index)")
    type: Literal["local", "vllm", "sglang", "url"]
    model: str | None = Field(
        None, description="local: a model directory or tiny; vllm/sglang: a model id or path"
    )
    served_model_name: str | None = Field(
        None, description="model name in requests (default: atropos-tiny for tiny, else model)"
    )
    url: str | None = Field(None, description="url: the OpenAI base URL of a running server")
    command: str | None = Field(
        None,
        description="vllm/sglang: the command template; {model}, {served_model_name}, {host},"
        " {port}, {gpus}, {python} are filled in (default: the engine's own server command)",
    )
    python: str | None = Field(
        None,
        description="the Python that fills {python} in this server's command, e.g. the"
        " interpreter of vLLM's own venv (default: the one with atropos, as for every process)",
    )
    replicas: int = Field(1, ge=1, description="copies of this server")
    port: int | None = Field(None, ge=0, le=65535, description="first replica's port")
    host: str | None = Field(None, description="address it binds (default: as api.host)")
    args: Args = Field(default_factory=dict, description=ARGS_HELP)

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return None if value is None else host_text(value)

    @field_validator("command")
    @classmethod
    def _command(cls, value: str | None) -> str | None:
        return command_text(value)

    @field_validator("model", "served_model_name", "python", "url")
    @classmethod
    def _one_line(cls, value: str | None, info: ValidationInfo) -> str | None:
        what = {
            "model": "a model's name or path",
            "served_model_name": "a model name",
            "python": "an interpreter's path",
            "url": "a URL",
        }[str(info.field_name)]
        return None if value is None else one_line(value, what)

    @model_validator(mode="after")
    def _fields_of_type(self) -> InferenceServer:
        if self.type == "url":
            if not self.url:
                raise ValueError("type url needs url: the server's OpenAI base URL")
            if self.replicas != 1:
                raise ValueError("type url is one running server: leave replicas at 1")
        else:
            if self.url:
                raise ValueError(f"url is for type url; a {self.type} server is started by launch")
            if not self.model:
                raise ValueError(f"type {self.type} needs model: what the server loads")
        if self.type != "vllm" and self.type != "sglang" and self.command:
            raise ValueError("command is for vllm and sglang servers")
        if self.type == "url" and self.python:
            raise ValueError("python is for a server launch starts; a url server is running")
        if self.python is not None and not self.python.strip():
            raise ValueError("python: give the path of an interpreter, or leave it out")
        return self


class EnvEntry(Placement):
    name: str = Field(description="a registered environment name or path/to/file.py:Class")
    replicas: int = Field(1, ge=1, description="copies of this environment")
    env: Args = Field(default_factory=dict, description="--env.* settings, e.g. {group_size: 8}")
    openai: Args = Field(
        default_factory=dict, description="--openai.* settings applied to every server it uses"
    )
    weight: float | None = Field(None, ge=0, description="batch weight (--env.inference_weight)")
    min_batch_allocation: float | None = Field(
        None, ge=0, le=1, description="minimum share of every batch"
    )
    eval_every: int | None = Field(
        None,
        ge=1,
        description="evaluate each N-th policy version the trainer publishes, while rollouts go"
        " on (--env.eval_every)",
    )
    servers: list[str] | None = Field(
        None, description="names of the inference servers it uses (default: all)"
    )
    args: Args = Field(default_factory=dict, description=ARGS_HELP)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("give a registered environment name or path/to/file.py:Class")
        return value

    @property
    def handle(self) -> str:
        """The name's last part, safe in file and process names: `arithmetic`, `MyEnv`."""
        base = self.name.rsplit(":", 1)[-1].rsplit("/", 1)[-1].removesuffix(".py")
        return re.sub(r"[^A-Za-z0-9_.-]", "_", base) or "env"


class TrainerSection(Placement):
    model: str | None = Field(None, description="atropos train --model (a directory, or tiny)")
    args: Args = Field(default_factory=dict, description="more `atropos train` flags")
    command: str | None = Field(
        None,
        description="any other trainer's command; {api_url}, {server_urls}, {run_dir} are"
        " filled in (and exported as ATROPOS_API_URL, ATROPOS_SERVER_URLS)",
    )
    sync_into: list[str] | None = Field(
        None, description="inference servers it syncs weights into (default: all it can)"
    )
    restart: Restart = Field(default_factory=lambda: Restart(policy="never"))

    @field_validator("command")
    @classmethod
    def _command(cls, value: str | None) -> str | None:
        return command_text(value)

    @model_validator(mode="after")
    def _one_of(self) -> TrainerSection:
        if (self.model is None) == (self.command is None):
            raise ValueError(
                "give model: (atropos train) or command: (your own trainer), exactly one"
            )
        if self.command is not None and self.args:
            raise ValueError("args are atropos train flags; put your trainer's flags in command")
        return self


class RunFile(Strict):
    run: RunSection = Field(default_factory=RunSection)
    api: ApiSection = Field(default_factory=ApiSection)
    inference: list[InferenceServer] = Field(default_factory=list)
    envs: list[EnvEntry] = Field(min_length=1)
    trainer: TrainerSection

    @model_validator(mode="after")
    def _names(self) -> RunFile:
        seen: set[str] = set()
        for i, server in enumerate(self.inference):
            if server.name is None:
                server.name = f"{server.type}{i}"
            if server.name in seen:
                raise ValueError(f"inference[{i}].name: {server.name!r} is used twice")
            seen.add(server.name)
        known = [s.name for s in self.inference if s.name]
        for i, env in enumerate(self.envs):
            for name in env.servers or []:
                if name not in known:
                    hint = did_you_mean(name, known)
                    raise ValueError(
                        f"envs[{i}].servers: no inference server {name!r}{hint}"
                        f" (the servers are {', '.join(known) or 'none'})"
                    )
        for name in self.trainer.sync_into or []:
            if name not in known:
                raise ValueError(
                    f"trainer.sync_into: no inference server {name!r}{did_you_mean(name, known)}"
                )
        return self


# ----- loading -----------------------------------------------------------------------------------


def load(path: str | Path, overrides: Sequence[str] = ()) -> RunFile:
    """The run file at `path` with `--set` `overrides` applied; `LaunchConfigError` otherwise."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise LaunchConfigError([f"{path}: cannot read it ({err.strerror})"]) from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(err, "problem", None) or str(err)
        raise LaunchConfigError([f"{path}: not valid YAML{at}: {problem}"]) from None
    if not isinstance(data, dict):
        raise LaunchConfigError([f"{path}: expected a mapping with run:, api:, envs:, ..."])
    return parse(data, overrides, origin=str(path))


def parse(data: dict[str, Any], overrides: Sequence[str] = (), origin: str = "run file") -> RunFile:
    """Validate `data` (a run file's mapping) after applying `overrides`."""
    data = copy.deepcopy(data)
    for item in overrides:
        apply_override(data, item)
    try:
        return RunFile.model_validate(data)
    except ValidationError as err:
        raise LaunchConfigError([f"{origin}: {line}" for line in error_lines(err)]) from None


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one `--set KEY.PATH=VALUE` to `data` in place (VALUE is YAML)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise LaunchConfigError([f"--set {item}: expected KEY.PATH=VALUE, e.g. envs.0.replicas=2"])
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[: i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise LaunchConfigError(
                    [f"--set {key}: {where}: the list has {len(node)} entries (0-based index)"]
                )
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
            continue
        if not isinstance(node, dict):
            raise LaunchConfigError([f"--set {key}: {where}: its parent is not a mapping"])
        if last:
            node[part] = value
        else:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else child
            if child is None:
                child = {}
            elif isinstance(child, list):
                child = list(child)
            node[part] = child
            node = child


def error_lines(err: ValidationError) -> list[str]:
    """One line per problem: the key path, then the rule; unknown keys get "did you mean"."""
    lines = []
    for problem in err.errors(include_url=False):
        loc = [part for part in problem["loc"] if not _is_tag(part)]
        path = _path(loc)
        kind = problem["type"]
        if kind == "extra_forbidden":
            known = _fields_at(loc[:-1])
            lines.append(f"{path}: unknown key{did_you_mean(str(loc[-1]), known)}")
        elif kind == "missing":
            lines.append(f"{path}: required")
        elif kind == "value_error":
            message = str(problem.get("ctx", {}).get("error", problem["msg"]))
            lines.append(f"{path}: {message}" if path else message)
        else:
            got = problem.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            lines.append(f"{path}: {problem['msg']}{shown}" if path else problem["msg"])
    return lines


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and part.startswith("function-")


def _path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(loc: Sequence[Any]) -> list[str]:
    """The field names of the model at `loc` (for "did you mean"), [] when unknown."""
    model: Any = RunFile
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if _is_model(model) else None
        if field is None:
            return []
        model = _inner_model(field.annotation)
    return list(model.model_fields) if _is_model(model) else []


def _is_model(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def _inner_model(annotation: Any) -> Any:
    if _is_model(annotation):
        return annotation
    if get_origin(annotation) is not None:
        for arg in get_args(annotation):
            inner = _inner_model(arg)
            if inner is not None:
                return inner
    return None
