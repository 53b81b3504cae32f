"""`make demo` / `atropos demo`: a tiny model learning by RL on a laptop, no GPU, no downloads.

`run.py` starts the trajectory API, the local inference server, the demo environment and the
trainer as separate processes and writes a report (`report.py`); `smoke.py` is the quick API-only
run (`atropos demo --smoke`).
"""

from atropos.demo.procs import Service, ServiceError, wait_until_up

__all__ = ["Service", "ServiceError", "wait_until_up"]
