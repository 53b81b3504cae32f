"""An env's rollouts by outcome (`envs.outcome`), sent with `/status-env`: kept per env as its
failures are (the latest replaces the last, a restart banks it), shown in `/stats` and as
`atropos_env_outcomes_total{env, outcome, reason}` in `/metrics`; bad counts refused."""

from __future__ import annotations

from .test_env_reports import ENV, env


def test_outcomes_are_kept_per_env_and_shown_in_stats_and_metrics(client):
    a, b = env(client, "a"), env(client, "b")
    first = {"scored": 40, "failed/judge_timeout": 8, "truncated/turns": 3}
    assert client.post("/status-env", json={"env_id": a, "outcomes": first}).status_code == 200
    later = {**first, "scored": 56, "invalid/no_answer": 2}  # cumulative: replaces the last
    client.post("/status-env", json={"env_id": a, "outcomes": later, "dropped": {"x": 1}})
    client.post("/status-env", json={"env_id": b, "dropped": {"y": 1}})  # no outcomes: none
    stats = client.get("/stats").json()
    assert stats["envs"][str(a)]["env_outcomes"] == later
    assert stats["envs"][str(b)]["env_outcomes"] == {}
    assert stats["env_outcomes"] == later
    text = client.get("/metrics").text
    assert "# TYPE atropos_env_outcomes_total counter" in text
    for labels, n in (
        ('outcome="scored",reason=""', 56),
        ('outcome="failed",reason="judge_timeout"', 8),
        ('outcome="truncated",reason="turns"', 3),
        ('outcome="invalid",reason="no_answer"', 2),
    ):
        assert f'atropos_env_outcomes_total{{env="{a}",{labels}}} {n}' in text


def test_outcomes_outlive_a_restart_and_bad_counts_are_refused(client):
    a = env(client)
    client.post("/status-env", json={"env_id": a, "outcomes": {"scored": 9}})
    client.post("/register-env", json={**ENV, "env_key": "k"})  # unrelated env: no effect
    client.post("/status-env", json={"env_id": a, "outcomes": {"scored": 2}})  # restarted
    assert client.get("/stats").json()["envs"][str(a)]["env_outcomes"] == {"scored": 11}
    bad = client.post("/status-env", json={"env_id": a, "outcomes": {"scored": -1}})
    assert bad.status_code == 422 and "$.outcomes" in bad.json()["detail"]
    assert client.get("/stats").json()["envs"][str(a)]["env_outcomes"] == {"scored": 11}
