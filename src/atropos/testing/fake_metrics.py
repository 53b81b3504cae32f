"""The fake server's Prometheus histograms: vLLM's time to first token and queue time.

`FakeInferenceServer` serves `atropos.inference.histograms.ServedHistograms` on `GET /metrics`,
so a fake typed `vllm` shows TTFT the way a real one does (`atropos.inference.server_metrics`).
The fake answers whole: its "first token" is the whole answer (the time from a generation
request's arrival to its outputs, `latency` included), and it has no queue (every request
counts 0 s of queue time).
"""

from __future__ import annotations

from atropos.inference.histograms import ServedHistograms


class FakeMetrics(ServedHistograms):
    """The fake server's `/metrics`: its whole answer's time as the TTFT, no queue."""

    def answered(self, seconds: float) -> None:
        """One generation request answered `seconds` after it arrived."""
        self.observe(seconds, 0.0)
