"""The evaluation suites as one family: a `Suite` spec per benchmark, one env class built from it.

A `Suite` names the benchmark, where its data lives (one or more hub `Part`s: dataset id,
config, split, and the shipped fixture file in the same row layout), how a row becomes a
`Problem` and how an answer to it is graded (its `Format`, `formats.py`), and how its rows
group into subsets. `suite_env(suite, "ClassName")` makes the environment class that
`atropos env evaluate NAME` runs; `catalog.py` holds the table of suites.

Data: the fixture by default (offline); `--env.dataset_name NAME` reads the hub. NAME is the
suite's own dataset (or, for a suite spread over several repositories such as AGIEval, its
family name or one part's repository): each selected part is read with its own config and
split. Any other NAME (a mirror, a local directory of `<split>.jsonl`) is read with each part's
config and split in place of the part's dataset. `--env.dataset_config` and
`--env.dataset_split` replace every part's; `--env.data_file FILE` reads one local JSONL file.
`--env.subsets a,b` keeps those parts (default: the suite's default parts).

>>> from atropos.environments.evals.catalog import ARC
>>> [part.label for part in ARC.parts], ARC.parts[0].fixture, ARC.benchmark, ARC.hub_dataset
(['ARC-Easy', 'ARC-Challenge'], 'arc/ARC-Easy.jsonl', 'arc', 'allenai/ai2_arc')
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BeforeValidator, Field
from typing_extensions import TypeVar

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl
from atropos.environments.evals.base import EvalConfig, EvalEnv, Graded, Problem
from atropos.environments.evals.formats import Format, Row
from atropos.envs.config import BaseEnvConfig
from atropos.names import did_you_mean

__all__ = [
    "PART",
    "Part",
    "Suite",
    "SuiteConfig",
    "SuiteEval",
    "CommaList",
    "comma_list",
    "one",
    "suite_env",
]

PART = "_part"  # the key under which a loaded row carries the label of the part it came from


@dataclass(frozen=True)
class Part:
    """One part of a suite's data on the hub, and its fixture (under `data/evals/`; None: the
    fixture has no rows of this part). `default`: evaluated when `--env.subsets` is unset."""

    label: str
    dataset: str
    config: str | None
    split: str
    fixture: str | None = None
    default: bool = True


@dataclass(frozen=True)
class Suite:
    """One benchmark: its names, data, row format and grading (see the module docstring)."""

    name: str  # the environment's name, `eval_arc`; less `eval_`, the benchmark's
    title: str  # one line: `atropos env list` and the class docstring
    parts: tuple[Part, ...]
    format: Format
    family: str = ""  # the name users give a suite kept in several repositories (AGIEval)
    ident: str | Callable[[Row, int], str] | None = None  # the id field, or the id (see `id_of`)
    subsets: Callable[[Row], dict[str, str]] | None = None  # a row's own subsets
    keep: Callable[[Row], bool] | None = None  # which rows to evaluate (None: all)
    part_group: str = "subset"  # the subset name the part labels go under (several parts)
    system_prompt: str | None = None

    @property
    def benchmark(self) -> str:
        """The task name in metrics.json and the problem ids' prefix (`arc`)."""
        return self.name.removeprefix("eval_")

    @property
    def hub_dataset(self) -> str:
        """The dataset id users name: the family's, else the first part's."""
        return self.family or self.parts[0].dataset

    def id_of(self, row: Row, index: int) -> str:
        """A problem's id: `ident(row, index)`, else `<benchmark>-<row[ident]>`, falling back
        to `<benchmark>-<index>`.

        >>> from atropos.environments.evals.catalog import AIME
        >>> AIME.id_of({"id": 60}, 0), AIME.id_of({}, 3)
        ('aime-60', 'aime-3')
        """
        if callable(self.ident):
            return self.ident(row, index)
        value = row.get(self.ident) if self.ident else None
        return f"{self.benchmark}-{value if value not in (None, '') else index}"


def one(
    dataset: str, split: str, fixture: str, config: str | None = None, label: str = ""
) -> tuple[Part]:
    """The single part of a suite held in one hub dataset (labelled by its config)."""
    return (Part(label or config or "default", dataset, config, split, fixture),)


def comma_list(value: Any) -> Any:
    """A flag's `a,b` text as a list (a list as it is; pydantic checks the items).

    >>> comma_list("astronomy, virology"), comma_list(["x"])
    (['astronomy', 'virology'], ['x'])
    """
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


CommaList = Annotated[list[str] | None, BeforeValidator(comma_list)]
"""A list flag that also takes `a,b` text (`--env.subsets ARC-Easy,ARC-Challenge`)."""


class SuiteConfig(EvalConfig):
    """The settings of an evaluation suite (every field is a `--env.NAME` flag)."""

    subsets: CommaList = Field(
        default=None, description="only these parts, e.g. ARC-Easy (unset: the suite's default)"
    )


SuiteConfigT = TypeVar("SuiteConfigT", bound=SuiteConfig, default=SuiteConfig)


class SuiteEval(EvalEnv[SuiteConfigT]):
    """An evaluation env driven by its class's `suite` (made by `suite_env`)."""

    env_config_cls: ClassVar[type[BaseEnvConfig]] = SuiteConfig
    suite: ClassVar[Suite]

    def selected(self) -> list[Part]:
        """The parts to evaluate: `--env.subsets` (each must name a part), else the defaults."""
        wanted, parts = self.config.subsets, {p.label: p for p in self.suite.parts}
        if not wanted:
            return [p for p in self.suite.parts if p.default]
        unknown = [w for w in wanted if w not in parts]
        if unknown:
            hint = did_you_mean(unknown[0], parts, repr)
            raise ValueError(
                f"{self.name}: no part {unknown[0]!r}{hint} (parts: {', '.join(parts)})"
            )
        return [parts[w] for w in wanted]

    def load_rows(self) -> list[dict[str, Any]]:
        """The rows of the selected parts, each tagged with its part's label (`PART`): from
        `data_file`, the hub (`dataset_name`), or the fixture."""
        s, parts = self.config, self.selected()
        if s.data_file:
            return _tagged(read_jsonl(s.data_file), parts[0] if len(parts) == 1 else None)
        if s.dataset_name and Path(s.dataset_name).expanduser().exists():
            return self._local_rows(s.dataset_name, parts)
        if s.dataset_name:
            return [
                row for part in self._hub_parts() for row in _tagged(self._hub_rows(part), part)
            ]
        return self._fixture_rows(parts)

    def _hub_parts(self) -> list[Part]:
        """The parts to read from the hub: the selected ones, or, when the dataset named is the
        repository of some parts only (one AGIEval subset), those."""
        name, suite = self.config.dataset_name, self.suite
        own = [p for p in suite.parts if p.dataset == name]
        if name == suite.hub_dataset or not own or len(own) == len(suite.parts):
            return self.selected()
        return [p for p in own if not self.config.subsets or p.label in self.config.subsets]

    def _hub_rows(self, part: Part) -> list[dict[str, Any]]:
        s = self.config
        name = s.dataset_name or self.suite.hub_dataset
        dataset = part.dataset if name in (self.suite.hub_dataset, part.dataset) else name
        config = s.dataset_config if s.dataset_config is not None else part.config
        return load_hub(dataset, s.dataset_split or part.split, config)

    def _local_rows(self, name: str, parts: list[Part]) -> list[dict[str, Any]]:
        """A local file or directory named as the dataset: each split read once, its rows
        tagged with the part when only one selected part has that split."""
        splits: dict[str, list[Part]] = {}
        for part in parts:
            splits.setdefault(self.config.dataset_split or part.split, []).append(part)
        if Path(name).expanduser().is_file():  # one file holds every split's rows
            splits = {self.config.dataset_split or parts[0].split: parts}
        rows = []
        for split, owners in splits.items():
            rows += _tagged(load_hub(name, split), owners[0] if len(owners) == 1 else None)
        return rows

    def _fixture_rows(self, parts: list[Part]) -> list[dict[str, Any]]:
        missing = [p.label for p in parts if p.fixture is None]
        if missing and self.config.subsets:
            raise ValueError(
                f"{self.name}: the shipped fixture has no rows of {', '.join(missing)};"
                f" name the hub dataset (--env.dataset_name {self.suite.hub_dataset})"
            )
        return [
            row
            for part in parts
            if part.fixture is not None
            for row in _tagged(read_jsonl(data_path("evals", part.fixture)), part)
        ]

    def keep(self, row: Mapping[str, Any]) -> bool:
        return self.suite.keep is None or self.suite.keep(row)

    def problem(self, row: Mapping[str, Any], index: int) -> Problem:
        suite = self.suite
        found = suite.format.problem(row, suite.id_of(row, index))
        if len(suite.parts) > 1 and row.get(PART):
            found.subsets[suite.part_group] = str(row[PART])
        if suite.subsets is not None:
            found.subsets.update(suite.subsets(row))
        return found

    def grade(self, problem: Problem, answer: str) -> Graded:
        return self.suite.format.grade(problem, answer)

    def extra_metrics(self, problems: list[Problem], graded: list[list[Graded]]) -> dict[str, Any]:
        return self.suite.format.extra_metrics(problems, graded)


def _tagged(rows: list[dict[str, Any]], part: Part | None) -> list[dict[str, Any]]:
    return rows if part is None else [{**row, PART: part.label} for row in rows]


def suite_env(
    suite: Suite, class_name: str, base: type[SuiteEval[Any]] = SuiteEval
) -> type[SuiteEval[Any]]:
    """The environment class of `suite` (a subclass of `base`), named `class_name`."""
    first = suite.parts[0]
    attributes = {
        "__doc__": suite.title,
        "__module__": "atropos.environments.evals",
        "__qualname__": class_name,
        "suite": suite,
        "name": suite.name,
        "benchmark": suite.benchmark,
        "fixture": first.fixture if len(suite.parts) == 1 else suite.benchmark,
        "hub_dataset": suite.hub_dataset,
        "hub_config": first.config,
        "hub_split": first.split,
        "system_prompt": suite.system_prompt,
        "requires": dict(suite.format.requires),
    }
    return type(class_name, (base,), attributes)
