"""Reading JSONL for the page: bad lines counted and listed, the limit, gz, lists of groups."""

from __future__ import annotations

import gzip
import json

from atropos.view import page_of_files, read_files
from atropos.view.data import Budget, group_data, page_data
from atropos.view.read import BAD_EXAMPLES

from .conftest import chat_group, page_json, write_jsonl

GROUP = {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0]}


def test_bad_lines_are_counted_with_line_and_reason_never_raised(tmp_path):
    path = write_jsonl(
        tmp_path / "a.jsonl",
        [GROUP, "{not json", "", '"a string"', {"tokens": [[1]]}, GROUP, "[1, 2]", "null"],
    )
    found = read_files([path])
    assert len(found.entries) == 2
    assert [e.where for e in found.entries] == ["a.jsonl:1", "a.jsonl:6"]
    assert found.bad == 5
    assert [(b.line, b.reason) for b in found.bad_examples] == [
        (2, "invalid JSON"),
        (4, "not a group: a string"),
        (5, "not a group: no scores list"),
        (7, "not a group: a list of something else"),
        (8, "not a group: null"),
    ]
    assert found.sources[0].groups == 2 and found.sources[0].bad == 5


def test_only_the_first_bad_lines_are_listed_but_all_are_counted(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ["x"] * (BAD_EXAMPLES + 7))
    found = read_files([path])
    assert found.bad == BAD_EXAMPLES + 7 and len(found.bad_examples) == BAD_EXAMPLES


def test_limit_keeps_the_first_groups_across_files_and_counts_the_rest(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [GROUP] * 3)
    b = write_jsonl(tmp_path / "b.jsonl", [GROUP] * 4 + ["bad"])
    found = read_files([a, b], limit=5)
    assert [e.where for e in found.entries] == [
        "a.jsonl:1",
        "a.jsonl:2",
        "a.jsonl:3",
        "b.jsonl:1",
        "b.jsonl:2",
    ]
    assert found.unread == 3  # two groups and the bad line, not parsed
    assert found.bad == 0


def test_a_line_holding_a_list_of_groups_gives_each(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [[GROUP, GROUP]])
    assert [e.where for e in read_files([path]).entries] == ["a.jsonl:1[0]", "a.jsonl:1[1]"]


def test_gzip_and_unreadable_files(tmp_path):
    gz = tmp_path / "a.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(json.dumps(GROUP) + "\n")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00bad")
    found = read_files([gz, binary])
    assert len(found.entries) == 1
    assert found.bad == 1 and found.bad_examples[0].reason.startswith("unreadable")


def test_groups_prepared_as_read_give_the_same_page_and_keep_no_raw_group(tmp_path, tiny):
    rows = [chat_group(tiny, [f"answer {k}", "x" * k], [k / 3, -1.0]) for k in range(5)]
    paths = [
        write_jsonl(tmp_path / "a.jsonl", [*rows[:3], "{bad"]),
        write_jsonl(tmp_path / "b.jsonl", rows[3:]),
    ]
    budget = Budget(tokens=40)  # small enough that later sequences lose their token view
    prepared = read_files(paths, limit=4, prepare=lambda e: group_data(e, tiny, budget))
    assert all(e.group == {} and e.shown for e in prepared.entries)
    assert budget.tokens_omitted > 0
    plain = read_files(paths, limit=4)
    assert page_data(prepared, "t", tiny, "tiny", budget) == page_data(
        plain, "t", tiny, "tiny", Budget(tokens=40)
    )
    text, found = page_of_files(paths, "t", tiny, "tiny", limit=4)
    assert len(found.entries) == 4 and found.bad == 1 and found.unread == 1
    assert page_json(text)["groups"] == page_data(plain, "t", tiny, "tiny")["groups"]
