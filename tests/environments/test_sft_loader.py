"""The `sft_loader` environment: formats, masks, 1-sequence groups, the per-step queue budget,
hub loading and a process run; no inference server anywhere."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.environments.common.data_loading import HubUnavailable
from atropos.environments.sft_loader import (
    FORMATS,
    SFTExample,
    SFTLoader,
    SFTLoaderConfig,
    load_examples,
    step_budget,
    to_example,
    tokenize_example,
)
from atropos.envs import registry
from atropos.envs.check import check_env
from atropos.envs.config import ResolvedConfig
from atropos.envs.runner.serve import ServeRunner
from atropos.inference.config import ServerManagerConfig
from atropos.testing import serve_in_thread
from atropos.testing.fake_engine import load_tokenizer

from .helpers import fake_hub, process_with_runner

TOK = load_tokenizer()
CHAT = (
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6"},
)


def trained_text(masks: list[int]) -> str:
    return TOK.decode([m for m in masks if m != -100])


def make(**env: object) -> SFTLoader:
    defaults, servers = SFTLoader.config_init()
    config = defaults.model_copy(update=env)
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), "process")
    return SFTLoader(config, servers, manager=resolved.manager)


def run(coro):
    return asyncio.run(coro)


# ----- formats and masks --------------------------------------------------------------------------


@pytest.mark.parametrize("dataset_format", FORMATS)
def test_every_shipped_format_has_thirty_examples(dataset_format):
    examples = load_examples(dataset_format)
    assert len(examples) == 30
    if dataset_format in ("oai_format", "sharegpt_format"):
        assert all(e.messages and e.messages[-1]["role"] == "assistant" for e in examples)
        assert sum(1 for e in examples if e.messages and len(e.messages) > 3) >= 5  # multi-turn
    else:
        assert all(e.messages is None and e.completion for e in examples)
        assert all(bool(e.prefix) == (dataset_format == "prefix_completion") for e in examples)


def test_the_chat_formats_agree():
    assert load_examples("oai_format") == load_examples("sharegpt_format")


def test_only_assistant_tokens_are_trained():
    tokens, masks = tokenize_example(TOK, SFTExample(messages=CHAT))
    assert len(tokens) == len(masks)
    assert all(m in (-100, t) for t, m in zip(tokens, masks, strict=True))
    assert trained_text(masks) == "4<|im_end|>\n6<|im_end|>\n"
    assert TOK.decode(tokens) == TOK.apply_chat_template(list(CHAT), tokenize=False)


def test_last_only_trains_the_last_assistant_turn():
    _, masks = tokenize_example(TOK, SFTExample(messages=CHAT), train_on="last")
    assert trained_text(masks) == "6<|im_end|>\n"


def test_text_formats_train_the_completion_and_an_eos():
    tokens, masks = tokenize_example(TOK, SFTExample(prefix="Q: 2+2?\nA:", completion=" 4"))
    assert TOK.decode(tokens) == "Q: 2+2?\nA: 4<|im_end|>"
    assert trained_text(masks) == " 4<|im_end|>"
    tokens, masks = tokenize_example(TOK, SFTExample(completion="all of it"))
    assert masks == tokens and TOK.decode(tokens) == "all of it<|im_end|>"


def test_rows_are_read_per_format_and_bad_ones_named():
    assert to_example({"text": "x"}, "completion", "r").completion == "x"
    assert to_example({"prompt": "p", "response": "c"}, "prefix_completion", "r").prefix == "p"
    oai = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    trailing = {"messages": [*oai["messages"], {"role": "user", "content": "unanswered"}]}
    assert to_example(trailing, "oai_format", "r") == to_example(oai, "oai_format", "r")
    with pytest.raises(ValueError, match="r1: no text field 'prefix' or 'prompt'"):
        to_example({"completion": "c"}, "prefix_completion", "r1")
    with pytest.raises(ValueError, match="r2: expected a 'conversations' list"):
        to_example(oai, "sharegpt_format", "r2")
    with pytest.raises(ValueError, match="r3: no assistant turn"):
        to_example({"messages": [{"role": "user", "content": "a"}]}, "oai_format", "r3")
    with pytest.raises(ValueError, match="r4: unreadable turn"):
        to_example({"messages": [{"role": "alien", "content": "a"}]}, "oai_format", "r4")
    with pytest.raises(ValueError, match="unknown dataset_format"):
        to_example({}, "parquet", "r5")


# ----- groups -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset_format", FORMATS)
def test_each_item_is_a_one_sequence_sft_group(dataset_format):
    env = make(dataset_format=dataset_format)
    run(env.setup())
    item = run(env.get_next_item())
    group, backlog = run(env.collect_trajectories(item))
    assert backlog == [] and group["scores"] == [1.0]
    [tokens], [masks], [advantages] = group["tokens"], group["masks"], group["advantages"]
    assert len(tokens) == len(masks) == len(advantages)
    assert advantages == [0.0 if m == -100 else 1.0 for m in masks] and 1.0 in advantages
    assert group["group_overrides"] == {"sft": True, "group_size": 1}
    assert group["overrides"] == [{"sft": True}]
    assert group["token_source"] == "retokenized" and "inference_logprobs" not in group
    assert group["messages"][0][-1]["role"] == "assistant"


def test_too_long_examples_are_skipped_and_counted():
    env = make(max_token_length=8)
    run(env.setup())
    assert run(env.collect_trajectories(run(env.get_next_item()))) == (None, [])
    run(env.wandb_log())
    assert env.metrics["train/sft_skipped"] == 1.0


def test_every_example_once_per_pass_in_a_seeded_order():
    env = make()
    run(env.setup())
    first = [run(env.get_next_item()) for _ in range(30)]
    assert sorted(map(repr, first)) == sorted(map(repr, env.examples))
    second = [run(env.get_next_item()) for _ in range(30)]
    assert second != first and (env.sft_epoch, env.sft_index) == (2, 0)
    again = make()
    run(again.setup())
    assert [run(again.get_next_item()) for _ in range(30)] == first
    plain = make(shuffle=False)
    run(plain.setup())
    assert run(plain.get_next_item()) == load_examples("sharegpt_format")[0]


def test_the_position_is_checkpointed():
    env = make()
    run(env.setup())
    for _ in range(7):
        run(env.get_next_item())
    state = env.checkpoint_state()
    following = run(env.get_next_item())
    other = make()
    run(other.setup())
    other.restore_state(state)
    assert run(other.get_next_item()) == following


# ----- the queue budget ---------------------------------------------------------------------------


def test_budget_arithmetic():
    assert step_budget(3, 64, 0, 1000) == 192
    assert step_budget(3, 64, 150, 1000) == 42
    assert step_budget(3, 64, 150, 10) == 10
    assert step_budget(3, 64, 400, 10) == 0  # over budget: nothing, never negative
    assert step_budget(0, 64, 400, 10) == 10  # no off-policy bound
    assert step_budget(3, -1, 0, 10) == 10  # batch size unknown


def drain(env: SFTLoader) -> int:
    n = 0
    while run(env.get_next_item()) is not None:
        n += 1
        assert n < 1000
    return n


def test_serve_mode_fills_the_budget_once_per_step():
    env = make(batch_size=8, max_batches_offpolicy=3, max_sft_per_step=20)
    run(env.setup())
    env.env_id = 0  # registered: serve mode
    assert run(env.get_next_item()) is None  # no status yet: nothing
    env.status_dict = {"current_step": 0, "queue_size": 10}
    assert drain(env) == 14  # 3 x 8 - 10
    assert drain(env) == 0  # the same step: spent
    env.status_dict = {"current_step": 1, "queue_size": 0}
    assert drain(env) == 20  # capped by max_sft_per_step
    env.status_dict = {"current_step": 2, "queue_size": 30}
    assert drain(env) == 0  # the queue is over budget


def test_add_every_n_steps_and_group_units():
    env = make(batch_size=8, max_batches_offpolicy=2, add_every_n_steps=2, group_size=2)
    run(env.setup())
    env.env_id = 0
    env.status_dict = {"current_step": 0, "queue_size": 3}  # 3 groups of 2 sequences
    assert drain(env) == 10  # 2 x 8 - 6
    env.status_dict = {"current_step": 1, "queue_size": 0}
    assert drain(env) == 0  # not a multiple of 2
    env.status_dict = {"current_step": 5, "queue_size": 0}
    assert drain(env) == 16  # jumped past 2 and 4: one refill


def test_process_mode_has_no_budget():
    env = make(batch_size=8, max_batches_offpolicy=1)
    run(env.setup())
    assert sum(1 for _ in range(50) if run(env.get_next_item()) is not None) == 50


TRAINER = {
    "wandb_group": "g",
    "wandb_project": "p",
    "batch_size": 8,
    "max_token_len": 4096,
    "checkpoint_dir": "",
    "save_checkpoint_interval": -1,
    "starting_step": 0,
    "num_steps": 1000,
}


def serve_for(url: str, seconds: float, tmp_path, **env: object) -> ServeRunner:
    """Run the loader in serve mode against the API at `url` for `seconds`."""
    loader = make(rollout_server_url=url, register_timeout=10, **env)
    config = loader.config
    resolved = ResolvedConfig(config, loader.server_configs, ServerManagerConfig(), "serve")
    runner = ServeRunner(loader, resolved, tmp_path)
    runner.status_interval = 0.05

    async def main() -> int:
        task = asyncio.create_task(runner.run())
        await asyncio.sleep(seconds)
        runner.stopping.set()
        return await task

    assert run(main()) == 0
    return runner


def test_serve_mode_adds_at_most_max_sft_per_step_while_the_step_stands(tmp_path):
    with serve_in_thread(create_app(ApiConfig())) as url:
        with httpx.Client(base_url=url) as c:
            c.post("/register", json=TRAINER)
            c.get("/batch")  # started; nobody trains, so the step stays 0
        serve_for(url, 1.0, tmp_path, max_batches_offpolicy=2, max_sft_per_step=5)
        assert httpx.get(f"{url}/status").json()["queue_size"] == 5  # the runner alone: 16
        serve_for(url, 1.0, tmp_path / "2", max_batches_offpolicy=2, max_sft_per_step=100)
        assert httpx.get(f"{url}/status").json()["queue_size"] == 16  # 2 x 8 queued at most


def test_serve_mode_keeps_a_training_trainer_fed(tmp_path):
    batches: list[list[dict]] = []
    stop = threading.Event()
    with serve_in_thread(create_app(ApiConfig())) as url:

        def train() -> None:
            with httpx.Client(base_url=url, timeout=10) as c:
                c.post("/register", json=TRAINER)
                while not stop.is_set():
                    batch = c.get("/batch").json()["batch"]
                    if batch is None:
                        time.sleep(0.02)
                    else:
                        batches.append(batch)

        trainer = threading.Thread(target=train, daemon=True)
        trainer.start()
        time.sleep(0.2)
        serve_for(url, 2.0, tmp_path, max_batches_offpolicy=1, max_sft_per_step=8)
        stop.set()
        trainer.join(5)
    assert len(batches) >= 3  # a new step, 8 more sequences, the next batch
    groups = [g for b in batches for g in b]
    assert all(len(g["tokens"]) == 1 and g["group_overrides"]["sft"] for g in groups)
    assert all(g["overrides"] == [{"sft": True}] and g["scores"] == [1.0] for g in groups)


# ----- the environment end to end -----------------------------------------------------------------


def test_check_env_passes_without_any_server():
    report = check_env(make(), items=3)
    assert report.groups == 3 and report.token_sources == {"retokenized"}
    report = check_env(make(group_size=4, dataset_format="completion"), items=2)
    assert report.groups == 2  # group_overrides.group_size says 1


def test_process_writes_jsonl_and_html(tmp_path):
    out = tmp_path / "sft.jsonl"
    env = make(total_steps=5, data_path_to_save_groups=str(out), dataset_format="oai_format")
    written = process_with_runner(env)
    assert len(written.groups) == 5
    assert all(g["scores"] == [1.0] and g["group_overrides"]["sft"] for g in written.groups)
    assert "assistant" in written.page
    assert env.metrics["train/sft_sequences"] == 5.0


@pytest.fixture
def fake_datasets(monkeypatch):
    rows = [
        {"conversations": [{"from": "human", "value": f"Q{i}"}, {"from": "gpt", "value": f"A{i}"}]}
        for i in range(12)
    ]
    rows.append({"conversations": [{"from": "human", "value": "no answer"}]})  # skipped
    return fake_hub(monkeypatch, rows, only="AlignmentLab-AI/open-instruct-sharegpt")


def test_the_hub_dataset_is_loaded_by_name(fake_datasets):
    name = "AlignmentLab-AI/open-instruct-sharegpt"
    env = make(dataset_name=name)
    run(env.setup())
    assert fake_datasets == [(name, None, "train")] and len(env.examples) == 12
    group, _ = run(env.collect_trajectories(run(env.get_next_item())))
    assert trained_text(group["masks"][0]).startswith("A")
    with pytest.raises(ValueError, match="no row reads as oai_format"):
        load_examples("oai_format", name)
    with pytest.raises(HubUnavailable, match="other/name"):
        load_examples("sharegpt_format", "other/name")


def test_defaults_and_registration():
    config, servers = SFTLoader.config_init()
    assert isinstance(config, SFTLoaderConfig) and config.dataset_name is None
    assert (config.group_size, config.dataset_format, config.train_on) == (
        1,
        "sharegpt_format",
        "all_assistant",
    )
    assert not config.ensure_scores_are_not_same and config.inference_weight == -1.0
    assert type(servers).__name__ == "ServerBaseline"
    assert registry.get("sft_loader") is SFTLoader
