"""Fixtures: W&B in offline mode inside tmp_path (the tiny model: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """W&B offline, silent, no console capture, files under the returned directory."""
    pytest.importorskip("wandb")
    folder = tmp_path / "wandb-dir"
    folder.mkdir()
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(folder),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("WANDB_PROJECT", "WANDB_RUN_GROUP", "WANDB_API_KEY", "WANDB_ENTITY"):
        monkeypatch.delenv(key, raising=False)
    yield folder
    import wandb

    wandb.teardown()  # stop this process's wandb-core service
