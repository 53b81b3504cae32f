"""What a verifiers episode is worth: its reward, its named signals, its failure.

An episode (`verifiers.v1.Episode`) holds one trace per agent run. Its reward is the mean of
`Trace.reward` (the task's reward functions and judges, weighted: verifiers' own sum) over the
traces of trainable agents (all of them when none is marked); with one agent, that trace's
reward. The signals are each reward function's unweighted score and each metric, averaged over
the same traces, as `reward/<name>` and `metric/<name>`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["episode_error", "episode_reward", "episode_signals"]


def _scored(episode: Any) -> list[Any]:
    traces = list(episode.traces)
    trainable = [t for t in traces if getattr(t.agent, "trainable", True)]
    return trainable or traces


def episode_reward(episode: Any) -> float:
    """The episode's reward: the mean `Trace.reward` of its trainable agents' traces."""
    traces = _scored(episode)
    return sum(float(t.reward) for t in traces) / len(traces) if traces else 0.0


def episode_signals(episode: Any) -> tuple[dict[str, float], dict[str, float]]:
    """(rewards, metrics): each reward function's score and each metric, averaged over the
    scored traces; a signal that did not run (None) is left out."""
    rewards: dict[str, list[float]] = {}
    metrics: dict[str, list[float]] = {}
    for trace in _scored(episode):
        for name, reward in trace.rewards.items():
            if reward is not None:
                rewards.setdefault(f"reward/{name}", []).append(float(reward.score))
        for name, value in trace.metrics.items():
            if value is not None:
                metrics.setdefault(f"metric/{name}", []).append(float(value))
    return _means(rewards), _means(metrics)


def _means(values: dict[str, list[float]]) -> dict[str, float]:
    return {key: sum(v) / len(v) for key, v in values.items()}


def episode_error(episode: Any) -> str | None:
    """Why the episode failed, in one line (None when it did not)."""
    if episode.ok:
        return None
    errors = list(episode.errors) + [e for t in episode.traces for e in t.errors]
    if not errors:
        return "the verifiers episode did not complete"
    last = errors[-1]
    return f"verifiers: {last.type}: {last.message}".splitlines()[0][:500]
