"""The small Env class end to end against the fake inference server."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, ClassVar

import pytest

from atropos.envs.check import EnvCheckError, check_env
from atropos.envs.config import BaseEnvConfig, ResolvedConfig
from atropos.envs.runner.process import ProcessRunner
from atropos.envs.simple import Env, Rollout, ShuffledPasses, rollout_group
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.testing import FakeInferenceServer

from .arith import Addition, solver


def make(
    url: str, server_type: str = "vllm", mode: str = "process", **env
) -> tuple[Addition, ResolvedConfig]:
    config = BaseEnvConfig(
        tokenizer_name="tiny", group_size=4, use_wandb=False, max_token_length=256, **env
    )
    servers = [APIServerConfig(base_url=url, server_type=server_type, model_name="atropos-tiny")]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), mode)  # type: ignore[arg-type]
    return Addition(config, servers, manager=resolved.manager), resolved


@pytest.fixture(scope="module")
def fake():
    with FakeInferenceServer(responder=solver) as server:
        yield server


@pytest.mark.parametrize("server_type", ["vllm", "sglang", "trl"])
def test_groups_carry_the_servers_token_ids_and_logprobs(fake, server_type):
    env, _ = make(fake.base_url, server_type)
    report = check_env(env)
    assert report.groups == 2 and report.token_sources == {"server"}

    async def one() -> dict:
        await env.setup()
        group, _ = await env.collect_trajectories({"question": "What is 3 + 4?", "answer": 7})
        await env.server.aclose()
        return group

    env, _ = make(fake.base_url, server_type)
    group = asyncio.run(one())
    tok = fake.tokenizer
    for tokens, masks, logprobs, messages in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], group["messages"], strict=True
    ):
        trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
        assert tok.decode(trained, skip_special_tokens=True) == messages[-1]["content"]
        assert len(logprobs) == len(tokens)
        assert all(lp == 1.0 for lp, m in zip(logprobs, masks, strict=True) if m == -100)
        assert all(lp <= 0 for lp, m in zip(logprobs, masks, strict=True) if m != -100)
    assert sorted(set(group["scores"])) in ([-1.0], [1.0], [-1.0, 1.0])


def test_text_only_servers_are_retokenized_and_say_so(fake):
    env, _ = make(fake.base_url, "openai")
    report = check_env(env)
    assert report.token_sources == {"retokenized"}


def test_process_end_to_end_writes_groups(fake, tmp_path):
    out = tmp_path / "addition.jsonl"
    env, resolved = make(
        fake.base_url,
        total_steps=6,
        data_path_to_save_groups=str(out),
        ensure_scores_are_not_same=False,
        max_num_workers=4,
    )
    assert asyncio.run(ProcessRunner(env, resolved).run(show_progress=False)) == 0
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 6 and all(g["token_source"] == "server" for g in groups)
    assert all(len(g["tokens"]) == 4 for g in groups)


def test_evaluate_writes_upstreams_format(fake, tmp_path):
    env, _ = make(fake.base_url, mode="evaluate", data_dir_to_save_evals=str(tmp_path))

    async def main() -> dict:
        await env.setup()
        metrics = await env.evaluate()
        await env.server.aclose()
        return metrics

    metrics = asyncio.run(main())
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["results"]["all"] == metrics == doc["results"]["atropos|addition_eval|0"]
    assert doc["config_general"]["model_name"] == "atropos-tiny"
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 1 and samples[0]["completion"]


def test_check_env_lists_every_broken_rule(fake):
    class Broken(Addition):
        async def collect_trajectories(self, item):
            group, backlog = await super().collect_trajectories(item)
            group["masks"] = [[-100] * len(t) for t in group["tokens"]]
            group["inference_logprobs"][0] = group["inference_logprobs"][0][:-1]
            group["tokens"] = group["tokens"][:3]
            group["masks"] = group["masks"][:3]
            return group, backlog

    env, _ = make(fake.base_url)
    env.__class__ = Broken
    with pytest.raises(EnvCheckError) as err:
        check_env(env, items=1)
    text = str(err.value)
    assert "the API would refuse it" in text  # 3 masks/tokens rows but 4 scores and logprobs


def test_items_are_shuffled_passes_over_the_data(fake):
    env, _ = make(fake.base_url)

    async def items() -> list:
        await env.setup()
        return [(await env.get_next_item())["question"] for _ in range(50)]

    seen = asyncio.run(items())
    assert len(set(seen[:25])) == 25  # one full pass before any repeat
    assert seen[:25] != [it["question"] for it in env.items]  # shuffled
    random.seed(0)


def test_sequence_overrides_and_concurrent_async_scores_shape_the_group(fake):
    class Overriding(Addition):
        score_concurrently = True
        running = peak = 0

        async def score(self, item, completion):  # type: ignore[override]
            Overriding.running += 1
            Overriding.peak = max(Overriding.peak, Overriding.running)
            await asyncio.sleep(0.01)
            Overriding.running -= 1
            return Addition.score(self, item, completion)

        def sequence_overrides(self, item, rollouts, scores):
            return [{"set_advantage_to_zero": True} if s < 0 else {} for s in scores]

    async def groups() -> tuple[dict, dict]:
        plain, _ = make(fake.base_url)
        env, _ = make(fake.base_url)
        env.__class__ = Overriding
        await env.setup()
        item = {"question": "What is 3 + 4?", "answer": 7}
        group, _ = await env.collect_trajectories(item)
        await plain.setup()
        without, _ = await plain.collect_trajectories(item)
        await env.server.aclose()
        await plain.server.aclose()
        return group, without

    group, without = asyncio.run(groups())
    assert Overriding.peak == 4  # the group's four scores were awaited together
    expected = [{"set_advantage_to_zero": True} if s < 0 else {} for s in group["scores"]]
    assert group["overrides"] == expected
    keys = ["tokens", "masks", "scores", "messages", "overrides", "token_source"]
    assert list(group)[:6] == keys  # the order code_execution wrote before it used the hook
    assert "overrides" not in without  # the default hook sends none


class Picky(Addition):
    """Keeps items whose answer is even; names why it drops odd ones, except multiples of 3."""

    def score_group(self, item, rollouts, scores):
        answer = item["answer"]
        if answer % 2 == 0:
            return scores
        if answer % 3:
            self.drop("odd" if answer % 5 else "odd_multiple_of_5")
        return None  # odd multiples of 3 are dropped without a reason


def test_drop_reasons_are_counted_per_item_even_when_items_overlap(fake, tmp_path):
    out = tmp_path / "picky.jsonl"
    config = BaseEnvConfig(
        tokenizer_name="tiny",
        group_size=2,
        use_wandb=False,
        max_token_length=256,
        total_steps=12,
        data_path_to_save_groups=str(out),
        ensure_scores_are_not_same=False,
        max_num_workers=8,  # items in flight together: reasons must not leak between them
    )
    servers = [APIServerConfig(base_url=fake.base_url, server_type="vllm", model_name="m")]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), "process")  # type: ignore[arg-type]
    env = Picky(config, servers, manager=resolved.manager)
    runner = ProcessRunner(env, resolved)
    seen: list[int] = []
    collect = env.collect_trajectories

    async def counting(item):
        seen.append(item["answer"])
        return await collect(item)

    env.collect_trajectories = counting  # type: ignore[method-assign]
    assert asyncio.run(runner.run(show_progress=False)) == 0
    odd = [a for a in seen if a % 2]
    expected = {
        "odd": sum(1 for a in odd if a % 3 and a % 5),
        "odd_multiple_of_5": sum(1 for a in odd if a % 3 and not a % 5),
        "by_env": sum(1 for a in odd if not a % 3),
    }
    assert {k: runner.drops[k] for k in expected} == expected
    assert sum(expected.values()) == len(odd) > 0
    env.drop("outside a run")  # nothing to count into: no error


class Tuned(BaseEnvConfig):
    bonus: float = 0.5


def test_an_env_generic_over_its_config_gets_a_typed_converted_config():
    class Mine(Env[Tuned]):
        config_defaults: ClassVar[dict[str, Any]] = {"group_size": 3}

        def load(self) -> list[dict[str, Any]]:
            return [{"prompt": "p"}]

        def score(self, item: dict[str, Any], completion: str) -> float:
            return self.config.bonus  # typed: Tuned, no getattr

    assert Mine.env_config_cls is Tuned
    config, _ = Mine.config_init()
    assert isinstance(config, Tuned) and config.group_size == 3
    env = Mine(BaseEnvConfig(group_size=2, use_wandb=False), [])  # upstream callers pass a base
    assert isinstance(env.config, Tuned) and (env.config.group_size, env.config.bonus) == (2, 0.5)


def test_a_generic_env_that_also_names_another_config_class_is_refused_at_definition():
    with pytest.raises(
        TypeError, match="generic over Tuned but sets env_config_cls = BaseEnvConfig"
    ):

        class Confused(Env[Tuned]):  # noqa: F841
            env_config_cls = BaseEnvConfig


def test_default_evaluate_is_built_from_the_sample_and_metrics_hooks(fake, tmp_path):
    seen: list[float] = []

    class Counted(Addition):
        def eval_sample(self, item, rollout, score):  # type: ignore[no-untyped-def]
            seen.append(score)
            return {"q": item["question"], "score": score * 2}

        def eval_metrics(self, samples):  # type: ignore[no-untyped-def]
            return {"eval/doubled": sum(s["score"] for s in samples)}

    env, _ = make(fake.base_url, mode="evaluate", data_dir_to_save_evals=str(tmp_path))
    env.__class__ = Counted

    async def main() -> dict:
        await env.setup()
        metrics = await env.evaluate()
        await env.server.aclose()
        return metrics

    metrics = asyncio.run(main())
    assert metrics == {"eval/doubled": 2 * sum(seen)} and len(seen) == 1
    [row] = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert row["score"] == 2 * seen[0] and "q" in row
    doc = json.loads((tmp_path / "metrics.json").read_text())
    assert doc["config_general"]["generation_parameters"]["temperature"] == 0.0  # greedy


def test_rollout_group_keeps_each_prompt_and_the_oldest_policy_version():
    def rollout(text: str, source: str, logprobs: list[float] | None, version: int | None):
        return Rollout(text, [1, 2, 3], [-100, 2, 3], logprobs, "stop", source, version)

    a, b = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    same = [rollout("x", "server", [0.0, -0.5], 4), rollout("y", "server", [0.0, -0.1], 3)]
    group = rollout_group(same, [a, b], [1.0, -1.0])
    assert group == {
        "tokens": [[1, 2, 3], [1, 2, 3]],
        "masks": [[-100, 2, 3], [-100, 2, 3]],
        "scores": [1.0, -1.0],
        "messages": [[*a, {"role": "assistant", "content": "x"}],
                     [*b, {"role": "assistant", "content": "y"}]],
        "token_source": "server",
        "inference_logprobs": [[0.0, -0.5], [0.0, -0.1]],
        "policy_version": 3,
    }  # fmt: skip
    mixed = [rollout("x", "server", [0.0], None), rollout("y", "retokenized", None, None)]
    group = rollout_group(mixed, [a, a], [0.0, 0.0])
    assert group["token_source"] == "mixed"
    assert "inference_logprobs" not in group and "policy_version" not in group
    assert rollout_group([], [], [])["token_source"] is None
    zero = [{"set_advantage_to_zero": True}, {}]
    assert list(rollout_group(same, [a, b], [1.0, -1.0], zero))[3:6] == [
        "messages", "overrides", "token_source"
    ]  # fmt: skip


def test_shuffled_passes_visit_every_item_once_per_pass_in_a_seeded_order():
    items = list(range(7))
    passes = ShuffledPasses(items, seed=3)
    first, second = [passes.next() for _ in items], [passes.next() for _ in items]
    assert sorted(first) == sorted(second) == items and first != second  # reshuffled
    again = ShuffledPasses(items, seed=3)
    assert [again.next() for _ in range(14)] == first + second
    rng, expected = random.Random(3), []
    for _ in range(2):  # the order Env has always taken its items in
        order = list(range(7))
        rng.shuffle(order)
        expected += [items[i] for i in reversed(order)]
    assert first + second == expected
