"""docs/launch.md's run file reference names exactly the keys the models take."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from atropos.launch import config

DOC = Path(__file__).resolve().parents[2] / "docs" / "launch.md"
COMMON = set(config.Placement.model_fields)
SECTIONS: dict[str, tuple[type[BaseModel], set[str]]] = {
    "`run`": (config.RunSection, set()),
    "`run.ray`": (config.RaySettings, set()),
    "`run.slurm`": (config.SlurmSettings, set()),
    "Keys every process section takes": (config.Placement, set()),
    "`restart`": (config.Restart, set()),
    "`api`": (config.ApiSection, COMMON),
    "`inference`": (config.InferenceServer, COMMON),
    "`envs`": (config.EnvEntry, COMMON),
    "`trainer`": (config.TrainerSection, COMMON),
}


def documented() -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}
    section = None
    for line in DOC.read_text().splitlines():
        if line.startswith("### "):
            title = line[4:]
            section = next((s for s in SECTIONS if title.startswith(s)), None)
            keys.setdefault(section or title, set())
        elif section and (match := re.match(r"\| `([a-z_]+)` \|", line)):
            keys[section].add(match.group(1))
    return keys


@pytest.mark.parametrize("section", list(SECTIONS))
def test_reference_matches_the_models(section: str) -> None:
    model, common = SECTIONS[section]
    assert documented()[section] == set(model.model_fields) - common
