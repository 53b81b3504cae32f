"""An offline stand-in policy for `deep_research`: `demo_responder`.

`python -m atropos.testing.fake_server --port 9001 --responder
atropos.environments.deep_research:demo_responder`, then `atropos env process deep_research`.
For a shipped question it researches as a good policy would (search the question, open each
supporting document, answer with the gold answer citing them), but one call in three is flawed
(a block that is not JSON, a misspelt doc id, or a wrong answer without citations), so groups
come out mixed. It reads where the episode stands from the prompt alone.
"""

from __future__ import annotations

import functools
import itertools
import json
import re

from atropos.environments.common.data_loading import in_prompt
from atropos.environments.deep_research.questions import Question, load_questions

__all__ = ["demo_responder", "reply_for"]

_calls = itertools.count()
_OPENED = re.compile(r'\{"doc_id": "([^"]+)", "title": "(?:[^"\\]|\\.)*", "page"')


@functools.cache
def _questions() -> dict[str, Question]:
    return {q.question: q for split in ("train", "test") for q in load_questions(split)}


def _call(name: str, **arguments: object) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<think>\nNext: {name}.\n</think>\n<tool_call>\n{body}\n</tool_call>"


def reply_for(question: Question, prompt_text: str, flawed: bool = False) -> str:
    """The next reply of an episode of `question` whose prompt so far is `prompt_text`: search,
    then open each unopened supporting document, then answer; `flawed` spoils that step."""
    opened = set(_OPENED.findall(prompt_text))
    unread = [d for d in question.supporting if d not in opened]
    if '"results"' not in prompt_text:
        if flawed:
            return '<tool_call>{"name": "search", "arguments": {"query": </tool_call>'
        return _call("search", query=question.question)
    if unread:
        return _call("open", doc_id=unread[0] + ("x" if flawed else ""))
    if flawed:
        return _call("answer", text="I could not find it.", citations=[])
    return _call("answer", text=question.answers[0], citations=list(question.supporting))


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder: the next step for a shipped question (flawed on one
    call in three); None (random text) for any other prompt."""
    question = in_prompt(_questions(), prompt_text)
    if question is None:
        return None
    return reply_for(question, prompt_text, flawed=next(_calls) % 3 == 2)
