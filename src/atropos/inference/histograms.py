"""vLLM's time-to-first-token and queue-time histograms, served by our own servers.

`atropos local serve` (the bundled CPU server) and the fake test server
(`atropos.testing.FakeInferenceServer`) answer `GET /metrics` with these two Prometheus
histograms under vLLM's names and buckets (`vllm:time_to_first_token_seconds`,
`vllm:request_queue_time_seconds`; vLLM 0.32.0, `vllm/v1/metrics/buckets.py`), so an env reads
their TTFT the way it reads a real vLLM's (`atropos.inference.server_metrics`). Neither serves
vLLM's queue *gauges*: the CPU server batches whole requests, so requests wait during every
batch and a waiting gauge would read as congestion to adaptive concurrency all the time; its
in-flight cap follows latency instead.

>>> h = Histogram("vllm:time_to_first_token_seconds", (0.1, 1.0))
>>> h.observe(0.5)
>>> print(h.render(), end="")
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="atropos-tiny"} 0
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="atropos-tiny"} 1
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="atropos-tiny"} 1
vllm:time_to_first_token_seconds_sum{model_name="atropos-tiny"} 0.5
vllm:time_to_first_token_seconds_count{model_name="atropos-tiny"} 1
"""

from __future__ import annotations

import bisect

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
QUEUE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4"
"""The media type of Prometheus' text format."""


class Histogram:
    """One Prometheus histogram: per-bucket counts (not cumulative until rendered), sum, count.

    `observe` may run on another thread than `render` (the CPU server's generation thread):
    a render between a bucket's increment and the sum's sees them one observation apart, which
    the reader's deltas absorb at its next read."""

    def __init__(self, name: str, edges: tuple[float, ...], model: str = "atropos-tiny") -> None:
        self.name = name
        self.edges = edges
        self.counts = [0] * (len(edges) + 1)  # the last: above every edge (+Inf)
        self.sum = 0.0
        self.labels = f'model_name="{model}"'

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.edges, seconds)] += 1
        self.sum += seconds

    def render(self) -> str:
        """The histogram in Prometheus text format."""
        lines = [f"# TYPE {self.name} histogram"]
        seen = 0
        for edge, n in zip((*map(str, self.edges), "+Inf"), self.counts, strict=True):
            seen += n
            lines.append(f'{self.name}_bucket{{le="{edge}",{self.labels}}} {seen}')
        lines.append(f"{self.name}_sum{{{self.labels}}} {self.sum}")
        lines.append(f"{self.name}_count{{{self.labels}}} {seen}")
        return "\n".join(lines) + "\n"


class ServedHistograms:
    """A server's `/metrics` body: time to first token and queue time, vLLM's way."""

    def __init__(self, model: str) -> None:
        self.ttft = Histogram("vllm:time_to_first_token_seconds", TTFT_BUCKETS, model)
        self.queue = Histogram("vllm:request_queue_time_seconds", QUEUE_BUCKETS, model)

    def observe(self, ttft: float, queued: float) -> None:
        """One request's first token `ttft` seconds after it arrived, after `queued` s queued."""
        self.ttft.observe(ttft)
        self.queue.observe(queued)

    def render(self) -> str:
        return self.ttft.render() + self.queue.render()
