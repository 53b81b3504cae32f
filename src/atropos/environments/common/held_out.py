"""Environments whose items are a shipped fixture, or a hub dataset with a share held out.

A `HeldOutEnv` reads its training and its eval items with `load_train_test`: the fixture's
`train.jsonl` and `test.jsonl` (under `atropos/environments/data/<fixture>/`), or, with
`--env.dataset_name`, the hub dataset's train split with `--env.test_fraction` of it held out
by a seeded shuffle. The fixture's folder is the env's `name` unless it names its `fixture`;
a subclass may check each row (`check_row`). `mcqa` and `fundamentals` are built on it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field
from typing_extensions import TypeVar

from atropos.environments.common.data_loading import load_train_test
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env

__all__ = ["HeldOutConfig", "HeldOutEnv"]


class HeldOutConfig(BaseEnvConfig):
    """The data settings of a `HeldOutEnv`."""

    dataset_name: str | None = Field(
        default=None, description="hub dataset (unset: the shipped fixture)"
    )
    test_fraction: float = Field(default=0.05, gt=0, lt=1, description="hub rows held out")


HeldOutConfigT = TypeVar("HeldOutConfigT", bound=HeldOutConfig, default=HeldOutConfig)


class HeldOutEnv(Env[HeldOutConfigT]):
    """An `Env` whose items are `fixture`'s files, or a hub dataset with a share held out."""

    env_config_cls: ClassVar[type[BaseEnvConfig]] = HeldOutConfig  # the generic default's
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 8, "use_wandb": False}
    fixture: ClassVar[str] = ""  # its folder under atropos/environments/data/ (unset: `name`)
    seed = 42  # upstream's shuffle seed

    def check_row(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        """A row as the env keeps it, or a ValueError naming `where`. Default: as it is."""
        return row

    def load_split(self, split: str) -> list[dict[str, Any]]:
        """The items of `split`: "train" (for `load`) or "test" (for `load_eval`)."""
        s = self.config
        fixture = self.fixture or str(self.name)
        return load_train_test(fixture, split, s.dataset_name, s.test_fraction, self.check_row)

    def load(self) -> list[dict[str, Any]]:
        return self.load_split("train")

    def load_eval(self) -> list[dict[str, Any]]:
        return self.load_split("test")
