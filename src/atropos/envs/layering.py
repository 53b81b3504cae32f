"""Configuration layering, implemented once for `serve`, `process` and `evaluate`.

The layers, lowest first, each in its own section below, in this order:

1. class defaults: the env config model's fields (`load_defaults`);
2. `config_init()`: the environment's own defaults and servers (`load_defaults`);
3. mode defaults: `process` keeps equal-score groups and writes a file (`env_base`);
4. the `--config` YAML file (`file_layer`);
5. `ATROPOS_*` environment variables (`environ_layer`);
6. command-line flags (`flags_layer`, from what `atropos.envs.cli` parsed).

`resolve_config` stacks them in that order and validates the result; it is the only entry. The
command line asks `flag_sections` which flags exist and what their defaults are, builds its
argparse parser from that, and hands the parsed values back (`flags_layer`, `resolve_config`):
the models live in `config.py`, argparse in `cli.py`, and everything in between here.

What nobody gave is filled in so that a new environment runs on a laptop: an environment whose
`config_init` names no servers (it has none, or BaseEnv's) uses the local CPU server
(`local_server_config()`; with `--slurm`, upstream's discovery), and one that names no tokenizer
uses its servers' (`default_tokenizer`). Each such choice is said in `ResolvedConfig.notes`.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from atropos.envs.config import (
    UPSTREAM_TOKENIZER,
    BaseEnvConfig,
    ConfigError,
    Mode,
    ResolvedConfig,
    namespaces,
)
from atropos.inference.config import (
    LOCAL_MODEL_NAME,
    APIServerConfig,
    ServerBaseline,
    ServerManagerConfig,
    local_serve_command,
    local_server_config,
)
from atropos.inference.tokenizer import TINY
from atropos.names import did_you_mean

__all__ = [
    "Defaults",
    "FlagSections",
    "Layer",
    "coerce_text",
    "default_tokenizer",
    "env_base",
    "env_name",
    "environ_layer",
    "file_layer",
    "flag_sections",
    "flags_layer",
    "load_defaults",
    "resolve_config",
    "validation_lines",
]

Servers = list[APIServerConfig] | ServerBaseline

M = TypeVar("M", bound=BaseModel)

MANAGER_KEYS: tuple[str, ...] = tuple(ServerManagerConfig.model_fields)

FILE_KEYS: tuple[str, ...] = ("env", "openai", *MANAGER_KEYS)

NONE_WORDS = ("None", "null")  # lowercase "none" stays a string (a reasoning_effort value)

MODE_DEFAULTS: dict[Mode, dict[str, Any]] = {
    "serve": {},
    # process writes groups for inspection: keep equal-score groups and decoded messages
    "process": {"ensure_scores_are_not_same": False, "include_messages": True},
    "evaluate": {},
}


def env_name(env_cls: type) -> str:
    """The environment's name: its `name` attribute, else its class name."""
    return str(getattr(env_cls, "name", None) or env_cls.__name__)


@dataclass
class Layer:
    """Overrides from one source. Values from text sources (flags, variables) are strings."""

    kind: Literal["file", "environ", "flags"]
    origin: str = ""  # the file, for kind "file"
    env: dict[str, Any] = field(default_factory=dict)
    openai: dict[str, Any] | list[dict[str, Any]] | None = None
    manager: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)  # namespaces: "judge"
    labels: dict[str, str] = field(default_factory=dict)  # "env.x" -> where it was set

    def where(self, section: str, key: str) -> str:
        """Where `section.key` is set in this source, as a user would write it."""
        dotted = f"{section}.{key}" if section else key
        if dotted in self.labels:
            return self.labels[dotted]
        if self.kind == "flags":
            return f"--{dotted}"
        if self.kind == "environ":
            return "ATROPOS_" + dotted.replace(".", "__").upper()
        return f"{self.origin}: {dotted}"

    def key(self, section: str, key: str) -> str:
        """`section.key` as a suggestion names it: `where`, less a file's name (an error names
        the file once, in front: "c.yaml: env.gropu_size: ...; did you mean env.group_size?")."""
        if self.kind == "file":
            return f"{section}.{key}" if section else key
        return self.where(section, key)


@dataclass
class Defaults:
    """What `config_init()` returned (or the class defaults), normalised. `servers_unset`:
    no `config_init` of the environment's own named servers, so `servers` is the local server."""

    env: BaseEnvConfig
    servers: Servers
    origin: str
    servers_unset: bool = False

    @property
    def server_model(self) -> type[APIServerConfig]:
        """The model of `--openai.*` settings: the configured servers' type, or APIServerConfig."""
        if isinstance(self.servers, list):
            return type(self.servers[0])
        return APIServerConfig


# ----- layers 1 and 2: class defaults and config_init() -------------------------------------------


def load_defaults(env_cls: type) -> Defaults:
    """Call `env_cls.config_init()` (when defined) and check what it returns.

    An environment without a `config_init` of its own (none, or BaseEnv's, whose servers are a
    bare `ServerBaseline`) gets the local CPU server, `local_server_config()`.
    """
    model = getattr(env_cls, "env_config_cls", None) or BaseEnvConfig
    if not (isinstance(model, type) and issubclass(model, BaseEnvConfig)):
        raise TypeError(f"{env_cls.__name__}.env_config_cls must subclass BaseEnvConfig")
    init = getattr(env_cls, "config_init", None)
    if init is None:
        # model_validate({}) rather than Model(): inference/config.py's positional Field defaults
        # are invisible to mypy's dataclass_transform support
        return Defaults(model.model_validate({}), [local_server_config()], "defaults", True)
    origin = f"{env_cls.__name__}.config_init()"
    result = init()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"{origin} must return (env_config, server_configs), got {result!r}")
    env, servers = result
    if not isinstance(env, model):
        if not (isinstance(env, BaseEnvConfig) and issubclass(model, type(env))):
            raise TypeError(f"{origin} returned {type(env).__name__}, not {model.__name__}")
        env = model.model_validate(env.model_dump(exclude_unset=True))
    if isinstance(servers, APIServerConfig):
        servers = [servers]
    elif isinstance(servers, list) and len(servers) == 1 and type(servers[0]) is ServerBaseline:
        servers = servers[0]
    if isinstance(servers, list):
        if not servers or not all(isinstance(s, APIServerConfig) for s in servers):
            raise TypeError(f"{origin}: expected a non-empty list of APIServerConfig")
    elif not isinstance(servers, ServerBaseline):
        raise TypeError(
            f"{origin}: servers must be ServerBaseline, APIServerConfig or a list of"
            f" APIServerConfig, got {type(servers).__name__}"
        )
    if _inherits_base_config_init(env_cls):
        return Defaults(env, [local_server_config()], origin, True)
    return Defaults(env, servers, origin)


def _inherits_base_config_init(env_cls: type) -> bool:
    """Whether `env_cls.config_init` is BaseEnv's own (which names no servers)."""
    from atropos.envs.base import BaseEnv

    init = getattr(env_cls, "config_init", None)
    base = BaseEnv.__dict__["config_init"].__func__
    return getattr(init, "__func__", None) is base


# ----- layer 3: mode defaults ---------------------------------------------------------------------


def env_base(
    env_cls: type, mode: Mode, defaults: Defaults
) -> tuple[dict[str, Any], dict[str, str]]:
    """The env settings below the file layer: `config_init()` plus the mode's defaults, and
    where each non-default value comes from."""
    values = defaults.env.model_dump()
    labels = {k: defaults.origin for k in defaults.env.model_fields_set}
    for key, value in MODE_DEFAULTS[mode].items():
        values[key], labels[key] = value, f"{mode} mode"
    if mode == "process" and values["data_path_to_save_groups"] is None:
        values["data_path_to_save_groups"] = f"data/{env_name(env_cls)}.jsonl"
        labels["data_path_to_save_groups"] = "process mode"
    return values, labels


# ----- layer 4: the --config file -----------------------------------------------------------------


def file_layer(path: str | os.PathLike[str], extra: Iterable[str] = ()) -> Layer:
    """The `--config` YAML file: `env:`, `openai:` (a mapping or a list), manager keys, and the
    env config's namespaces given in `extra` (`judge:`)."""
    name = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"--config {name}: cannot read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"--config {name}: not valid YAML: {e}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: expected a mapping (env:, openai:, ...) at the top level")
    layer = Layer("file", name)
    extra = tuple(extra)
    _check_keys(data, (*FILE_KEYS, *extra), lambda k: layer.where("", k), str)
    for section in extra:
        given = data.get(section) or {}
        if not isinstance(given, dict):
            raise ConfigError(f"{name}: {section}: must be a mapping of settings")
        layer.sections[section] = given
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{name}: env: must be a mapping of settings")
    layer.env = env
    openai = data.get("openai")
    if isinstance(openai, list):
        if not openai or not all(isinstance(s, dict) for s in openai):
            raise ConfigError(f"{name}: openai: must be a mapping or a non-empty list of them")
        openai = openai[0] if len(openai) == 1 else openai
    elif openai is not None and not isinstance(openai, dict):
        raise ConfigError(f"{name}: openai: must be a mapping or a non-empty list of them")
    layer.openai = openai
    layer.manager = {k: data[k] for k in MANAGER_KEYS if k in data}
    return layer


# ----- layer 5: ATROPOS_* environment variables ---------------------------------------------------


class _EnvironBase(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ATROPOS_", env_nested_delimiter="__", case_sensitive=False, extra="ignore"
    )

    env: dict[str, Any] = Field(default_factory=dict)
    openai: dict[str, Any] = Field(default_factory=dict)


_MANAGER_VARS: dict[str, Any] = {k: (str | None, None) for k in MANAGER_KEYS}


# manager settings are ATROPOS_SLURM, ATROPOS_PROXY_URL, ...
_Environ = create_model("_Environ", __base__=_EnvironBase, **_MANAGER_VARS)


def environ_layer(extra: Iterable[str] = ()) -> Layer:
    """`ATROPOS_ENV__GROUP_SIZE=8`, `ATROPOS_OPENAI__BASE_URL=...`, `ATROPOS_SLURM=true`, ...
    and, for each namespace in `extra`, `ATROPOS_JUDGE__BASE_URL=...`.

    `ATROPOS_API_KEY` (the trajectory API's key) also sets `rollout_server_api_key`.
    """
    try:
        read = _Environ()
    except (SettingsError, ValidationError) as e:
        raise ConfigError(f"ATROPOS_* environment variables: {e}") from None
    layer = Layer("environ", env=dict(read.env), openai=dict(read.openai) or None)
    layer.manager = {k: v for k in MANAGER_KEYS if (v := getattr(read, k)) is not None}
    for section in extra:
        prefix = f"ATROPOS_{section.upper()}__"
        given = {
            name[len(prefix) :].lower(): value
            for name, value in os.environ.items()
            if name.upper().startswith(prefix) and len(name) > len(prefix)
        }
        if given:
            layer.sections[section] = given
    api_key = os.environ.get("ATROPOS_API_KEY")
    if api_key and "rollout_server_api_key" not in layer.env:
        layer.env["rollout_server_api_key"] = api_key
        layer.labels["env.rollout_server_api_key"] = "ATROPOS_API_KEY"
    return layer


# ----- layer 6: command-line flags ----------------------------------------------------------------


def flags_layer(given: Mapping[tuple[str, str], Any], defaults: Defaults) -> Layer:
    """The command line's values, `{(section, key): text}` as `atropos.envs.cli` parsed them:
    section "env", "openai", a namespace of the env config ("judge"), or "" (the manager)."""
    layer = Layer("flags")
    openai: dict[str, Any] = {}
    sections = namespaces(type(defaults.env))
    for (name, key), value in given.items():
        if name in sections:
            target = layer.sections.setdefault(name, {})
        else:
            target = {"env": layer.env, "openai": openai}.get(name, layer.manager)
        target[key] = value
    layer.openai = openai or None
    return layer


@dataclass(frozen=True)
class FlagSections:
    """What the command line offers, by section: "env", the env config's namespaces ("judge"),
    "openai" and "" (the server manager). `models` give each section's fields (one flag each),
    `shown` the defaults `--help` shows (layers 1 to 3), `defaults` what `load_defaults` gave."""

    defaults: Defaults
    models: dict[str, type[BaseModel]]
    shown: dict[str, dict[str, Any]]


def flag_sections(env_cls: type, mode: Mode) -> FlagSections:
    """The flags' sections of `env_cls` in `mode`, with the defaults below the file layer."""
    defaults = load_defaults(env_cls)
    model = type(defaults.env)
    env, _ = env_base(env_cls, mode, defaults)
    if env["wandb_name"] is None:
        env["wandb_name"] = env_name(env_cls)
    servers = defaults.servers
    openai = servers[0].model_dump() if isinstance(servers, list) else servers.model_dump()
    nested = {s: dict(env.get(s) or {}) for s in namespaces(model)}
    return FlagSections(
        defaults,
        {
            "env": model,
            **namespaces(model),
            "openai": defaults.server_model,
            "": ServerManagerConfig,
        },
        {"env": env, **nested, "openai": openai, "": {}},
    )


# ----- stacking the layers, lowest first, and validating ------------------------------------------


def resolve_config(
    env_cls: type,
    mode: Mode,
    *,
    config_path: str | os.PathLike[str] | None = None,
    flags: Layer | None = None,
    defaults: Defaults | None = None,
) -> ResolvedConfig:
    """Layer every source for `env_cls` in `mode` and validate the result.

    Args:
        env_cls: the environment class (`config_init`, `env_config_cls` and `name` are used).
        mode: "serve", "process" or "evaluate" (process has its own defaults).
        config_path: the `--config` YAML file, if any.
        flags: the command line's layer (`flags_layer`, from what `atropos.envs.cli` parsed).
        defaults: `load_defaults(env_cls)`, when the caller already has it.

    Returns:
        The validated configuration; `ATROPOS_*` variables are read from `os.environ`.

    Raises:
        ConfigError: a value breaks a rule or a key is unknown (the message names where).
    """
    defaults = defaults or load_defaults(env_cls)  # layers 1 and 2
    extra = tuple(namespaces(type(defaults.env)))
    layers: list[Layer] = []  # above layer 3, which `_resolve_env` starts from
    if config_path is not None:
        layers.append(file_layer(config_path, extra))  # layer 4
    layers.append(environ_layer(extra))  # layer 5
    if flags is not None:
        layers.append(flags)  # layer 6
    # each part stacks the same layers, lowest first: the manager, the servers, the env
    manager = _resolve_manager(layers)
    if defaults.servers_unset and manager.slurm:  # upstream's discovery, as before
        defaults = dataclasses.replace(defaults, servers=ServerBaseline.model_validate({}))
    servers = _resolve_servers(defaults, layers)
    env, tokenizer_why = _resolve_env(env_cls, mode, defaults, layers, servers)
    resolved = ResolvedConfig(env=env, servers=servers, manager=manager, mode=mode)
    if not manager.testing:  # --testing replaces the servers and the tokenizer
        resolved.notes = _notes(defaults, layers, resolved, tokenizer_why)
    return resolved


def _resolve_manager(layers: list[Layer]) -> ServerManagerConfig:
    """The validated server manager settings (`--slurm`, `--testing`, ...)."""
    values: dict[str, Any] = ServerManagerConfig.model_validate({}).model_dump()
    labels: dict[str, str] = {}
    for layer in layers:
        _apply(values, labels, layer, "", layer.manager, ServerManagerConfig)
    return _validate(ServerManagerConfig, values, labels, "--")


def _resolve_servers(defaults: Defaults, layers: list[Layer]) -> Servers:
    """The servers: `config_init()`'s, replaced by a file's list or overridden setting by
    setting."""
    model = defaults.server_model
    listed = [(layer, o) for layer in layers if isinstance(o := layer.openai, list)]
    overrides = [(layer, o) for layer in layers if isinstance(o := layer.openai, dict) and o]
    if listed:
        layer, entries = listed[-1]
        if overrides:
            where = overrides[-1][0].where("openai", next(iter(overrides[-1][1])))
            raise ConfigError(
                f"{where}: {layer.origin} lists {len(entries)} servers under openai:, so a"
                " single openai setting is ambiguous; set it in each server entry instead"
            )
        servers = []
        for i, entry in enumerate(entries):
            prefix = f"{layer.origin}: openai[{i}]."
            _check_keys(entry, model.model_fields, prefix.__add__, f"openai[{i}].".__add__)
            servers.append(_validate(model, dict(entry), {}, prefix))
        return servers
    if not overrides:
        return defaults.servers
    base = defaults.servers
    if isinstance(base, list) and len(base) > 1:
        where = overrides[-1][0].where("openai", next(iter(overrides[-1][1])))
        raise ConfigError(
            f"{where}: {defaults.origin} configures {len(base)} servers, so a single openai"
            " setting is ambiguous; list the servers under openai: in a --config file instead"
        )
    # A ServerBaseline is promoted to one concrete server whenever openai settings are given.
    first = base[0] if isinstance(base, list) else base
    values = first.model_dump()
    labels = {k: defaults.origin for k in first.model_fields_set}
    for layer, given in overrides:
        _apply(values, labels, layer, "openai", given, model)
    return [_validate(model, values, labels, "--openai.")]


def _resolve_env(
    env_cls: type, mode: Mode, defaults: Defaults, layers: list[Layer], servers: Servers
) -> tuple[BaseEnvConfig, str | None]:
    """The validated env config, and why its tokenizer was chosen when nobody named one."""
    model = type(defaults.env)
    values, labels = env_base(env_cls, mode, defaults)
    for layer in layers:
        _apply(values, labels, layer, "env", layer.env, model)
    tokenizer_why = None
    unset = model.model_fields["tokenizer_name"].default == TINY
    if unset and "tokenizer_name" not in labels:
        values["tokenizer_name"], tokenizer_why = default_tokenizer(servers)
        labels["tokenizer_name"] = "the servers"
    for section, section_model in namespaces(model).items():
        given_values = _plain_values(values.get(section))
        for layer in layers:
            if layer.sections.get(section):
                _apply(given_values, {}, layer, section, layer.sections[section], section_model)
                labels[section] = layer.where(section, next(iter(layer.sections[section])))
        values[section] = given_values
    if values["wandb_name"] is None:  # upstream meant this too, but it never took effect
        values["wandb_name"] = env_name(env_cls)
    if mode == "process" and values["data_path_to_save_groups"] is None:
        where = labels.get("data_path_to_save_groups", "")
        raise ConfigError(
            f"--env.data_path_to_save_groups (from {where}): process mode writes groups to a"
            " file and needs a path"
        )
    env = _validate(model, values, labels, "--env.", tuple(namespaces(model)))
    return env, tokenizer_why


def _plain_values(value: Any) -> dict[str, Any]:
    """A namespace's current settings as a dict (from `model_dump()` or a model)."""
    if isinstance(value, BaseModel):
        return {k: getattr(value, k) for k in type(value).model_fields}
    return dict(value or {})


def default_tokenizer(servers: Servers) -> tuple[str, str]:
    """The tokenizer of an environment that names none, and why: its servers' tokenizer
    (`tokenizer_name`, else `model_name`), `"tiny"` for the local tiny policy, and upstream's
    default only for servers of an unnamed model (a bare `ServerBaseline`, as upstream).

    >>> default_tokenizer([local_server_config()])
    ('tiny', 'the tokenizer of the local tiny policy (atropos-tiny)')
    >>> default_tokenizer([APIServerConfig(model_name="Qwen/Qwen3-8B")])[0]
    'Qwen/Qwen3-8B'
    """
    listed = servers if isinstance(servers, list) else [servers]
    names = {s.tokenizer_name if s.tokenizer_name != "none" else s.model_name for s in listed}
    name = names.pop() if len(names) == 1 else "default"
    if name == LOCAL_MODEL_NAME:
        return TINY, f"the tokenizer of the local tiny policy ({LOCAL_MODEL_NAME})"
    if name != "default":
        return name, "the servers' model"
    return UPSTREAM_TOKENIZER, "upstream's default: the servers name no model"


def _notes(
    defaults: Defaults, layers: list[Layer], resolved: ResolvedConfig, tokenizer_why: str | None
) -> list[str]:
    """What was chosen for settings nobody gave, in words (the run's first log lines)."""
    tokenizer = resolved.env.tokenizer_name
    servers = resolved.servers
    if defaults.servers_unset and not any(layer.openai for layer in layers):
        if isinstance(servers, list) and len(servers) == 1:
            server = servers[0]
            return [
                f"no inference server given: using the local CPU server at {server.base_url}"
                f" (model {server.model_name}, tokenizer {tokenizer}); start it with"
                f" `{local_serve_command()}` or pass --openai.base_url"
            ]
    if tokenizer_why is not None:
        return [
            f"no tokenizer given: using {tokenizer}, {tokenizer_why}"
            " (set --env.tokenizer_name to change it)"
        ]
    return []


def _apply(
    values: dict[str, Any],
    labels: dict[str, str],
    layer: Layer,
    section: str,
    given: Mapping[str, Any],
    model: type[BaseModel],
) -> None:
    """Merge one layer's `given` settings of `section` into `values` (dicts merge deeply)."""
    _check_keys(
        given,
        model.model_fields,
        lambda k: layer.where(section, k),
        lambda k: layer.key(section, k),
    )
    for key, raw in given.items():
        try:
            value = coerce_text(model, key, raw) if layer.kind != "file" else raw
        except ConfigError as e:
            raise ConfigError(f"{layer.where(section, key)}: {e}") from None
        values[key] = _merge(values.get(key), value)
        labels[key] = layer.where(section, key)


def coerce_text(model: type[BaseModel], key: str, text: Any) -> Any:
    """A text value (flag or variable) for `model.key`: "None"/"null" for optional fields,
    YAML for structured fields (lists, dicts, models); anything else goes to pydantic as is.

    >>> coerce_text(BaseEnvConfig, "wandb_name", "None") is None
    True
    >>> coerce_text(BaseEnvConfig, "reasoning_effort", "none")
    'none'
    >>> coerce_text(BaseEnvConfig, "group_size", "-1")
    '-1'
    """
    if not isinstance(text, str):
        return text
    annotation = model.model_fields[key].annotation
    args = union_members(annotation)
    if text in NONE_WORDS and (type(None) in args or annotation is Any):
        return None
    if annotation is Any or any(_structured(a) for a in args):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"cannot parse {text!r} as YAML or JSON: {e}") from None
    return text


def union_members(annotation: Any) -> tuple[Any, ...]:
    """The members of a union annotation (`int | None` -> `(int, NoneType)`), else `(it,)`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _structured(annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    if isinstance(origin, type):
        return issubclass(origin, (list, tuple, set, frozenset, dict, BaseModel)) or (
            origin.__module__ == "collections.abc"
        )
    return False


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _merge(old.get(k), v) for k, v in new.items()}}
    return new


def _check_keys(
    given: Iterable[str],
    known: Iterable[str],
    where: Callable[[str], str],
    show: Callable[[str], str] | None = None,
) -> None:
    """Refuse a key not in `known`: `where(key)` names it, `show` the suggestion (default
    `where`; a file's suggestion is the key path alone, the file already named in front)."""
    known = list(known)
    for key in given:
        if key not in known:
            hint = did_you_mean(key, known, show or where)
            raise ConfigError(f"{where(key)}: unknown setting{hint}")


def _validate(
    model: type[M],
    values: dict[str, Any],
    labels: dict[str, str],
    flag: str,
    sections: tuple[str, ...] = (),
) -> M:
    """`model(**values)`, or a ConfigError naming the flag, its source and the rule (a field
    of a namespace in `sections` is named `--judge.NAME`, not `--env.judge.NAME`)."""

    def name(loc: tuple[int | str, ...]) -> str:
        dotted = ".".join(str(p) for p in loc)
        if loc and loc[0] in sections:
            return f"--{dotted}"
        return f"{flag}{dotted}" if dotted else flag.rstrip(".: ")

    try:
        return model.model_validate(values)
    except ValidationError as e:
        raise ConfigError("\n".join(validation_lines(e, model, name, labels))) from None


def validation_lines(
    err: ValidationError,
    model: type[BaseModel],
    name: Callable[[tuple[int | str, ...]], str],
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """One line per problem in `err`, as a command line names it: `FLAG (from SOURCE): RULE
    (got VALUE)`, or `FLAG is required: DESCRIPTION` for a missing value.

    `name` turns an error's location into the flag as typed (`("batch_size",)` ->
    `--batch-size`); `labels` says where a top-level field's value came from, when not from
    that flag (`ATROPOS_TRAIN_BATCH_SIZE`). A secret's value is never echoed, and pydantic's
    error links are left out. Shared by the environments' and the trainer's command lines.
    """
    lines = []
    for problem in err.errors(include_url=False):
        loc = tuple(problem["loc"])
        head = name(loc)
        source = (labels or {}).get(str(loc[0])) if loc else None
        if source and source != head:
            head += f" (from {source})"
        if problem["type"] == "missing":
            info = model.model_fields.get(str(loc[0])) if len(loc) == 1 else None
            about = f": {info.description}" if info is not None and info.description else ""
            lines.append(f"{head} is required{about}")
            continue
        if problem["type"] == "value_error":  # a validator's own words, which name the value
            lines.append(f"{head}: {problem.get('ctx', {}).get('error', problem['msg'])}")
            continue
        shown = "input" in problem and not _sensitive(model, loc)
        got = f" (got {problem['input']!r})" if shown else ""
        lines.append(f"{head}: {problem['msg']}{got}")
    return lines


def _sensitive(model: type[BaseModel], loc: tuple[int | str, ...]) -> bool:
    """Whether an invalid value at `loc` may be a secret, and so must not be echoed."""
    info = model.model_fields.get(str(loc[0])) if loc else None
    secret_type = info is not None and "Secret" in str(info.annotation)
    secret_name = any(w in str(p).lower() for p in loc for w in ("key", "secret", "password"))
    return secret_type or secret_name or "token" in loc
