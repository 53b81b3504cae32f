"""`BaseEnv`: atroposlib 0.4.0's environment hooks and names, run by our runners.

An upstream environment ports by changing its imports: the hooks (`setup`, `get_next_item`,
`collect_trajectory`, `collect_trajectories`, `postprocess_histories`, `evaluate`,
`wandb_log`, `save_checkpoint`/`load_checkpoint`, `cleanup`, `config_init`, `cli`) and the data
types keep their names and meanings (upstream envs' own `score(rollout_group_data)` methods are
theirs to call, as before). What runs them is new (`atropos.envs.runner`): a bounded
worker pool that pauses admission instead of cancelling rollouts, a sender that never drops a
group on an API outage, eval and checkpoint triggers that never miss a period, and graceful
shutdown. For the common case, `atropos.envs.simple.Env` needs only `load()` and `score()`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, cast, get_args, get_origin

from typing_extensions import TypeVar

from atropos.envs.config import BaseEnvConfig
from atropos.envs.types import (
    DROP_REASONS,
    EvalHandlingEnum,
    Item,
    ScoredDataGroup,
    ScoredDataItem,
)
from atropos.inference.config import APIServerConfig, ServerBaseline, ServerManagerConfig

# upstream envs import these names from `atroposlib.envs.base`; they are here under the same names
__all__ = [
    "APIServerConfig",
    "BaseEnv",
    "BaseEnvConfig",
    "EvalHandlingEnum",
    "Item",
    "ScoredDataGroup",
    "ScoredDataItem",
    "ServerBaseline",
    "ServerManagerConfig",
    "group_from_items",
]

if TYPE_CHECKING:
    from atropos.inference.manager import ServerManager
    from atropos.metrics import MetricsSink

log = logging.getLogger("atropos.env")

ServerConfigs = ServerBaseline | APIServerConfig | list[APIServerConfig]
ConfigT = TypeVar("ConfigT", bound=BaseEnvConfig, default=BaseEnvConfig)
"""The config class an environment is generic over: `class GSM8K(Env[GSM8KConfig])`."""
_OPTIONAL_ROW_FIELDS = (
    "advantages",
    "ref_logprobs",
    "messages",
    "inference_logprobs",
    "overrides",
    "distill_token_ids",
    "distill_logprobs",
)


class BaseEnv(ABC, Generic[ConfigT]):
    """An environment: produces items, rolls out groups through the policy, scores them.

    Generic over its config: `class MyEnv(BaseEnv[MyConfig])` types `self.config` as `MyConfig`
    and sets `env_config_cls = MyConfig` (upstream's spelling, a plain `env_config_cls = MyConfig`
    class attribute, still works; the two may not disagree). `config` is always an instance of
    `env_config_cls`: an unmodified upstream-style caller may pass a plain `BaseEnvConfig` (or
    any other `BaseEnvConfig`), and `__init__` converts it once into `env_config_cls`, validated,
    keeping every value the caller set (the other fields take `env_config_cls`'s defaults).
    """

    name: ClassVar[str | None] = None
    env_config_cls: ClassVar[type[BaseEnvConfig]] = BaseEnvConfig
    config_defaults: ClassVar[dict[str, Any]] = {}  # values of the default `config_init`
    config: ConfigT
    metrics_sink: MetricsSink | None = None  # set by the runner for the length of a run
    evaluations_shown = 0  # metrics lines `evaluate_log` printed (the evaluate runner's summary)
    last_eval_metrics: dict[str, Any] | None = None  # what `evaluate_log` got last

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = config_class_of(cls)
        if declared is None:
            return
        own = cls.__dict__.get("env_config_cls")
        if own is not None and own is not declared:
            raise TypeError(
                f"{cls.__name__} is generic over {declared.__name__} but sets env_config_cls ="
                f" {own.__name__}; drop env_config_cls (the generic argument sets it)"
            )
        cls.env_config_cls = declared

    def __init__(
        self,
        config: BaseEnvConfig,
        server_configs: ServerConfigs,
        slurm: bool = False,
        testing: bool = False,
        manager: ServerManagerConfig | None = None,
    ) -> None:
        manager = manager or ServerManagerConfig(slurm=slurm, testing=testing)
        if isinstance(server_configs, APIServerConfig):
            server_configs = [server_configs]
        self.server_configs = server_configs
        self.manager_config = manager
        self._server: ServerManager | None = None
        self._tokenizer: Any = None
        if config.max_num_workers == -1:  # resolved in the caller's config, as upstream did
            servers = len(server_configs) if isinstance(server_configs, list) else 4
            config.max_num_workers = config.max_num_workers_per_node * max(1, servers)
        self.config = cast(ConfigT, as_env_config(config, type(self).env_config_cls))
        # state the runners keep up to date (upstream's attribute names)
        self.curr_step = 0
        self.status_dict: dict[str, Any] = {}
        self.env_id: int | None = None
        self.wandb_prepend: str | None = None
        self.checkpoint_dir = ""
        self.checkpoint_interval = -1
        self.max_token_len = -1
        self.items_sent_this_step = 0
        self.metrics: dict[str, float] = {}
        self._closers: list[Callable[[], Awaitable[None]]] = []

    # ----- resources, created on first use -----------------------------------------------------

    @property
    def server(self) -> ServerManager:
        """The inference servers (a `ServerManager`), created on first use.

        The env's `thinking_mode`, `reasoning_effort` and `max_reasoning_tokens` go with it
        (`Reasoning.of`): every chat request and `managed_server` session applies them the way
        its server takes them (docs/inference.md, "Reasoning controls").
        """
        if self._server is None:
            from atropos.inference.manager import ServerManager
            from atropos.inference.reasoning import Reasoning

            # backends that need a tokenizer (TRL, text prompts) share the env's when loaded
            self._server = ServerManager(
                self.server_configs,
                self.manager_config,
                tokenizer=self._tokenizer,
                reasoning=Reasoning.of(self.config),
            )
        return self._server

    @server.setter
    def server(self, value: ServerManager) -> None:
        self._server = value

    def on_close(self, close: Callable[[], Awaitable[None]]) -> None:
        """Have `aclose()` await `close()` (e.g. a judge's own server manager)."""
        self._closers.append(close)

    async def aclose(self) -> None:
        """Release what the env holds: what `on_close` registered (newest first), then the
        inference servers. The runners call it once, when a run ends."""
        closers = getattr(self, "_closers", [])  # an upstream env may skip our __init__
        while closers:
            try:
                await closers.pop()()
            except Exception:  # one failing close must not keep the others open
                log.exception("closing %s failed", type(self).__name__)
        server = getattr(self, "_server", None)
        if server is not None:
            await server.aclose()

    @property
    def tokenizer(self) -> Any:
        """The tokenizer named by `config.tokenizer_name`, loaded on first use (not at import)."""
        if self._tokenizer is None:
            from atropos.inference.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.tokenizer_name)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    # ----- hooks ---------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Load datasets and anything else the env needs; called once before any rollout."""
        return None

    @abstractmethod
    async def get_next_item(self) -> Item:
        """The next item to roll out, or None when there is nothing to do right now."""

    async def collect_trajectory(self, item: Item) -> tuple[ScoredDataItem | None, list[Item]]:
        """One rollout of `item` (used by the default `collect_trajectories`)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement collect_trajectory or collect_trajectories"
        )

    async def collect_trajectories(
        self, item: Item
    ) -> tuple[ScoredDataGroup | list[ScoredDataGroup | None] | None, list[Item]]:
        """A group for `item`: by default `group_size` calls of `collect_trajectory`, gathered.

        Rollouts that return None are left out (upstream raised). An optional per-rollout
        field is kept only when every kept rollout has it, so rows always line up with tokens
        (upstream could misalign them).
        """
        import asyncio

        results = await asyncio.gather(
            *(self.collect_trajectory(item) for _ in range(self.config.group_size))
        )
        backlog: list[Item] = []
        kept: list[ScoredDataItem] = []
        for one, more in results:
            backlog.extend(more or [])
            if one is not None:
                kept.append(one)
        if not kept:
            return None, backlog
        return group_from_items(kept), backlog

    async def postprocess_histories(self, trajectories: Any) -> Any:
        """Change groups after collection and before sending (identity by default)."""
        return trajectories

    @abstractmethod
    async def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        """Run an evaluation; the runner calls it every `steps_per_eval` trainer steps."""

    def drop(self, reason: str) -> None:
        """Say why the item being collected gives no group (or one group fewer): "all_wrong",
        "too_easy", ... The runners count it as `dropped/<reason>` in metrics and in the
        message of a run that makes nothing; an item that gives no group without a reason is
        counted as `dropped/by_env`. Outside a runner it does nothing."""
        counts = DROP_REASONS.get()
        if counts is not None:
            counts[reason] = counts.get(reason, 0) + 1

    def record_mean(self, key: str, values: Iterable[float]) -> None:
        """Keep `values` for the metric `key`: the next `wandb_log` logs the mean of what was
        kept since the last one (e.g. `train/percent_correct`, 1.0 or 0.0 per rollout)."""
        self.__dict__.setdefault("_pending_means", {}).setdefault(key, []).extend(values)

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Record this step's metrics: kept in `self.metrics` (the latest value of each key)
        and written as one record at `curr_step` to the run's sink (JSONL, and W&B when on).

        The runners call it with what they know (serve: once per trainer step; process: once
        at the end); an override adds its own keys and calls `super().wandb_log(metrics)`.
        The means of the values `record_mean` kept since the last call are added, and the
        values dropped (a key with none kept is left out).
        """
        pending: dict[str, list[float]] = self.__dict__.pop("_pending_means", {})
        means = {key: sum(values) / len(values) for key, values in pending.items() if values}
        if means:
            metrics = {**(metrics or {}), **means}
        if metrics:
            self.metrics.update(metrics)
            self._write_metrics(metrics)

    def _write_metrics(self, metrics: dict[str, Any]) -> None:
        """One record of `metrics` at `curr_step` to the sink the runner attached, if any."""
        sink = getattr(self, "metrics_sink", None)  # an upstream env may skip our __init__
        if sink is not None:
            sink.log(metrics, step=getattr(self, "curr_step", 0))

    async def cleanup(self) -> None:
        """Called after each item is handled."""
        return None

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, ServerConfigs]:
        """The lowest layer of configuration: (env config, server config or configs). This
        default names no servers (the runner then uses the local CPU server and says so) and
        builds `env_config_cls(**config_defaults)`."""
        return cls.env_config_cls(**cls.config_defaults), ServerBaseline()

    @classmethod
    def cli(cls, argv: list[str] | None = None) -> None:
        """`python my_env.py serve|process|evaluate [flags]`."""
        from atropos.envs.cli import cli_main

        cli_main(cls, argv)

    def evaluate_log(
        self,
        metrics: dict[str, Any],
        task_name: str | None = None,
        model_name: str | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
        generation_parameters: dict[str, Any] | None = None,
        samples: list[dict[str, Any]] | None = None,
        verbose: bool = True,
    ) -> Path | None:
        """Write `metrics.json` (and `samples.jsonl`) in upstream's lighteval-like format, and
        log `metrics` to the run's sink at `curr_step` (a key without a `/` gets `eval/`)."""
        out = self.config.data_dir_to_save_evals
        task = task_name or f"{self.name or type(self).__name__}_eval"
        if model_name is None and isinstance(self.server_configs, list) and self.server_configs:
            model_name = self.server_configs[0].model_name
        params = {"max_new_tokens": self.config.max_token_length, **(generation_parameters or {})}
        self.last_eval_metrics = dict(metrics)  # serve's --env.eval_every sends it to the API
        elapsed = (end_time or time.time()) - (start_time or time.time())
        doc = {
            "config_general": {
                "model_name": model_name,
                "total_evaluation_time_seconds": str(elapsed),
                "generation_parameters": params,
            },
            "results": {f"atropos|{task}|0": metrics, "all": metrics},
        }
        if verbose:
            log.warning("evaluation %s: %s", task, metrics)
            self.evaluations_shown += 1
        self._write_metrics({k if "/" in k else f"eval/{k}": v for k, v in metrics.items()})
        if not out:
            return None
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text(json.dumps(doc, indent=2))
        if samples is not None:
            with open(folder / "samples.jsonl", "w", encoding="utf-8") as f:
                for sample in samples:
                    f.write(json.dumps(sample, ensure_ascii=False) + "\n")
        return folder / "metrics.json"

    # ----- checkpoints ---------------------------------------------------------------------------

    def checkpoint_path(self, step: int) -> Path:
        """Where the checkpoint of `step` lives: stable across restarts (name + env_key)."""
        identity = self.config.env_key or self.config.wandb_name or type(self).__name__
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", identity)
        base = Path(self.checkpoint_dir or "checkpoints")
        return base / "env_checkpoints" / safe / f"step-{step}.json"

    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> Path | None:
        """Write `data` (or `self.checkpoint_state()`) atomically for `step`."""
        state = data if data is not None else self.checkpoint_state()
        if state is None:
            return None
        path = self.checkpoint_path(step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"step": step, "saved_at": time.time(), "state": state}))
        os.replace(tmp, path)
        return path

    def checkpoint_state(self) -> dict[str, Any] | None:
        """What to checkpoint when no data is passed (None: nothing). Override to save state."""
        return None

    def load_checkpoint(self) -> dict[str, Any] | None:
        """Load the newest checkpoint at or before the current step; call `restore_state`."""
        folder = self.checkpoint_path(0).parent
        if not folder.is_dir():
            return None
        steps = sorted(
            int(m.group(1))
            for p in folder.iterdir()
            if (m := re.fullmatch(r"step-(\d+)\.json", p.name))
            and int(m.group(1)) <= self.curr_step
        )
        if not steps:
            return None
        doc = json.loads(self.checkpoint_path(steps[-1]).read_text())
        state: dict[str, Any] = doc["state"]
        self.restore_state(state)
        return state

    def restore_state(self, state: dict[str, Any]) -> None:
        """Apply a loaded checkpoint; the default sets each key that is already an attribute."""
        for key, value in state.items():
            if hasattr(self, key):
                setattr(self, key, value)
            else:
                log.warning("checkpoint key %r is not an attribute of %s", key, type(self).__name__)


def config_class_of(cls: type) -> type[BaseEnvConfig] | None:
    """The concrete config class in `cls`'s own generic bases (`Env[GSM8KConfig]` ->
    GSM8KConfig); None when it names none (plain `BaseEnv`, or still generic over `ConfigT`)."""
    for base in cls.__dict__.get("__orig_bases__", ()):
        origin = get_origin(base)
        if isinstance(origin, type) and issubclass(origin, BaseEnv):
            for arg in get_args(base):
                if isinstance(arg, type) and issubclass(arg, BaseEnvConfig):
                    return arg
    return None


def as_env_config(config: BaseEnvConfig, cls: type[BaseEnvConfig]) -> BaseEnvConfig:
    """`config` as an instance of `cls`: itself when it is one, else a `cls` built from the
    fields `config` was given (by its constructor or assigned since) that `cls` has.

    >>> class Mine(BaseEnvConfig):
    ...     group_size: int = 2
    ...     extra: str = "default"
    >>> mine = as_env_config(BaseEnvConfig(use_wandb=False), Mine)
    >>> type(mine).__name__, mine.group_size, mine.use_wandb, mine.extra
    ('Mine', 2, False, 'default')
    """
    if isinstance(config, cls):
        return config
    # Validated, not `model_construct`: `cls`'s own rules (ranges, cross-field checks) and
    # normalisations run, so the env never sees a config its class would have refused. Only the
    # fields the caller set are passed: they already passed the same base rules in
    # BaseEnvConfig's constructor, so only `cls`'s own rules can reject them; a base default the
    # caller never chose (group_size=4) is not passed, so it cannot trip a rule of `cls` (rlaif's
    # pairs) that its own default (2) satisfies; a field `cls` lacks is left out.
    given = {k: getattr(config, k) for k in config.model_fields_set if k in cls.model_fields}
    return cls.model_validate(given)


def group_from_items(items: list[ScoredDataItem]) -> ScoredDataGroup:
    """Gather rollouts into a group, keeping an optional field only when every rollout has it."""
    group: dict[str, Any] = {
        "tokens": [it["tokens"] for it in items],
        "masks": [it["masks"] for it in items],
        "scores": [float(it["scores"]) for it in items],
    }
    for key in _OPTIONAL_ROW_FIELDS:
        values = [it.get(key) for it in items]
        group[key] = values if all(v is not None for v in values) else None
    group["images"] = (
        [it.get("images") for it in items] if any("images" in it for it in items) else None
    )
    merged: dict[str, Any] = {}
    for it in items:
        merged.update(it.get("group_overrides") or {})
    group["group_overrides"] = merged or None
    sources = {it.get("token_source") for it in items} - {None}
    group["token_source"] = sources.pop() if len(sources) == 1 else ("mixed" if sources else None)
    return group  # type: ignore[return-value]
