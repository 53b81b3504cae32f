"""`load_hub` reads local JSONL (a file, or a directory of splits) without `datasets`, and
names the hub dataset when the hub cannot be used."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from atropos.environments.common.data_loading import HubUnavailable, load_hub
from atropos.install import install_hint


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_local_jsonl_file_is_read_for_any_split(tmp_path: Path, caplog) -> None:
    f = write(tmp_path / "rows.jsonl", [{"question": "1+1?", "answer": "2"}])
    with caplog.at_level("WARNING", logger="atropos.env"):
        load_hub(str(f), "train")
    assert not caplog.records  # the warning is for held-out splits only
    assert (
        load_hub(str(f), "train")
        == load_hub(str(f), "test")
        == [{"question": "1+1?", "answer": "2"}]
    )
    assert "split 'test' reads the same rows as the training split" in caplog.text


def test_a_directory_of_splits_gives_each_split(tmp_path: Path) -> None:
    write(tmp_path / "train.jsonl", [{"i": 1}, {"i": 2}])
    write(tmp_path / "test.jsonl", [{"i": 3}])
    assert load_hub(str(tmp_path), "train") == [{"i": 1}, {"i": 2}]
    assert load_hub(str(tmp_path), "test") == [{"i": 3}]
    with pytest.raises(FileNotFoundError, match=r"no validation.jsonl.*'test.jsonl'"):
        load_hub(str(tmp_path), "validation")


def test_a_bad_local_line_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "rows.jsonl"
    f.write_text('{"i": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2: expected a JSON object"):
        load_hub(str(f), "train")


def test_a_hub_name_without_datasets_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(HubUnavailable, match=re.escape(install_hint("hub"))):
        load_hub("someone/not-a-local-path", "train")
