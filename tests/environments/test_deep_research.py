"""The `deep_research` environment: the reward rules on hand-made cases, the corpus and question
loaders, every tool error, token-exact episodes and their budgets, and runs against the fake
inference server (check_env, process, evaluate, a judge, a local collection)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from functools import partial
from pathlib import Path

import pytest

from atropos.environments.deep_research import (
    Corpus,
    DeepResearch,
    DeepResearchConfig,
    Document,
    LocalSearch,
    Question,
    Research,
    Toolbox,
    ToolLimits,
    demo_responder,
    load_corpus,
    load_hotpot,
    load_questions,
)
from atropos.environments.deep_research.demo import reply_for
from atropos.environments.deep_research.episode import Episode, tool_messages
from atropos.environments.deep_research.judging import votes
from atropos.environments.deep_research.outcome import outcome
from atropos.environments.deep_research.questions import shipped_corpus_path
from atropos.environments.deep_research.scoring import (
    check_citations,
    exact_match,
    normalize_answer,
    reward,
    token_f1,
)
from atropos.envs import cli, registry
from atropos.envs.judge import JudgeConfig
from atropos.testing import FakeInferenceServer

from .helpers import (
    check_against,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_with_runner,
)

make = partial(make_env, DeepResearch)
SHIPPED = Corpus(load_corpus(shipped_corpus_path()))
Q01 = next(q for q in load_questions("train") if q.id == "q01")  # bresk-halloway, gannets-wake


def call(name: str, think: str = "", **arguments: object) -> str:
    head = f"<think>{think}</think>\n" if think else ""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"{head}<tool_call>\n{body}\n</tool_call>"


GOOD = [  # a right episode of Q01: search, open both documents, answer citing them
    call("search", query="Bresk Halloway ship"),
    call("open", doc_id="bresk-halloway"),
    call("open", doc_id="gannets-wake"),
    call("answer", text="1198", citations=["bresk-halloway", "gannets-wake"]),
]


# ----- the rules on hand-made cases ---------------------------------------------------------------


def test_squad_normalisation_exact_match_and_f1():
    assert normalize_answer("  The Sea-Lark!  ") == "sealark"
    assert normalize_answer("An Elder  Ash.") == "elder ash"
    assert exact_match("the Elder Ash", ["Elder Ash"]) == 1.0
    assert exact_match("Elder Ash tree", ["Elder Ash"]) == 0.0
    assert exact_match("1198", ["1198", "eleven ninety-eight"]) == 1.0
    assert token_f1("Elder Ash tree", ["Elder Ash"]) == pytest.approx(0.8)
    assert token_f1("Ysolde", ["Ysolde Marr", "Marr"]) == pytest.approx(2 / 3)
    assert token_f1("Marr", ["Ysolde Marr", "Marr"]) == 1.0  # the best alias counts
    assert token_f1("the", ["Marr"]) == 0.0  # nothing left after normalising
    assert token_f1("Varrow", []) == 0.0


def test_citation_check():
    both = check_citations(["a", "b"], opened={"a", "b"}, supporting=["a", "b"])
    assert (both.precision, both.recall, both.score) == (1.0, 1.0, 1.0)
    one = check_citations(["a"], opened={"a", "b"}, supporting=["a", "b"])
    assert (one.precision, one.recall, one.score) == (1.0, 0.5, 0.5)
    unopened = check_citations(["a", "b"], opened={"a"}, supporting=["a", "b"])
    assert unopened.valid == ("a",) and unopened.score == 0.25  # half valid x half recalled
    assert unopened.precision == 1.0  # both cited ids support; b was just never read
    unknown = check_citations(["zz", "a", "a"], opened={"a"}, supporting=["a"])
    assert unknown.cited == ("zz", "a") and unknown.score == 0.5 and unknown.precision == 0.5
    off_topic = check_citations(["c"], opened={"c"}, supporting=["a"])
    assert (off_topic.precision, off_topic.recall, off_topic.score) == (0.0, 0.0, 0.0)
    none = check_citations([], opened={"a"}, supporting=["a"])
    assert (none.precision, none.recall, none.score) == (0.0, 0.0, 0.0)
    web = check_citations(["w1", "w2"], opened={"w1"}, supporting=[])  # nothing to compare with
    assert (web.precision, web.recall, web.score) == (0.5, None, 0.5)


def test_reward_weighting():
    assert reward(1.0, 1.0, 0.3) == 1.0
    assert reward(1.0, 0.0, 0.3) == 0.7  # right, nothing valid cited
    assert reward(0.5, 1.0, 0.3) == 0.5
    assert reward(0.0, 1.0, 0.3) == 0.0  # citations never pay for a wrong answer
    assert reward(1.0, 0.0, 0.0) == 1.0 and reward(1.0, 0.0, 1.0) == 0.0


def answered(text: str | None, citations=(), opened=(), question: Question = Q01) -> Episode:
    episode = Episode(question, [], turns=3)
    episode.research = Research(searches=1, opens=len(opened), opened=set(opened))
    episode.research.answer, episode.research.citations = text, tuple(citations)
    return episode


def test_outcomes_of_episodes():
    cite = ["bresk-halloway", "gannets-wake"]
    right = outcome(answered("1198", cite, cite), "f1", 0.3)
    assert (right.reward, right.em, right.f1, right.citation_recall) == (1.0, 1.0, 1.0, 1.0)
    assert outcome(answered("1198", cite, cite[:1]), "f1", 0.3).reward == pytest.approx(0.775)
    assert outcome(answered("It was 1198", cite, cite), "em", 0.3).reward == 0.0
    partial_f1 = outcome(answered("It was 1198", cite, cite), "f1", 0.3)
    assert partial_f1.reward == pytest.approx(2 * (1 / 3) / (1 / 3 + 1))  # F1 of 1 in 3 words
    silent = outcome(answered(None), "f1", 0.3)
    assert silent.reward == 0.0 and silent.answered == 0.0 and silent.citation_recall == 0.0
    judged = outcome(answered("in 1198", cite, cite), "judge", 0.3, verdict=2 / 3)
    assert judged.reward == pytest.approx(2 / 3) and judged.em == 0.0
    assert set(right.metrics()) >= {"em", "f1", "citation_precision", "searches", "opens", "turns"}


def test_judge_votes():
    assert votes(["\\boxed{yes}", "\\boxed{YES}", "\\boxed{no}"]) == (2 / 3, 0)
    assert votes(["yes", "\\boxed{maybe}"]) == (None, 2)


# ----- data -------------------------------------------------------------------------------------


def test_the_shipped_set():
    train, test = load_questions("train"), load_questions("test")
    assert len(SHIPPED) == 50 and (len(train), len(test)) == (24, 8)
    assert not {q.id for q in train} & {q.id for q in test}
    for q in (*train, *test):
        assert 1 <= len(q.supporting) <= 2 and q.answers
        assert all(SHIPPED.get(d) is not None for d in q.supporting)
        gold = " ".join(SHIPPED.docs[d].text for d in q.supporting)
        assert any(normalize_answer(a) in normalize_answer(gold) for a in q.answers), q.id
    assert sum(len(q.supporting) == 2 for q in (*train, *test)) >= 25  # mostly two hops
    with pytest.raises(ValueError, match="split"):
        load_questions("eval")


def test_search_snippets_and_paging():
    hits = SHIPPED.search("Who founded the Shipwrights' Guild of Emberlee?", k=3)
    assert hits[0].doc_id == "shipwrights-guild" and len(hits) == 3
    assert "founded in 1150 by Ysolde Marr" in hits[0].snippet
    assert SHIPPED.search("zzz qqq", k=3) == []
    short = SHIPPED.search("Marr keel", k=2, snippet_chars=30)
    assert all(len(h.snippet) <= 30 and h.snippet.endswith("…") for h in short)


def test_local_collections_load_from_jsonl_and_folders(tmp_path):
    rows = tmp_path / "docs.jsonl"
    rows.write_text(
        '{"id": "a", "title": "A", "text": "Alpha."}\n{"doc_id": 7, "contents": "Seven."}\n'
    )
    assert load_corpus(rows) == [Document("a", "A", "Alpha."), Document("7", "7", "Seven.")]
    folder = tmp_path / "notes"
    (folder / "sub").mkdir(parents=True)
    (folder / "one.md").write_text("# The First\nBody one.")
    (folder / "sub" / "two.txt").write_text("Body two.")
    assert load_corpus(folder) == [
        Document("one", "The First", "Body one."),
        Document("two", "two", "Body two."),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"title": "no id", "text": "y"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl row 2: a document needs an 'id'"):
        load_corpus(bad)
    with pytest.raises(FileNotFoundError, match="--env.corpus"):
        load_corpus(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="two documents have the id 'a'"):
        Corpus([Document("a", "A", "x"), Document("a", "B", "y")])


def test_local_question_files_split_and_name_bad_rows(tmp_path):
    one = tmp_path / "qs.jsonl"
    one.write_text(
        "".join(json.dumps({"question": f"Q{i}?", "answer": f"A{i}"}) + "\n" for i in range(10))
    )
    train, test = load_questions("train", str(one), 0.2), load_questions("test", str(one), 0.2)
    assert (len(train), len(test)) == (8, 2) and not {q.id for q in train} & {q.id for q in test}
    assert test == load_questions("test", str(one), 0.2)  # the same rows every run
    folder = tmp_path / "split"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"question": "Q?", "answers": ["A"], "supporting": ["d"]}')
    assert load_questions("train", str(folder)) == [
        Question(f"{folder / 'train.jsonl'} row 1", "Q?", ("A",), ("d",))
    ]
    with pytest.raises(FileNotFoundError, match="no test.jsonl"):
        load_questions("test", str(folder))
    (folder / "test.jsonl").write_text('{"question": "Q?", "answers": []}')
    with pytest.raises(ValueError, match="test.jsonl row 1: a question row needs a non-empty"):
        load_questions("test", str(folder))


HOTPOT = "hotpotqa/hotpot_qa"


def hotpot_rows(name: str, split: str | None) -> list[dict]:
    def row(i: int) -> dict:
        return {
            "id": f"{split}-{i}",
            "question": f"Which river flows through town {i}?",
            "answer": f"River {i}",
            "supporting_facts": {"title": [f"Town {i}", f"River {i}", f"Town {i}"]},
            "context": {
                "title": [f"Town {i}", f"River {i}", "Shared Page"],
                "sentences": [[f"Town {i} lies on River {i}.", " It is old."], ["A river."], ["x"]],
            },
        }

    return [row(i) for i in range(3)]


def test_the_hub_loader_builds_corpus_and_questions(monkeypatch):
    calls = fake_hub(monkeypatch, hotpot_rows, only=HOTPOT)
    docs, questions = load_hotpot(HOTPOT, "distractor", "test", limit=2)
    assert calls == [(HOTPOT, "distractor", "validation")]
    assert [d.id for d in docs] == ["town-0", "river-0", "shared-page", "town-1", "river-1"]
    assert docs[0] == Document("town-0", "Town 0", "Town 0 lies on River 0.  It is old.")
    assert questions[0] == Question(
        "validation-0", "Which river flows through town 0?", ("River 0",), ("town-0", "river-0")
    )
    env = make(dataset_name=HOTPOT, hub_limit=0)
    docs, train, test = env.load()
    assert len(train) == len(test) == 3 and len(docs) == 7  # "Shared Page" once
    with pytest.raises(ValueError, match="drop --env.corpus"):
        DeepResearchConfig(dataset_name=HOTPOT, corpus="docs.jsonl")


# ----- the tools ----------------------------------------------------------------------------------


def respond(reply: str, state: Research | None = None, **limits: int) -> list[dict]:
    box = Toolbox(LocalSearch(SHIPPED), ToolLimits(**limits))
    state = state if state is not None else Research()
    return [json.loads(r) for r in asyncio.run(box.respond(reply, state))]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("I think it is 1198.", "no tool call found"),
        ("<tool_call>{not json}</tool_call>", "could not be read"),
        ('<tool_call>{"name": "search", "arguments": {"query": ', "could not be read"),
        (call("serch", query="x"), "unknown tool 'serch' (did you mean 'search'?)"),
        (call("browse", url="x"), "unknown tool 'browse'; the tools are search, open and answer"),
        (call("search"), 'search needs a "query" string'),
        (call("search", query="  "), 'search needs a "query" string'),
        (call("open"), 'open needs a "doc_id"'),
        (call("open", doc_id="gannets-wak"), "unknown doc_id 'gannets-wak' (did you mean 'ga"),
        (call("open", doc_id="nothing-like-it-at-all"), "open ids from search results"),
        (call("open", doc_id="heron", page=0), '"page" must be a whole number from 1'),
        (call("open", doc_id="heron", page=2), "'heron' has 1 page(s); there is no page 2"),
        (call("answer", citations=[]), 'answer needs a "text" string'),
        (call("answer", text="x", citations=[1, 2]), '"citations" must be a list of doc_id'),
    ],
)
def test_every_bad_call_becomes_a_tool_error(reply, message):
    state = Research()
    [result] = respond(reply, state)
    assert message in result["error"]
    assert state.errors == 1 and state.answer is None and not state.opened


def test_search_open_pages_and_answer():
    state = Research()
    [found] = respond(call("search", query="Who led the 1302 evacuation?"), state, top_k=2)
    assert [r["doc_id"] for r in found["results"]][0] == "eruption-of-1302"
    assert len(found["results"]) == 2
    assert set(found["results"][0]) == {"doc_id", "title", "snippet"}
    [nothing] = respond(call("search", query="qqq"), state)
    assert nothing["results"] == [] and "other words" in nothing["note"]
    first, second = respond(
        call("open", doc_id="heron") + call("open", doc_id="heron", page="2"), state, page_chars=100
    )
    assert (first["page"], first["pages"], len(first["text"])) == (1, 3, 100)
    assert second["page"] == 2 and SHIPPED.docs["heron"].text[100:200] == second["text"]
    assert (state.searches, state.opens, state.opened, state.errors) == (2, 2, {"heron"}, 0)
    results = respond(
        call("answer", text="x", citations="heron") + call("search", query="y"), state
    )
    assert results == [{"answer": "recorded"}]  # the answer ends the episode: nothing after it
    assert state.answer == "x" and state.citations == ("heron",) and state.searches == 2


def test_too_many_calls_and_long_results_are_cut():
    many = "".join(call("search", query="Emberlee") for _ in range(5))
    state = Research()
    results = respond(many, state, max_calls_per_turn=3)
    assert len(results) == 4 and "at most 3 calls per reply" in results[3]["error"]
    assert state.searches == 3 and state.errors == 1
    box = Toolbox(LocalSearch(SHIPPED), ToolLimits(page_chars=2000, max_result_chars=150))
    [cut] = asyncio.run(box.respond(call("open", doc_id="petra-vanlo"), Research()))
    assert len(cut) <= 150 and cut.endswith("…")


def test_tool_turns_as_tool_or_user_messages():
    assert tool_messages(["a", "b"], "tool") == [
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
    ]
    [user] = tool_messages(["a", "b"], "user")
    assert user == {
        "role": "user",
        "content": "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>",
    }


# ----- episodes against the fake server -----------------------------------------------------------


class Scripted:
    """Rollout `i` plays `scripts[i]`, reply by reply. The first request of each rollout takes
    the next script; later ones find their rollout by the `rollout i` its first reply wrote.
    Past the end of its script a rollout says `...` (a reply with no call)."""

    def __init__(self, *scripts: list[str]) -> None:
        self.scripts = [[self.mark(s[0], i), *s[1:]] for i, s in enumerate(scripts)]
        self.first = itertools.count()

    @staticmethod
    def mark(reply: str, i: int) -> str:
        return f"<think>rollout {i}</think>\n{reply}"

    def __call__(self, prompt: str) -> str:
        found = re.search(r"rollout (\d+)", prompt)
        i = int(found.group(1)) if found else next(self.first)
        turn = prompt.count("<|im_start|>assistant") - 1  # the last one opens this reply
        script = self.scripts[i]
        return script[turn] if turn < len(script) else "..."


def play(
    script: list[str], question: Question = Q01, **env: object
) -> tuple[DeepResearch, Episode]:
    with FakeInferenceServer(responder=Scripted(script)) as fake:
        environment = make(fake.base_url, group_size=1, **env)

        async def main() -> Episode:
            await environment.setup()
            try:
                return await environment.research(question)
            finally:
                await environment.aclose()

        return environment, asyncio.run(main())


def runs(node) -> tuple[list[list[int]], list[list[int]]]:
    """(trained runs, masked runs) of a sequence's tokens, in order."""
    trained, masked = [], []
    for is_masked, group in itertools.groupby(
        zip(node.tokens, node.masked_tokens, strict=True), key=lambda p: p[1] == -100
    ):
        (masked if is_masked else trained).append([t for t, _ in group])
    return trained, masked


def test_a_good_episode_is_token_exact_with_tool_results_masked():
    environment, episode = play(GOOD)
    assert episode.stopped == "answered" and episode.turns == 4
    assert outcome(episode, "f1", 0.3).reward == 1.0
    node, tok = episode.node, environment.tokenizer
    assert len(node.tokens) == len(node.masked_tokens) == len(node.logprobs)
    trained, masked = runs(node)
    replies = [Scripted.mark(GOOD[0], 0), *GOOD[1:]]
    # each trained run is exactly what the server generated for that reply (its ids + eos)
    assert trained == [
        tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in replies
    ]
    for token, mask, logprob in zip(node.tokens, node.masked_tokens, node.logprobs, strict=True):
        assert (logprob == 1.0) if mask == -100 else (mask == token and logprob < 0)
    masked_text = "".join(tok.decode(run) for run in masked)
    assert '"doc_id": "gannets-wake", "title": "Gannet\'s Wake", "page": 1' in masked_text
    assert masked_text.count("<|im_start|>tool") == 3  # the three tool results, all masked
    roles = [m["role"] for m in node.messages]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
    assert tok.decode(node.tokens) == tok.apply_chat_template(node.messages, tokenize=False)[:-1]


def test_bad_behaviour_gets_tool_errors_and_the_episode_goes_on():
    script = [
        "Let me think about it.",
        '<tool_call>{"name": "search", "arguments": {"query": "Halloway"</tool_call>',
        call("open", doc_id="bresk"),
        call("look", doc_id="x"),
        *GOOD,
    ]
    _, episode = play(script, max_turns=10)
    assert episode.stopped == "answered" and episode.turns == 8
    assert episode.research.errors == 4
    tool_turns = [m["content"] for m in episode.messages if m["role"] == "tool"]
    errors = [json.loads(content)["error"] for content in tool_turns[:4]]
    assert errors[0].startswith("no tool call found: call search, open or answer")
    assert errors[1].startswith("1 <tool_call> block(s) could not be read")
    assert errors[2].startswith("unknown doc_id 'bresk' (did you mean 'bresk-halloway'?)")
    assert errors[3] == "unknown tool 'look'; the tools are search, open and answer"


def test_no_answer_within_max_turns_scores_zero():
    _, episode = play([call("search", query="ships")] * 5, max_turns=3)
    assert (episode.stopped, episode.turns, episode.research.searches) == ("max_turns", 3, 3)
    assert outcome(episode, "f1", 0.3).reward == 0.0
    assert episode.limit == "turns"  # truncated/turns
    _, capped = play([call("search", query="ships")] * 5, max_tool_calls=2)
    assert (capped.stopped, capped.limit, capped.calls) == ("max_tool_calls", "tool_calls", 2)


def test_the_episode_token_budget_and_the_context_limit_end_it():
    _, episode = play(GOOD, max_episode_tokens=120)
    assert episode.stopped == "token_budget" and episode.generated >= 120
    assert episode.research.answer is None
    _, full = play(GOOD)
    _, short = play(GOOD, max_token_length=len(full.node.tokens) - 40)
    assert short.stopped == "context" and short.research.answer is None
    assert len(short.node.tokens) <= len(full.node.tokens) - 40


def test_the_user_role_and_native_tools():
    environment, episode = play(GOOD, tool_role="user", native_tools=True)
    assert episode.stopped == "answered"
    roles = [m["role"] for m in episode.node.messages]
    assert roles == ["system", "user"] + ["assistant", "user"] * 3 + ["assistant"]
    assert episode.node.messages[3]["content"].startswith("<tool_response>\n{")
    assert "<tools>" not in episode.node.messages[0]["content"]
    text = environment.tokenizer.decode(episode.node.tokens)
    assert "# Tools" in text and '"name": "search"' in text  # the template listed them


def collect(responder, question: Question = Q01, **env: object):
    with FakeInferenceServer(responder=responder) as fake:
        environment = make(fake.base_url, **env)

        async def main():
            await environment.setup()
            try:
                group, backlog = await environment.collect_trajectories(question)
                await environment.wandb_log()
                return group, backlog
            finally:
                await environment.aclose()

        group, backlog = asyncio.run(main())
    assert backlog == []
    return group, environment


def test_a_group_of_mixed_episodes_and_its_metrics():
    wrong = [*GOOD[:3], call("answer", text="1204", citations=["bresk-halloway"])]
    lazy = [call("answer", text="1198", citations=["gannets-wake"])]  # never opened it
    group, environment = collect(Scripted(GOOD, wrong, lazy, ["no idea"]), group_size=4)
    assert sorted(group["scores"]) == [0.0, 0.0, 0.7, 1.0]
    assert group["token_source"] == "server"
    assert [len(x) for x in group["inference_logprobs"]] == [len(t) for t in group["tokens"]]
    metrics = environment.metrics
    assert metrics["train/answered"] == 0.75 and metrics["train/em"] == 0.5
    assert metrics["train/reward"] == pytest.approx(1.7 / 4)
    assert metrics["train/searches"] == 0.5 and metrics["train/opens"] == 1.0
    assert metrics["train/citation_recall"] == pytest.approx((1.0 + 0.5 + 0 + 0) / 4)
    # "no idea" never answers: cut at max_turns, truncated/turns and scored as it stands
    assert sorted(o.get("outcome", "") for o in group["overrides"]) == [
        "",
        "",
        "",
        "truncated/turns",
    ]


def test_a_question_that_does_not_fit_drops_the_group():
    group, _ = collect(Scripted(GOOD, GOOD), group_size=2, max_token_length=300)
    assert group is None  # counted as dropped/prompt_too_long by the runners


def judge_server(verdicts: dict[str, str]) -> FakeInferenceServer:
    def answer(prompt: str) -> str:
        found = re.search(r"Proposed answer: (.*)", prompt)
        return verdicts.get(found.group(1).strip(), "hmm") if found else "?"

    return FakeInferenceServer(responder=answer)


def test_the_judge_scores_answers_and_no_vote_drops_the_group():
    cite = ["bresk-halloway", "gannets-wake"]
    worded = [*GOOD[:3], call("answer", text="in 1198", citations=cite)]
    with judge_server({"1198": "\\boxed{yes}", "in 1198": "\\boxed{no}"}) as judge:
        config = JudgeConfig(base_url=judge.base_url, votes=2)
        group, env = collect(
            Scripted(GOOD, worded), group_size=2, answer_metric="judge", judge=config
        )
        assert judge.requests
    assert sorted(group["scores"]) == [0.0, 1.0]
    assert env.metrics["train/em"] == 0.5 and env.metrics["train/judge_unparsed"] == 0.0
    with judge_server({"1198": "\\boxed{yes}"}) as judge:  # "in 1198" gets no parsable vote
        config = JudgeConfig(base_url=judge.base_url)
        group, env = collect(
            Scripted(GOOD, worded), group_size=2, answer_metric="judge", judge=config
        )
    assert group is None


# ----- the environment end to end -----------------------------------------------------------------


def test_check_env_passes_with_the_demo_responder():
    report = check_against(make, demo_responder, items=3, group_size=3)
    assert report.groups == 3 and report.token_sources == {"server"}


def test_process_writes_groups_and_a_page(tmp_path):
    out = tmp_path / "deep_research.jsonl"
    with FakeInferenceServer(responder=demo_responder) as fake:
        env = make(fake.base_url, group_size=3, total_steps=2, data_path_to_save_groups=str(out))
        run = process_with_runner(env)
    assert len(run.groups) == 2 and run.metrics["groups"] == 2
    for group in run.groups:
        assert len(group["tokens"]) == 3 and group["messages"][0][0]["role"] == "system"
    assert "tool_call" in run.page and "doc_id" in run.page
    assert {"train/f1", "train/citation_precision", "train/turns"} <= set(run.metrics["env"])


def test_a_local_collection_through_the_command_line(tmp_path):
    corpus, questions = tmp_path / "corpus.jsonl", tmp_path / "questions"
    corpus.write_text(
        '{"id": "ada", "title": "Ada", "text": "Ada Lovelace wrote the first program."}\n'
        '{"id": "babbage", "title": "Babbage", "text": "Charles Babbage designed an engine."}\n'
    )
    questions.mkdir()
    row = {"question": "Who wrote the first program?", "answers": ["Ada Lovelace"]}
    for split in ("train", "test"):
        (questions / f"{split}.jsonl").write_text(json.dumps({**row, "supporting": ["ada"]}))
    plan = [
        call("search", query="first program"),
        call("open", doc_id="ada"),
        call("answer", text="Ada Lovelace", citations=["ada"]),
    ]
    out = tmp_path / "out.jsonl"
    with FakeInferenceServer(responder=Scripted(plan, ["..."])) as fake:
        argv = [
            "process",
            f"--openai.base_url={fake.base_url}",
            "--env.total_steps=1",
            "--env.group_size=2",
            f"--env.data_path_to_save_groups={out}",
            f"--env.corpus={corpus}",
            f"--env.questions={questions}",
        ]
        assert cli.main(DeepResearch, argv) == 0
    [group] = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(group["scores"]) == [0.0, 1.0]
    (questions / "train.jsonl").write_text(json.dumps({**row, "supporting": ["turing"]}))
    env = make(corpus=str(corpus), questions=str(questions))
    with pytest.raises(ValueError, match="'turing' of question"):
        asyncio.run(env.setup())


def test_evaluate_reports_per_item_metrics(tmp_path):
    def always_right(prompt: str) -> str | None:
        for question in load_questions("test"):
            if question.question in prompt:
                return reply_for(question, prompt)
        return None

    run = evaluate_against(make, always_right, tmp_path, setup=True)
    assert run.metrics["eval/reward"] == 1.0 and run.metrics["eval/em"] == 1.0
    assert run.metrics["eval/citation_recall"] == 1.0 and run.metrics["eval/answered"] == 1.0
    assert run.metrics["eval/searches"] == 1.0 and run.metrics["eval/opens"] > 1.0
    assert len(run.samples) == 8 and all(s["stopped"] == "answered" for s in run.samples)
    assert run.doc["results"]["all"] == run.metrics and run.temperature == 0.0


def test_demo_responder_mixes_good_and_flawed_steps():
    prompt = f"<|im_start|>user\n{Q01.question}<|im_end|>"
    first = reply_for(Q01, prompt)
    assert '"name": "search"' in first and "could not" not in first
    assert "</tool_call>" in reply_for(Q01, prompt, flawed=True)
    opened = prompt + '"results": []}\n{"doc_id": "bresk-halloway", "title": "Bresk", "page": 1'
    assert '"doc_id": "gannets-wake"' in reply_for(Q01, opened)
    assert '"doc_id": "gannets-wakex"' in reply_for(Q01, opened, flawed=True)
    assert demo_responder("What is 2 + 2?") is None


def test_an_openai_server_is_refused():
    env = make()
    env.server_configs[0].server_type = "openai"
    with pytest.raises(ValueError, match="token server"):
        asyncio.run(env.setup())


def test_defaults_and_registration():
    config, [server] = env_defaults(DeepResearch)
    assert isinstance(config, DeepResearchConfig) and config.backend == "local"
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert (config.max_turns, config.citation_weight, config.answer_metric) == (8, 0.3, "f1")
    assert config.group_size == 8 and config.max_token_length == 8192
    target = "atropos.environments.deep_research:DeepResearch"
    assert registry.get(target) is DeepResearch
    # the name resolves once the package is installed with this entry point (`pip install -e .`)
    if "deep_research" in registry.specs():
        assert registry.get("deep_research") is DeepResearch
    assert Path(shipped_corpus_path()).is_file()


def test_process_against_the_cpu_server(tmp_path):
    """`atropos local serve tiny`: its replies are noise (it only learned arithmetic), so every
    episode ends without an answer; what counts is that groups of the server's own token ids
    come out."""
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    out = tmp_path / "local.jsonl"
    with local_tiny_server() as url:
        argv = ["process", f"--openai.base_url={url}", "--env.total_steps=1"]
        argv += ["--env.group_size=2", "--env.max_turns=2", "--env.max_reply_tokens=4"]
        argv += ["--env.max_token_length=2048", f"--env.data_path_to_save_groups={out}"]
        assert cli.main(DeepResearch, argv) == 0
    [group] = [json.loads(line) for line in out.read_text().splitlines()]
    assert group["token_source"] == "server" and group["scores"] == [0.0, 0.0]
    assert [len(lp) for lp in group["inference_logprobs"]] == [len(t) for t in group["tokens"]]
    assert all(m[3]["role"] == "tool" for m in group["messages"])  # its first reply got a result
