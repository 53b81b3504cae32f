"""`POST /eval_results`: an env's evaluation of one policy version, kept per env (the last 100)
and shown in `/stats` and `/metrics`; a bad body or an unknown env refused, naming the rule."""

from __future__ import annotations

import httpx

ENV = {"max_token_length": 2048, "desired_name": "env", "weight": 1.0, "group_size": 2}


def test_evals_are_kept_per_env_newest_last(client: httpx.Client) -> None:
    env_id = client.post("/register-env", json=ENV).json()["env_id"]
    for v in range(1, 103):
        body = {"env_id": env_id, "policy_version": v, "metrics": {"acc": v / 200}, "skipped": 3}
        assert client.post("/eval_results", json=body).status_code == 200
    evals = client.get("/stats").json()["envs"][str(env_id)]["evals"]
    assert (
        len(evals) == 100
        and evals[0]["policy_version"] == 3
        and evals[-1]["metrics"] == {"acc": 0.51}
    )
    text = client.get("/metrics").text
    assert f'atropos_env_eval_policy_version{{env="{env_id}"}} 102' in text
    assert f'atropos_env_eval{{env="{env_id}",metric="acc"}} 0.51' in text
    assert f'atropos_env_evals_skipped_total{{env="{env_id}"}} 3' in text


def test_a_bad_eval_is_refused_naming_the_field(client: httpx.Client) -> None:
    env_id = client.post("/register-env", json=ENV).json()["env_id"]
    bad = {"env_id": env_id, "policy_version": -1, "metrics": {}}
    got = client.post("/eval_results", json=bad)
    assert got.status_code == 422 and "policy_version" in got.text
    unknown = {"env_id": 7, "policy_version": 1, "metrics": {"acc": 1.0}}
    got = client.post("/eval_results", json=unknown)
    assert got.status_code == 404 and "env_id 7" in got.text
