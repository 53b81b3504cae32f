"""The `visual_counting` environment: generated pictures, questions, scoring, the hub loader,
and runs against the fake inference server (groups carry their images)."""

from __future__ import annotations

import asyncio
import base64
import collections
import io
import itertools
import re
import sys

import pytest

PIL = pytest.importorskip("PIL", reason="needs Pillow (the vision extra)")
from PIL import Image  # noqa: E402

from atropos import wire  # noqa: E402
from atropos.environments import visual_counting  # noqa: E402
from atropos.environments.common.data_loading import HubUnavailable  # noqa: E402
from atropos.environments.common.vision import IMAGE_PLACEHOLDER  # noqa: E402
from atropos.environments.visual_counting import (  # noqa: E402
    EVAL_SEEDS,
    VisualCounting,
    VisualCountingConfig,
    demo_responder,
    generated_items,
    hub_items,
    image_base64,
    parse_answer,
    score_answer,
)
from atropos.environments.visual_counting.shapes import (  # noqa: E402
    BACKGROUND,
    CANVAS,
    CELL,
    COLOURS,
    KINDS,
    Scene,
    Shape,
    make_scene,
    make_task,
    render_png,
)
from atropos.envs import registry  # noqa: E402
from atropos.envs.simple import Rollout  # noqa: E402
from atropos.install import install_hint  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402

from .helpers import (  # noqa: E402
    check_against,
    decode_png,
    env_defaults,
    evaluate_against,
    fake_hub,
    image_group,
    make_env,
    process_with_runner,
)

# ----- pictures --------------------------------------------------------------------------------


def read_cells(image: Image.Image) -> list[tuple[int, str, str]]:
    """(cell, colour, kind) of every cell that holds a shape, read from the pixels alone: the
    colour by exact value, the kind by how much of its bounding box the shape fills."""
    names = {rgb: name for name, rgb in COLOURS.items()}
    pixels = image.load()
    per_row = CANVAS // CELL
    found = []
    for cell in range(per_row * per_row):
        x0, y0 = (cell % per_row) * CELL, (cell // per_row) * CELL
        points = [
            (x, y, pixels[x, y])
            for x in range(x0, x0 + CELL)
            for y in range(y0, y0 + CELL)
            if pixels[x, y] != BACKGROUND
        ]
        if not points:
            continue
        colours = {names[p] for _, _, p in points}  # a KeyError: an unlisted colour
        assert len(colours) == 1
        xs, ys = [x for x, _, _ in points], [y for _, y, _ in points]
        fill = len(points) / ((max(xs) - min(xs) + 1) * (max(ys) - min(ys) + 1))
        kind = "square" if fill > 0.95 else "circle" if fill > 0.7 else "triangle"
        assert fill > 0.4, fill
        found.append((cell, colours.pop(), kind))
    return found


def test_pictures_are_valid_pngs_of_only_the_listed_colours():
    for seed in range(5):
        image = decode_png(base64.b64encode(render_png(make_scene(seed))).decode())
        assert image.format == "PNG" and image.size == (CANVAS, CANVAS) and image.mode == "RGB"
        palette = {rgb for _, rgb in image.getcolors(CANVAS * CANVAS)}
        assert palette <= {BACKGROUND, *COLOURS.values()} and BACKGROUND in palette


@pytest.mark.parametrize("seed", [0, 1, 2, 17, 99, 1234, EVAL_SEEDS + 3])
def test_the_drawn_shapes_match_the_scene_and_the_answer(seed):
    task = make_task(seed)
    image = decode_png(base64.b64encode(render_png(task.scene)).decode())
    seen = read_cells(image)
    per_row = CANVAS // CELL
    expected = [
        ((s.y // CELL) * per_row + s.x // CELL, s.colour, s.kind) for s in task.scene.shapes
    ]
    assert sorted(seen) == sorted(expected)
    counted = sum(
        (task.colour is None or colour == task.colour) and (task.kind is None or kind == task.kind)
        for _, colour, kind in seen
    )
    assert task.answer == str(counted)


def test_shapes_stay_in_their_own_cells_with_a_margin():
    for seed in range(300):
        scene = make_scene(seed, max_shapes=16)
        cells = [(s.x // CELL, s.y // CELL) for s in scene.shapes]
        assert len(set(cells)) == len(cells) and 1 <= len(cells) <= 16
        for s in scene.shapes:
            assert s.x % CELL >= 1 and s.x % CELL + s.size <= CELL - 1
            assert s.y % CELL >= 1 and s.y % CELL + s.size <= CELL - 1
            assert s.kind in KINDS and s.colour in COLOURS
    assert all(len(make_scene(s, max_shapes=1).shapes) == 1 for s in range(20))
    for bad in (0, 17):
        with pytest.raises(ValueError, match="max_shapes"):
            make_scene(0, max_shapes=bad)


def test_the_same_seed_gives_the_same_scene_question_and_png():
    assert make_task(42) == make_task(42)
    assert render_png(make_task(42).scene) == render_png(make_task(42).scene)
    assert generated_items(range(10), 8) == generated_items(range(10), 8)
    assert len({make_task(s).scene for s in range(50)}) == 50  # seeds differ
    assert make_task(5, max_shapes=3).scene != make_task(5).scene


def test_questions_cover_every_form_and_sometimes_count_zero():
    tasks = [make_task(s) for s in range(400)]
    forms = collections.Counter((t.colour is not None, t.kind is not None) for t in tasks)
    assert set(forms) == {(False, False), (True, False), (False, True), (True, True)}
    answers = collections.Counter(t.answer for t in tasks)
    assert answers["0"] > 0 and answers["1"] > 0 and max(int(a) for a in answers) >= 6
    red = [t for t in tasks if t.colour == "red" and t.kind == "circle"]
    assert red and red[0].question == "How many red circles are in the image?"
    total = next(t for t in tasks if t.colour is None and t.kind is None)
    assert total.question == "How many shapes are in the image in total?"
    assert total.answer == str(len(total.scene.shapes))
    scene = Scene((Shape("circle", "red", 1, 1, 20), Shape("circle", "blue", 33, 1, 20)))
    assert (scene.count(kind="circle"), scene.count("red", "square"), scene.count()) == (2, 0, 2)


# ----- scoring ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<answer>3</answer>", 1.0),
        ("<answer>\n  3 \n</answer>", 1.0),  # whitespace around
        ("<ANSWER>3</Answer>", 1.0),  # tags in any case
        ("<think>2? no, <answer>2</answer></think>\nSo: <answer>3</answer>", 1.0),  # after think
        ("I count them.\n<answer>3</answer>\nDone.", 1.0),
        ("<answer>03</answer>", -1.0),  # exact match, not numeric
        ("<answer>three</answer>", -1.0),
        ("<answer>3 shapes</answer>", -1.0),
        ("<answer>3</answer><answer>3</answer>", -1.0),  # several answers: no hedging
        ("<answer>2</answer> or <answer>3</answer>", -1.0),
        ("The answer is 3.", -1.0),  # none
        ("<answer>3", -1.0),  # never closed
        ("<think>it is <answer>3</answer>", -1.0),  # thinking never closed
        ("", -1.0),
    ],
)
def test_scoring_hand_made_answers(completion, score):
    assert score_answer(completion, "3") == score


def test_text_answers_match_up_to_case_and_whitespace():
    assert score_answer("<answer>The  Great\nGatsby</answer>", "the great gatsby") == 1.0
    assert score_answer("<answer>The Great Gatsby.</answer>", "the great gatsby") == -1.0
    assert parse_answer("<answer> Yes </answer>") == "Yes"
    assert parse_answer("no tags") is None


# ----- the hub ---------------------------------------------------------------------------------


def png_of(colour: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 6), colour).save(out, format=fmt)
    return out.getvalue()


@pytest.fixture
def fake_datasets(monkeypatch):
    jpeg = png_of((0, 0, 255), "JPEG")

    def rows(split):
        out = []
        for i in range(6):
            image = Image.new("RGB", (10, 10), (i, 0, 0)) if i % 2 else {"bytes": jpeg}
            out.append(
                {
                    "image": image,
                    "questions": [f"Who wrote book {i}?", "Is it fiction?"],
                    "answers": [f"Author {i}", "No"],
                    "title": f"Book {i}",
                }
            )
        out.append({"image": None, "questions": ["Q"], "answers": ["A"], "title": "no image"})
        out.append({"image": jpeg, "questions": [], "answers": [], "title": "no question"})
        return out

    def split_rows(name, split):
        base, _, limit = split.partition("[:")
        got = rows(base)
        return got[: int(limit.rstrip("]"))] if limit else got

    return fake_hub(monkeypatch, split_rows, only="howard-hou/OCR-VQA")


def test_hub_rows_map_image_question_and_answer(fake_datasets):
    items = hub_items("howard-hou/OCR-VQA", "train")
    assert fake_datasets == [("howard-hou/OCR-VQA", None, "train")]
    assert len(items) == 6  # rows without an image or a question are skipped
    assert items[1]["question"] == "Who wrote book 1?" and items[1]["answer"] == "Author 1"
    assert items[1]["id"] == "train-1"
    for item in items:
        assert decode_png(image_base64(item)).format == "PNG"
    assert len(hub_items("howard-hou/OCR-VQA", "test", limit=3)) == 3
    assert fake_datasets[-1] == ("howard-hou/OCR-VQA", None, "test[:3]")
    with pytest.raises(ValueError, match="row 0: no field 'question'"):
        hub_items("howard-hou/OCR-VQA", "train", fields=("image", "question", "answers"))
    with pytest.raises(HubUnavailable, match="other/name"):
        hub_items("other/name", "train")


def test_the_env_reads_the_hub_when_named(fake_datasets):
    name = "howard-hou/OCR-VQA"
    env = make("http://127.0.0.1:9/v1", dataset_name=name, hub_rows=4, eval_size=8)
    assert [i["id"] for i in env.load()] == ["train-0", "train-1", "train-2", "train-3"]
    assert len(env.load_eval()) == 6  # eval_size rows of the test split, less the bad ones
    assert fake_datasets[-1] == (name, None, "test[:8]")
    custom = make(
        "http://127.0.0.1:9/v1",
        dataset_name="howard-hou/OCR-VQA",
        question_field="title",
        answer_field="title",
    )
    assert custom.load()[0]["question"] == "Book 0"


def test_no_datasets_package_names_the_hub_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(HubUnavailable, match=re.escape(install_hint("hub"))):
        hub_items("howard-hou/OCR-VQA", "train")


# ----- the environment -------------------------------------------------------------------------


def make(url: str, mode: str = "process", server_type: str = "vllm", **env: object):
    """Groups of 4, 50 generated training pictures and 6 held out, unless `env` says otherwise."""
    env = {"train_size": 50, "eval_size": 6, **env}
    return make_env(VisualCounting, url, mode, server_type=server_type, **env)


def test_defaults_and_registration():
    config, [server] = env_defaults(VisualCounting)
    assert isinstance(config, VisualCountingConfig) and config.dataset_name is None
    assert (config.tokenizer_name, server.server_type) == ("tiny", "vllm")
    assert server.base_url == "http://127.0.0.1:9001/v1"
    assert "visual_counting" in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get("visual_counting") is VisualCounting


def test_train_and_eval_items_come_from_disjoint_seeds():
    env = make("http://127.0.0.1:9/v1", seed=7)
    train, held_out = env.load(), env.load_eval()
    assert [i["seed"] for i in train] == list(range(7, 57))
    assert [i["seed"] for i in held_out] == list(range(EVAL_SEEDS + 7, EVAL_SEEDS + 13))
    assert train[0] == {**generated_items(range(7, 8), 8)[0]}


def test_the_prompt_sends_the_picture_as_an_image_url_data_uri():
    env = make("http://127.0.0.1:9/v1")
    item = env.load()[3]
    system, user = env.prompt(item)
    assert system["role"] == "system" and "<answer>" in system["content"]
    image_part, text_part = user["content"]
    url = image_part["image_url"]["url"]
    assert image_part["type"] == "image_url" and url.startswith("data:image/png;base64,")
    b64 = url.split(",", 1)[1]
    assert b64 == image_base64(item) == base64.b64encode(render_png(make_scene(3))).decode()
    assert text_part == {"type": "text", "text": f"{item['question']}\n[item 3]"}


_ITEM = re.compile(r"\[item (\d+)\]")


class Responder:
    """Right on every other call (or always): it reads the seed in the prompt's item tag."""

    def __init__(self, always_right: bool = False) -> None:
        self.turns = itertools.count()
        self.always_right = always_right

    def __call__(self, prompt: str) -> str:
        answer = int(make_task(int(_ITEM.findall(prompt)[-1])).answer)
        if not self.always_right and next(self.turns) % 2:
            answer += 1
        return f"<think>Counting.</think><answer>{answer}</answer>"


def test_check_env_passes_and_tokens_are_the_text_only_conversation():
    report = check_against(make, Responder())
    assert report.groups == 3 and report.token_sources == {"retokenized"}


def test_groups_carry_one_image_per_sequence_and_text_only_messages():
    with FakeInferenceServer(responder=Responder()) as fake:
        env = make(fake.base_url)
        item, group, backlog, sent = image_group(env)
    assert backlog == [] and group is not None
    assert sorted(group["scores"]) == [-1.0, -1.0, 1.0, 1.0]
    assert group["token_source"] == "retokenized" and "inference_logprobs" not in group
    images = group["images"]
    assert isinstance(images, list) and len(images) == len(group["tokens"]) == 4
    assert set(images) == {image_base64(item)}
    assert decode_png(images[0]).size == (CANVAS, CANVAS)
    # the server got the picture; the group's messages and tokens are the text-only copy
    [messages] = sent
    assert messages[1]["content"][0]["image_url"]["url"].endswith(images[0])
    for conversation, tokens in zip(group["messages"], group["tokens"], strict=True):
        assert all(isinstance(m["content"], str) for m in conversation)
        assert conversation[1]["content"].startswith(IMAGE_PLACEHOLDER + "\n")
        assert IMAGE_PLACEHOLDER in env.tokenizer.decode(tokens)
        assert conversation[-1]["role"] == "assistant"
    decoded = wire.decode_group(wire.encode(group))
    assert decoded.images == images


def test_trl_servers_are_refused_and_missing_pillow_names_the_extra(monkeypatch):
    env = make("http://127.0.0.1:9/v1", server_type="trl")
    with pytest.raises(ValueError, match="drop the image"):
        asyncio.run(env.setup())
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match="vision"):
        asyncio.run(make("http://127.0.0.1:9/v1").setup())


def rollout() -> Rollout:
    return Rollout("x", [1] * 20, [-100] * 5 + [1] * 15, None, "stop", "retokenized")


def test_group_rules_and_train_percent_correct():
    env = make("http://127.0.0.1:9/v1")
    item = env.load()[0]
    assert env.score(item, f"<answer>{item['answer']}</answer>") == 1.0
    assert env.score_group(item, [rollout()] * 2, [1.0, -1.0]) == [1.0, -1.0]
    assert env.score_group(item, [rollout()] * 2, [1.0, 1.0]) is None  # all equal: dropped
    keep = make("http://127.0.0.1:9/v1", ensure_scores_are_not_same=False)
    assert keep.score_group(item, [rollout()] * 2, [-1.0, -1.0]) == [-1.0, -1.0]
    asyncio.run(env.wandb_log({"x": 1}))
    assert env.metrics == {"x": 1, "train/percent_correct": 0.75}


def test_process_writes_jsonl_with_images_and_html(tmp_path):
    out = tmp_path / "visual_counting.jsonl"
    with FakeInferenceServer(responder=visual_counting.demo_responder) as fake:
        run = process_with_runner(
            make(fake.base_url, total_steps=3, data_path_to_save_groups=str(out))
        )
    assert len(run.groups) == 3
    for group in run.groups:
        assert sorted(group["scores"]) == [-1.0, -1.0, 1.0, 1.0]
        assert len(group["images"]) == 4 and len(set(group["images"])) == 1
        assert decode_png(group["images"][0]).format == "PNG"
        assert "<answer>" in group["messages"][0][-1]["content"]
    assert "answer" in run.page  # the page shows the rollouts (escaped); images: see docs/view.md


def test_evaluate_reports_percent_correct_on_held_out_seeds(tmp_path):
    run = evaluate_against(make, Responder(always_right=True), tmp_path, setup=True)
    assert run.metrics == {"eval/percent_correct": 1.0, "eval/mean_score": 1.0}
    assert run.doc["results"]["all"] == run.metrics
    samples = run.samples
    assert sorted(int(s["id"]) for s in samples) == list(range(EVAL_SEEDS, EVAL_SEEDS + 6))
    assert all(s["gold"] == make_task(int(s["id"])).answer for s in samples)


def test_demo_responder_is_right_on_every_other_call():
    item = generated_items(range(987_654, 987_655), 8)[0]  # never loaded: found by its seed
    prompt = f"<|im_start|>user\n{IMAGE_PLACEHOLDER}\n{item['question']}\n[item {item['id']}]"
    answers = [demo_responder(prompt) or "" for _ in range(4)]
    assert sorted(score_answer(a, item["answer"]) for a in answers) == [-1.0, -1.0, 1.0, 1.0]
    assert demo_responder("What is 2 + 2?") is None
    assert demo_responder("[item nowhere-1]") is None
