"""The page of a process run names the run's tokenizer, read from `<name>.config.yaml`."""

from __future__ import annotations

import json
from pathlib import Path

from atropos.view import page_of_files, recorded_tokenizer

GROUP = {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0]}


def run_files(folder: Path, tokenizer: str | None) -> Path:
    jsonl = folder / "capitals_1.jsonl"
    jsonl.write_text(json.dumps(GROUP) + "\n")
    if tokenizer is not None:
        jsonl.with_suffix(".config.yaml").write_text(
            f"mode: process\nenv:\n  tokenizer_name: {tokenizer}\nopenai:\n- tokenizer_name: ''\n"
        )
    return jsonl


def test_the_page_names_the_recorded_tokenizer(tmp_path):
    jsonl = run_files(tmp_path, "tiny")
    assert recorded_tokenizer(jsonl) == "tiny"
    text, _ = page_of_files([jsonl], "run")
    assert "This run used the tokenizer" in text
    assert "--tokenizer tiny" in text


def test_without_a_record_the_page_says_what_it_needs(tmp_path):
    jsonl = run_files(tmp_path, None)
    assert recorded_tokenizer(jsonl) is None
    text, _ = page_of_files([jsonl], "run")
    assert "Token highlighting needs a tokenizer" in text and "used the tokenizer" not in text


def test_a_broken_record_is_no_record(tmp_path):
    jsonl = run_files(tmp_path, None)
    jsonl.with_suffix(".config.yaml").write_text("env: [unclosed\n")
    assert recorded_tokenizer(jsonl) is None
    jsonl.with_suffix(".config.yaml").write_text("- a list\n")
    assert recorded_tokenizer(jsonl) is None


def test_atropos_view_highlights_with_the_recorded_tokenizer(tmp_path, capsys):
    from atropos.cli.main import main

    jsonl = run_files(tmp_path, "tiny")
    out = tmp_path / "page.html"
    assert main(["view", str(jsonl), "-o", str(out)]) == 0
    text = out.read_text()
    assert "This run used the tokenizer" not in text  # it was loaded, not only named
    assert "Token highlighting needs a tokenizer" not in text


def test_a_recorded_tokenizer_that_does_not_load_is_a_note(tmp_path, capsys):
    from atropos.cli.main import main

    jsonl = run_files(tmp_path, str(tmp_path / "no-such-tokenizer"))
    out = tmp_path / "page.html"
    assert main(["view", str(jsonl), "-o", str(out)]) == 0
    assert "does not load here" in capsys.readouterr().out
