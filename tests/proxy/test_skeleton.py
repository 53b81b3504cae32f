"""Template skeletons (`atropos.proxy.skeleton`): a skeleton is kept only where one traced
render proves the template used the new messages' strings as text, tests it records, or strips;
where it fills a text, that text is the template's own render, for any strings; any other use
of a string refuses the shape."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from atropos.inference.tokenizer import load_tokenizer
from atropos.proxy.incremental import _compiled, _direct
from atropos.proxy.skeleton import Skeleton, shape_of, traced_template

HEAD = [{"role": "system", "content": "Be brief."}]
LOOP = "{%- for m in messages -%}"
END = "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
TEMPLATES = {
    "tiny": None,  # the tiny tokenizer's own (a macro, `is string`, `+`)
    "reasoning": LOOP + "{%- set c = m.content or '' -%}"
    "{%- if m.role == 'assistant' and '</think>' in c -%}"
    "{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + c | trim + '<|im_end|>\\n' -}}" + END,
    "tests": LOOP + "{%- if m.content.startswith('/') -%}[cmd]{%- endif -%}"
    "{%- if m.content == 'ok' or not m.content -%}[short]{%- endif -%}"
    "{%- set body -%}{{ m.role }}: {{ m.content | string }}{%- endset -%}{{ body ~ '\\n' }}" + END,
    "strips": LOOP + "<{{ m.role }}>{{ m.content.lstrip('# ') | trim }}|{{ m.content }}\n" + END,
}
#: Uses of a string no skeleton stands for: each refuses the shape.
REFUSED = [
    "{{ m.content.split(' ')[0] }}",
    "{{ m | tojson }}",
    "{{ m.content | length }}",
    "{{ m.content[0] }}",
    "{{ m.content | upper }}",
    "{{ m.content | replace('a', 'b') }}",
    "{{ '%s!' | format(m.content) }}",
    "{% set x = m.content ~ '' %}{% if x.startswith('It') %}Y{% endif %}{{ x }}",
    "{% set x %}{{ m.content }}{% endset %}{% if 'It' in x %}Y{% endif %}{{ x }}",
    "{% if (m.content + '!').endswith('.!') %}Y{% endif %}{{ m.content }}",
    "{{ [m.content] | join(',') | length }}",
    "{{ strftime_now('%Y') }}{{ m.content }}",
    "{{ m.content | e }}",
    "{{ m.content | wordcount }}",
    "{% if m.content > 'a' %}Y{% endif %}{{ m.content }}",
    "{{ m.content * 2 }}",
    "{{ m.content.title() }}",
]


def tokenizer(template: str | None) -> Any:
    tok = load_tokenizer("tiny")
    if template is None:
        return tok
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return tok


def renders(template: str | None) -> tuple[Any, Any]:
    tok = tokenizer(template)
    compiled = _compiled(tok)
    traced = traced_template(tok, compiled)
    assert traced is not None
    return _direct(tok, compiled), _direct(tok, traced)


def turn(answer: str, user: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": answer}, {"role": "user", "content": user}]


STRINGS = [
    "It is 5.", "", " ", "ok", "/help me", "<think>\nplan\n</think>\n\nIt is 5. ", "a</think>b",
    '"quoted" \\ back <&> \'x\'', "\ue000 0\"\\\n<&'\ue001", "# title\n", "  padded  ", "é ü 中文",
    "{{ not a template }}", "{% raw %}", "<|im_end|>",
]  # fmt: skip


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_filled_skeleton_is_the_templates_render_for_any_strings(name: str) -> None:
    direct, traced = renders(TEMPLATES[name])
    rng = random.Random(7)
    skeletons: list[Skeleton] = []
    filled = 0
    for _ in range(300):
        new = turn(rng.choice(STRINGS), rng.choice(STRINGS))
        expected = direct(HEAD + new, None, True)
        for skeleton in skeletons:
            text = skeleton.fill(new)
            if text is not None:
                assert text == expected, (name, new)
                filled += 1
        made = Skeleton.build(traced, HEAD, new, None, True, expected)
        if made is not None and len(skeletons) < 12:
            skeletons.append(made)
    assert skeletons and filled > 300  # branches were kept, and each filled many calls


def test_a_branch_is_kept_only_for_strings_that_test_alike() -> None:
    direct, traced = renders(TEMPLATES["reasoning"])
    plain = turn("It is 5.", "Thanks.")
    skeleton = Skeleton.build(traced, HEAD, plain, None, True, direct(HEAD + plain, None, True))
    assert skeleton is not None
    assert skeleton.fill(turn("Other.", "  More?  ")) == direct(
        HEAD + turn("Other.", "  More?  "), None, True
    )
    assert skeleton.fill(turn("<think>x</think> 5", "Thanks.")) is None  # the other branch
    assert skeleton.fill(turn("", "Thanks.")) is None  # `m.content or ''` answers otherwise
    reasoned = turn("<think>x</think> 5", "Thanks.")
    expected = direct(HEAD + reasoned, None, True)
    # its branch splits the string: refused, rendered every call
    assert Skeleton.build(traced, HEAD, reasoned, None, True, expected) is None


@pytest.mark.parametrize("use", REFUSED)
def test_a_use_no_skeleton_stands_for_refuses_the_shape(use: str) -> None:
    direct, traced = renders(LOOP + use + "\n" + END)
    new = turn("It is 5.", "Thanks, a lot.")
    expected = direct(HEAD + new, None, True)
    assert Skeleton.build(traced, HEAD, new, None, True, expected) is None


def test_the_tokenizers_compiled_template_is_left_as_it_was() -> None:
    tok = tokenizer(TEMPLATES["tests"])
    compiled = _compiled(tok)
    filters, tests = dict(compiled.environment.filters), dict(compiled.environment.tests)
    traced = traced_template(tok, compiled)
    assert traced is not None and traced_template(tok, compiled) is traced  # made once
    assert compiled.environment.filters == filters and compiled.environment.tests == tests
    new = turn("It is 5.", "ok")
    expected = _direct(tok, compiled)(HEAD + new, None, True)
    assert Skeleton.build(_direct(tok, traced), HEAD, new, None, True, expected)
    assert tok.apply_chat_template(HEAD + new, tokenize=False) == _direct(tok, compiled)(
        HEAD + new, None, False
    )


def test_the_shape_is_roles_keys_and_the_generation_prompt() -> None:
    a = shape_of(turn("x", "y"), True)
    assert a == shape_of(turn("other", "text"), True)
    assert a != shape_of(turn("x", "y"), False)
    assert a != shape_of([{"role": "assistant", "content": "x"}], True)
    tool = {"role": "tool", "tool_call_id": "c1", "content": "5"}
    assert shape_of([tool], True) == (True, ("tool", ("role", "tool_call_id", "content")))
    calls = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}
    assert shape_of([calls], True) is None  # tool calls: rendered every call
    assert shape_of([{"role": "user", "content": [{"type": "text", "text": "x"}]}], True) is None


def test_a_skeleton_can_leave_out_the_heads_text() -> None:
    """The window keeps the head's text once (`IncrementalRender._opening`); its skeletons
    start after it, and one whose hole would fall in that text is refused."""
    direct, traced = renders(None)
    new = turn("It is 5.", "Thanks.")
    expected = direct(HEAD + new, None, True)
    head = direct(HEAD, None, False)
    skeleton = Skeleton.build(traced, HEAD, new, None, True, expected, skip=len(head))
    assert skeleton is not None and skeleton.pieces[0] == expected[len(head) : expected.index("It")]
    other = turn("Other.", "More?")
    assert skeleton.fill(other) == direct(HEAD + other, None, True)[len(head) :]
    assert Skeleton.build(traced, HEAD, new, None, True, expected, skip=len(head) + 30) is None
