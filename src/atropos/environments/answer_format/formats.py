"""The answer formats of `answer_format`: how each is asked for, written and checked.

A `Format` has an instruction (appended to the question), `write(answer, key)` (a compliant
answer part: the demo responder's and the tests') and `read(text, key)`: the answer a compliant
answer part holds, or None when it breaks the format. `key` is the item's id, which the CSV,
table and XML formats must repeat. Whole formats (`json`, `yaml`, `code_block`, `bullet_list`,
`xml_attributes`, `csv_row`, `markdown_table`) must be the whole answer part, nothing around
them; marker formats (`answer_tags`, `boxed`, `double_brackets`, `final_answer_line`,
`markdown_section`) must appear exactly once, and may follow other text.

>>> json_format = FORMATS["json"]
>>> json_format.read('{"answer": 42}', "q1"), json_format.read('{"answer": 42, "x": 1}', "q1")
('42', None)
>>> all(f.read(f.write("Paris", "q7"), "q7") == "Paris" for f in FORMATS.values())
True
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from xml.etree import ElementTree

import yaml

from atropos.environments.common.completions import boxed_contents
from atropos.rewards.text import tagged

__all__ = ["FORMATS", "Format"]

Reader = Callable[[str, str], str | None]
Writer = Callable[[str, str], str]


@dataclass(frozen=True)
class Format:
    """One answer format: its name, the instruction asking for it, a writer and a reader."""

    name: str
    instruction: str  # `{key}` stands for the item's id
    write: Writer
    read: Reader

    def ask(self, key: str) -> str:
        """The instruction for the item `key`."""
        return self.instruction.replace("{key}", key)


def _one_line(value: str) -> str | None:
    """`value` stripped, or None when it is empty or spans several lines."""
    value = value.strip()
    return value if value and "\n" not in value else None


def _only(found: list[str], text: str, *markers: str) -> str | None:
    """The one answer of a marker format: one match, each of `markers` once in `text`."""
    once = all(text.count(marker) == 1 for marker in markers)
    return _one_line(found[0]) if len(found) == 1 and once else None


def _read_tags(text: str, key: str) -> str | None:
    return _only(tagged(text, "answer"), text, "<answer>", "</answer>")


def _read_boxed(text: str, key: str) -> str | None:
    return _only(boxed_contents(text), text, "\\boxed")


def _read_brackets(text: str, key: str) -> str | None:
    return _only(re.findall(r"\[\[(.*?)\]\]", text), text, "[[", "]]")


def _read_final_line(text: str, key: str) -> str | None:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [line for line in lines if line.lower().startswith("final answer")]
    if len(marked) != 1 or not lines[-1].startswith("Final answer: "):
        return None
    return _one_line(lines[-1].removeprefix("Final answer: "))


def _read_section(text: str, key: str) -> str | None:
    parts = re.split(r"^## Answer[ \t]*$", text, flags=re.MULTILINE)
    return _one_line(parts[1]) if len(parts) == 2 else None


def _scalar(value: object) -> str | None:
    """A JSON or YAML answer value as text: a string or a number (never a bool or null)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    return _one_line(value if isinstance(value, str) else json.dumps(value))


def _read_json(text: str, key: str) -> str | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return (
        _scalar(value["answer"]) if isinstance(value, dict) and list(value) == ["answer"] else None
    )


def _read_yaml(text: str, key: str) -> str | None:
    match = re.fullmatch(r"answer:[ \t]+(\S.*)", text)
    if match is None:
        return None
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(value, dict) or isinstance(value["answer"], (dict, list, type(None))):
        return None
    # a string as YAML reads it (quotes gone); else the text as written (`yes` is YAML's true)
    answer = value["answer"]
    return _one_line(answer) if isinstance(answer, str) else _one_line(match.group(1))


def _read_code_block(text: str, key: str) -> str | None:
    match = re.fullmatch(r"```[\w+-]*\n(.*?)\n?```", text, flags=re.DOTALL)
    return _one_line(match.group(1)) if match and "```" not in match.group(1) else None


_BULLETS = ("Reasoning", "Answer", "Confidence")


def _read_bullets(text: str, key: str) -> str | None:
    lines = text.splitlines()
    if len(lines) != len(_BULLETS):
        return None
    found = [re.fullmatch(rf"- {b}: (\S.*)", line) for line, b in zip(lines, _BULLETS, strict=True)]
    if not all(found):
        return None
    answer, confidence = (m.group(1).strip() for m in found[1:] if m)
    return answer if confidence in ("high", "medium", "low") else None


def _read_xml(text: str, key: str) -> str | None:
    if "<!" in text or "<?" in text:  # no declarations, no entities
        return None
    try:
        element = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return None
    if element.tag != "answer" or len(element) or (element.text or "").strip():
        return None
    attributes = element.attrib
    if sorted(attributes) != ["id", "value"] or attributes["id"] != key:
        return None
    return _one_line(attributes["value"])


def _read_csv(text: str, key: str) -> str | None:
    try:
        rows = list(csv.reader(io.StringIO(text), strict=True))
    except csv.Error:
        return None
    if len(rows) != 2 or rows[0] != ["id", "answer"] or len(rows[1]) != 2 or rows[1][0] != key:
        return None
    return _one_line(rows[1][1])


def _cells(line: str) -> list[str] | None:
    line = line.strip()
    if len(line) < 2 or line[0] != "|" or line[-1] != "|":
        return None
    return [cell.strip() for cell in line[1:-1].split("|")]


def _read_table(text: str, key: str) -> str | None:
    rows = [_cells(line) for line in text.splitlines()]
    if len(rows) != 3 or rows[0] != ["id", "answer"] or rows[2] is None or len(rows[2]) != 2:
        return None
    if not rows[1] or not all(re.fullmatch(r":?-{3,}:?", cell) for cell in rows[1]):
        return None
    return _one_line(rows[2][1]) if rows[2][0] == key else None


def _write_csv(answer: str, key: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([["id", "answer"], [key, answer]])
    return out.getvalue().strip()


def _write_xml(answer: str, key: str) -> str:
    return ElementTree.tostring(ElementTree.Element("answer", id=key, value=answer), "unicode")


_WHOLE = " Write nothing before or after it."
FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        Format(
            "answer_tags",
            "Give your final answer inside <answer></answer> tags, once.",
            lambda a, k: f"<answer>{a}</answer>",
            _read_tags,
        ),
        Format(
            "boxed",
            "Give your final answer inside \\boxed{}, once.",
            lambda a, k: f"\\boxed{{{a}}}",
            _read_boxed,
        ),
        Format(
            "double_brackets",
            "Give your final answer inside double square brackets, like [[answer]], once.",
            lambda a, k: f"[[{a}]]",
            _read_brackets,
        ),
        Format(
            "final_answer_line",
            "End your reply with one line of the form `Final answer: <answer>`.",
            lambda a, k: f"Final answer: {a}",
            _read_final_line,
        ),
        Format(
            "markdown_section",
            "End your reply with a markdown heading `## Answer` followed by one line holding"
            " only the answer.",
            lambda a, k: f"## Answer\n{a}",
            _read_section,
        ),
        Format(
            "json",
            'Reply with a JSON object with exactly one key, "answer", e.g. {"answer": "..."}.'
            + _WHOLE,
            lambda a, k: json.dumps({"answer": a}),
            _read_json,
        ),
        Format(
            "yaml",
            "Reply with one line of YAML, `answer: <answer>`, not in a code block." + _WHOLE,
            lambda a, k: f"answer: {json.dumps(a)}",
            _read_yaml,
        ),
        Format(
            "code_block",
            "Reply with a markdown code block (three backticks) holding only the answer." + _WHOLE,
            lambda a, k: f"```\n{a}\n```",
            _read_code_block,
        ),
        Format(
            "bullet_list",
            "Reply with a markdown list of exactly three items, in this order:"
            " `- Reasoning: <one sentence>`, `- Answer: <answer>`,"
            " `- Confidence: <high, medium or low>`." + _WHOLE,
            lambda a, k: (
                f"- Reasoning: it follows from the question.\n- Answer: {a}\n- Confidence: high"
            ),
            _read_bullets,
        ),
        Format(
            "xml_attributes",
            'Reply with one empty XML element, <answer id="{key}" value="<answer>"/>, with'
            " exactly these two attributes." + _WHOLE,
            _write_xml,
            _read_xml,
        ),
        Format(
            "csv_row",
            "Reply with two lines of CSV: the header `id,answer`, then the row `{key},<answer>`"
            " (quote the answer if it holds a comma)." + _WHOLE,
            _write_csv,
            _read_csv,
        ),
        Format(
            "markdown_table",
            "Reply with a markdown table of two columns, `id` and `answer`, and one row:"
            " `{key}` and the answer." + _WHOLE,
            lambda a, k: f"| id | answer |\n|---|---|\n| {k} | {a} |",
            _read_table,
        ),
    ]
}
