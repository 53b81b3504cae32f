"""mini-SWE-agent 2.4.6 (the real one, from its cached venv) in bubblewrap sandboxes against
the proxy: its bash tool calls edit the file, the task's test scores the group, the trained
tokens are the server's, a wrong edit scores lower, the turn limit ends a run that is still
scored, and a run that never reaches the model or hangs is a failed rollout.

Cost: 4 tests, one group of two rollouts each; mini-SWE-agent imports litellm (about 3 s of
CPU per run), so about 10-20 s a test on this machine. The venv is made once (about 40 s,
`make harnesses`)."""

from __future__ import annotations

from .helpers import Script, collect, make_env, tool_call, trained_tokens

EDIT = tool_call("bash", command="sed -i 's/a - b/a + b/' calc.py")
WRONG = tool_call("bash", command="sed -i 's/a - b/a * b/' calc.py")
SUBMIT = tool_call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


def test_mini_swe_agent_edits_and_the_tasks_test_scores_it(script_server, calc_tasks):
    server = script_server(Script([EDIT, SUBMIT], first=[EDIT, WRONG]))
    env = make_env(server, calc_tasks, harness="mini-swe-agent")
    group, exits = collect(env)
    assert exits == ["ok", "ok"], env.failures
    assert sorted(group["scores"]) == [0.0, 1.0]  # the wrong edit scores lower
    assert trained_tokens(group) == server.tokens_generated
    assert len(group["tokens"]) == 2  # one conversation per rollout: no break


def test_the_turn_limit_ends_the_run_which_is_still_scored(script_server, calc_tasks):
    looping = tool_call("bash", command="ls")
    server = script_server(Script([looping]))  # never submits
    env = make_env(server, calc_tasks, harness="mini-swe-agent", max_agent_turns=2)
    group, exits = collect(env)
    assert exits == ["limit", "limit"] and group["scores"] == [0.0, 0.0]
    assert {o["outcome"] for o in group["overrides"]} == {"truncated/turns"}  # as it stands
    assert server.requests["/generate"] + server.requests["/v1/completions"] <= 4


def test_a_run_that_never_reaches_the_model_is_failed(script_server, calc_tasks):
    server = script_server(Script([SUBMIT]))
    server.fail_next(8, 400, ["/generate", "/v1/completions"])  # no call answered
    env = make_env(server, calc_tasks, harness="mini-swe-agent")
    group, exits = collect(env)
    assert group is None and set(exits) <= {"exit_nonzero", "no_model_call"}
    assert sum(env.failures.values()) == 2


def test_a_hanging_command_is_a_failed_rollout_not_a_score(script_server, calc_tasks):
    hang = tool_call("bash", command="sleep 300")  # past the rollout's wall time
    server = script_server(Script([hang]))
    env = make_env(server, calc_tasks, harness="mini-swe-agent", agent_timeout=20.0)
    group, exits = collect(env)
    assert group is None and exits == ["timeout", "timeout"]  # never scored 0
    assert env.failures == {"timeout": 2}
