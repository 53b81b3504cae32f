"""Character sheets: the shipped ones load, bad ones fail naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from atropos.environments.common.data_loading import data_path
from atropos.environments.npc_arena import CharacterError, load_character, load_characters
from atropos.environments.npc_arena.characters import render_sheet

GOOD = """\
name: Test Knight
system_prompt: You are a test knight.
personality: Brave.
speech_style: Formal.
backstory: Born in a test.
knowledge: [Tests pass.]
forbidden: [Skipping tests.]
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_the_shipped_sheets_load_and_vary():
    sheets = load_characters(data_path("npc_arena", "characters"))
    assert len(sheets) >= 8
    assert {"kaelen", "lyra", "reginald", "oracle7", "vex", "redeye"} <= set(sheets)
    assert len({s.speech_style for s in sheets.values()}) == len(sheets)
    assert all(s.knowledge and s.forbidden for s in sheets.values())
    text = render_sheet(sheets["kaelen"])
    assert "Speech style:" in text and "Must never:" in text and "Kaelen Ironhand" in text


def test_a_good_sheet_loads(tmp_path):
    sheet = load_character(write(tmp_path, "knight.yaml", GOOD))
    assert sheet.name == "Test Knight" and sheet.knowledge == ["Tests pass."]


def test_a_missing_field_is_named_with_the_file(tmp_path):
    path = write(tmp_path, "knight.yaml", GOOD.replace("speech_style: Formal.\n", ""))
    with pytest.raises(CharacterError, match=r"knight\.yaml: field 'speech_style' is missing"):
        load_character(path)


def test_a_wrong_type_is_named_with_what_was_given(tmp_path):
    path = write(tmp_path, "knight.yaml", GOOD.replace("knowledge: [Tests pass.]", "knowledge: 5"))
    with pytest.raises(CharacterError) as err:
        load_character(path)
    assert "knight.yaml: field 'knowledge'" in str(err.value) and "got int 5" in str(err.value)
    path.write_text(GOOD.replace("name: Test Knight", "name: 42"))
    with pytest.raises(CharacterError, match=r"field 'name'.*got int 42"):
        load_character(path)


def test_an_unknown_key_suggests_the_field_meant(tmp_path):
    path = write(tmp_path, "knight.yaml", GOOD.replace("personality:", "personalty:"))
    with pytest.raises(CharacterError) as err:
        load_character(path)
    text = str(err.value)
    assert "unknown field 'personalty' (did you mean 'personality'?)" in text
    assert "field 'personality' is missing" in text  # every problem at once


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- list\n", "a character sheet is a YAML mapping, got list"),
        ("name: [unclosed\n", "not valid YAML"),
        ("", "a character sheet is a YAML mapping, got NoneType"),
        (GOOD.replace("name: Test Knight", "name: '  '"), "field 'name'"),
    ],
)
def test_malformed_files_are_refused(tmp_path, text, message):
    with pytest.raises(CharacterError, match=message):
        load_character(write(tmp_path, "odd.yaml", text))


def test_a_directory_reports_every_bad_sheet_and_keys_by_file_stem(tmp_path):
    write(tmp_path, "good.yaml", GOOD)
    assert list(load_characters(tmp_path)) == ["good"]
    write(tmp_path, "bad1.yaml", GOOD.replace("backstory:", "backstroy:"))
    write(tmp_path, "bad2.yml", "just text")
    write(tmp_path, "notes.txt", "ignored")
    with pytest.raises(CharacterError) as err:
        load_characters(tmp_path)
    assert "bad1.yaml" in str(err.value) and "bad2.yml" in str(err.value)
    with pytest.raises(CharacterError, match="no such directory of character sheets"):
        load_characters(tmp_path / "notes.txt")  # not a directory
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CharacterError, match=r"no character sheets \(\*\.yaml\) found"):
        load_characters(empty)
