"""The teacher step (`--teacher.*`): settings in every layer, the same-tokenizer rule, groups
filled from the teacher's servers (several), and a failing teacher dropping groups, never
sending them bare. Against fake servers (no model); the local CPU server: tests/trainer/test_opd.py.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos.api import ApiConfig, create_app
from atropos.envs.cli import main, parse
from atropos.envs.config import ConfigError, TeacherConfig
from atropos.envs.runner.process import ProcessRunner
from atropos.envs.runner.serve import ServeRunner
from atropos.envs.teacher import (
    BAD_ANSWER,
    FAILED,
    Teacher,
    check_teacher_tokenizer,
    tokenizer_difference,
)
from atropos.inference.config import ServerManagerConfig
from atropos.inference.manager import ServerManager
from atropos.inference.tokenizer import load_tokenizer
from atropos.testing import FakeInferenceServer, serve_in_thread, tiny_tokenizer_path

from .arith import Addition
from .synth import SynthEnv, resolved

FAST = ServerManagerConfig(
    retry_backoff=0.01, retry_backoff_max=0.02, server_wait=5, health_check_interval=0.05
)


def teacher_config(*urls: str, **kw: Any) -> TeacherConfig:
    return TeacherConfig(base_url=list(urls), model_name="atropos-tiny", top_k=3, **kw)


def prompt_logprobs(base_url: str, tokens: list[int], k: int) -> list[Any]:
    """What the server itself answers for `tokens`: vLLM's per-position prompt_logprobs."""
    body = {
        "model": "atropos-tiny",
        "prompt": tokens,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": k,
    }
    r = httpx.post(f"{base_url}/completions", json=body, timeout=30)
    r.raise_for_status()
    return r.json()["choices"][0]["prompt_logprobs"]


def top(position: dict[str, Any] | None, k: int) -> tuple[list[int], list[float]]:
    if position is None:
        return [], []
    ranked = sorted(position.items(), key=lambda kv: kv[1]["logprob"], reverse=True)[:k]
    return [int(i) for i, _ in ranked], [v["logprob"] for _, v in ranked]


def flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


# ----- settings -------------------------------------------------------------------------------


def test_teacher_settings_are_a_namespace_of_every_env(tmp_path, monkeypatch):
    conf = tmp_path / "c.yaml"
    conf.write_text("teacher:\n  model_name: from-file\n  top_k: 4\n")
    monkeypatch.setenv("ATROPOS_TEACHER__TOP_K", "5")
    argv = ["--config", str(conf), "--teacher.base_url", "http://a:1/v1,http://b:2/v1"]
    argv += ["--teacher.api-key", "sk-teacher"]
    teacher = parse(Addition, "process", argv).env.teacher
    assert teacher.enabled and teacher.base_url == ["http://a:1/v1", "http://b:2/v1"]
    assert teacher.model_name == "from-file" and teacher.top_k == 5  # variable beats the file
    servers = teacher.servers()
    assert [s.base_url for s in servers] == teacher.base_url
    assert {s.server_type for s in servers} == {"vllm"}
    assert servers[0].api_key.get_secret_value() == "sk-teacher"
    assert not parse(Addition, "process", []).env.teacher.enabled  # off by default
    with pytest.raises(ConfigError, match=r"--teacher\.server_type"):
        parse(Addition, "process", ["--teacher.server_type", "openai"])  # no prompt logprobs
    with pytest.raises(ConfigError, match=r"--teacher\.top_k"):
        parse(Addition, "process", ["--teacher.top_k", "0"])


# ----- the same tokenizer ---------------------------------------------------------------------


def copy_of_tiny(target: Path) -> Path:
    """The shipped tokenizer's files under another name (`load_tokenizer` caches by name)."""
    shutil.copytree(tiny_tokenizer_path(), target)
    return target


def other_vocab(tmp_path: Path) -> Path:
    """The tiny tokenizer plus one token (a fresh copy: the cached one is never changed)."""
    from atropos.inference.tokenizer import import_transformers_quietly

    target = copy_of_tiny(tmp_path / "other-vocab")
    tok = import_transformers_quietly().AutoTokenizer.from_pretrained(target)
    tok.add_tokens(["<only_the_teacher_has_this>"])
    tok.save_pretrained(target)
    return target


def other_encoding(tmp_path: Path) -> Path:
    """The tiny tokenizer's vocabulary with a lowercasing normalizer: same ids, other encodings."""
    from tokenizers import Tokenizer, normalizers

    target = copy_of_tiny(tmp_path / "lowercase")
    backend = Tokenizer.from_file(str(target / "tokenizer.json"))
    backend.normalizer = normalizers.Lowercase()
    backend.save(str(target / "tokenizer.json"))
    return target


def test_tokenizer_difference_names_vocabulary_then_encoding(tmp_path):
    tiny = load_tokenizer(tiny_tokenizer_path())
    same = load_tokenizer(str(copy_of_tiny(tmp_path / "same")))
    assert same is not tiny and tokenizer_difference(tiny, same) is None
    vocab = tokenizer_difference(tiny, load_tokenizer(str(other_vocab(tmp_path))))
    assert vocab is not None and "vocabularies have" in vocab
    encoding = tokenizer_difference(tiny, load_tokenizer(str(other_encoding(tmp_path))))
    assert encoding is not None and "encode 'Hello, world!" in encoding


def test_a_teacher_with_another_tokenizer_is_refused_before_any_rollout(tmp_path, capsys):
    with FakeInferenceServer() as teacher:
        for other in (other_vocab(tmp_path), other_encoding(tmp_path)):
            out = tmp_path / f"{other.name}.jsonl"
            argv = ["process", "--testing", "--env.use_wandb", "false"]
            argv += ["--env.data_path_to_save_groups", str(out), "--env.total_steps", "2"]
            argv += ["--teacher.base_url", teacher.base_url, "--teacher.tokenizer_name", str(other)]
            assert main(Addition, argv) == 2
            err = capsys.readouterr().err
            assert "--teacher: the teacher's tokenizer" in err and str(other) in err
            assert "must use the environment's tokenizer" in err
            assert not out.exists()
        assert teacher.requests["/v1/completions"] == 0  # refused before asking anything


def test_the_same_tokenizer_under_another_name_passes(tmp_path):
    cfg = resolved("process")
    env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
    copy = copy_of_tiny(tmp_path / "same")
    same = TeacherConfig(base_url=["http://x/v1"], tokenizer_name=str(copy))
    asyncio.run(check_teacher_tokenizer(env, same))  # loaded and compared: equal
    unnamed = TeacherConfig(base_url=["http://x/v1"])
    with pytest.raises(ConfigError, match=r"--teacher\.model_name.*--teacher\.tokenizer_name"):
        asyncio.run(check_teacher_tokenizer(env, unnamed))


# ----- filling groups -------------------------------------------------------------------------


def group(*seqs: list[int]) -> dict[str, Any]:
    return {
        "tokens": [list(s) for s in seqs],
        "masks": [[-100, *s[1:]] for s in seqs],
        "scores": [float(i) for i in range(len(seqs))],
    }


def test_groups_get_the_teachers_top_k_from_several_servers():
    seqs = [[20, 30, 40, 50, 60], [20, 30, 41, 52], [21, 33, 44]]
    with FakeInferenceServer() as a, FakeInferenceServer() as b:
        config = teacher_config(a.base_url, b.base_url)

        async def fill() -> tuple[list[dict[str, Any]], Counter[str]]:
            async with ServerManager(config.servers(), FAST) as manager:
                teacher, drops = Teacher(config, manager), Counter[str]()
                groups = [group(*seqs) for _ in range(4)]
                return await teacher.annotate(groups, drops), drops

        filled, drops = asyncio.run(fill())
        assert len(filled) == 4 and not drops
        assert a.requests["/v1/completions"] > 0 and b.requests["/v1/completions"] > 0
        for g in filled:
            for seq, ids, lps in zip(
                seqs, g["distill_token_ids"], g["distill_logprobs"], strict=True
            ):
                assert len(ids) == len(lps) == len(seq)  # [sequence][position][top_k]
                assert ids[0] == [] and all(len(row) == 3 for row in ids[1:])
                answer = prompt_logprobs(a.base_url, seq, 3)
                expected = [top(position, 3) for position in answer]
                assert ids == [e[0] for e in expected]
                assert flat(lps) == pytest.approx(flat([e[1] for e in expected]))
        assert json.dumps(filled)  # plain JSON, as sent


def test_a_failing_teacher_drops_the_group_with_its_reason():
    with FakeInferenceServer() as server:
        config = teacher_config(server.base_url)

        async def fill() -> tuple[list[dict[str, Any]], Counter[str]]:
            async with ServerManager(config.servers(), FAST) as manager:
                teacher, drops = Teacher(config, manager), Counter[str]()
                server.fail_next(1000, 503, paths=["/v1/completions"])
                failed = await teacher.annotate([group([20, 30, 40])], drops)
                server.clear_failures()
                server.fail_next(1, 503, paths=["/v1/completions"])  # retried: still sent
                kept = await teacher.annotate([group([20, 30, 40])], drops)
                return failed + kept, drops

        groups, drops = asyncio.run(fill())
        assert drops == Counter({FAILED: 1})
        assert len(groups) == 1 and groups[0]["distill_logprobs"] is not None


def test_an_answer_that_does_not_line_up_is_dropped():
    class Misaligned:
        async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
            n = len(kwargs["input_ids"])
            return {
                "prompt_tokens": kwargs["input_ids"],
                "prompt_topk_token_ids": [[1]] * (n - 1),
                "prompt_topk_logprobs": [[-0.5]] * (n - 1),
            }

    teacher, drops = Teacher(teacher_config("http://x/v1"), Misaligned()), Counter[str]()  # type: ignore[arg-type]
    assert asyncio.run(teacher.annotate([group([20, 30, 40])], drops)) == []
    assert drops == Counter({BAD_ANSWER: 1})


def test_process_with_a_teacher_writes_groups_with_teacher_logprobs(tmp_path):
    out = tmp_path / "addition.jsonl"
    with FakeInferenceServer() as teacher:
        argv = ["process", "--testing", "--env.use_wandb", "false", "--env.group_size", "2"]
        argv += ["--env.data_path_to_save_groups", str(out), "--env.total_steps", "3"]
        argv += ["--teacher.base_url", teacher.base_url, "--teacher.model_name", "atropos-tiny"]
        argv += ["--teacher.top_k", "2"]
        assert main(Addition, argv) == 0
        groups = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(groups) == 3
        for g in groups:
            for seq, ids, lps in zip(
                g["tokens"], g["distill_token_ids"], g["distill_logprobs"], strict=True
            ):
                expected = [top(p, 2) for p in prompt_logprobs(teacher.base_url, seq, 2)]
                assert ids == [e[0] for e in expected]
                assert flat(lps) == pytest.approx(flat([e[1] for e in expected]))


def test_a_teacher_that_always_fails_drops_every_group_and_sends_none(tmp_path):
    out = tmp_path / "synth.jsonl"
    with FakeInferenceServer() as teacher:
        teacher.fail_next(10**6, 500, paths=["/v1/completions"])
        cfg = resolved("process", total_steps=3, data_path_to_save_groups=str(out))
        cfg.env.teacher = teacher_config(teacher.base_url)
        cfg.env.max_num_workers = 1
        cfg.manager = FAST
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        runner = ProcessRunner(env, cfg)
        runner.barren_limit = 3
        assert asyncio.run(runner.run(show_progress=False)) == 1
    assert runner.drops[FAILED] >= 3 and not out.exists()
    metrics = json.loads(out.with_suffix(".metrics.json").read_text())
    assert metrics["groups"] == 0 and metrics["dropped"][FAILED] >= 3


def test_a_teacher_that_does_not_serve_the_model_stops_the_run(tmp_path, caplog):
    out = tmp_path / "synth.jsonl"
    with FakeInferenceServer() as teacher:
        teacher.fail_next(10**6, 404, paths=["/v1/completions"])  # as vLLM: no such model
        cfg = resolved("process", total_steps=3, data_path_to_save_groups=str(out))
        cfg.env.teacher = teacher_config(teacher.base_url)
        cfg.manager = FAST
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        runner = ProcessRunner(env, cfg)
        assert asyncio.run(runner.run(show_progress=False)) == 1
    assert "teacher: HTTP 404" in caplog.text and "--teacher.model_name" in caplog.text
    assert not out.exists()


def test_serve_sends_groups_with_teacher_logprobs(tmp_path):
    registration = {
        "wandb_group": "g", "wandb_project": "p", "batch_size": 8, "max_token_len": 64,
        "checkpoint_dir": "", "save_checkpoint_interval": 0, "starting_step": 0,
        "num_steps": 1000,
    }  # fmt: skip
    with serve_in_thread(create_app(ApiConfig())) as url, FakeInferenceServer() as teacher:
        with httpx.Client(base_url=url) as c:
            c.post("/register", json=registration)
            c.get("/batch")  # started, but nothing drains the queue
        cfg = resolved(rollout_server_url=url, register_timeout=30)
        cfg.env.teacher = teacher_config(teacher.base_url)
        env = SynthEnv(cfg.env, cfg.servers, manager=cfg.manager)
        runner = ServeRunner(env, cfg, tmp_path)
        runner.status_interval = 0.05

        async def main() -> int:
            task = asyncio.create_task(runner.run())
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and queued(url) < 4:
                await asyncio.sleep(0.05)
            runner.stopping.set()  # the run ends (as when the trainer is done)
            return await task

        assert asyncio.run(main()) == 0
        batch = httpx.get(f"{url}/batch").json()["batch"]
    assert batch and teacher.requests["/v1/completions"] >= 2 * len(batch)
    for g in batch:
        for seq, ids, lps in zip(
            g["tokens"], g["distill_token_ids"], g["distill_logprobs"], strict=True
        ):
            assert len(ids) == len(lps) == len(seq) and ids[0] == []
            assert all(len(top) == 3 for top in ids[1:])


def queued(url: str) -> int:
    return int(httpx.get(f"{url}/status").json()["queue_size"])
