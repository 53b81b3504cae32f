"""`MetricsSink`: one JSON line per record in a local file, and the same record to W&B.

A record is `{"step": N, "time": unix seconds, "source": "env:NAME" | "trainer", ...metrics}`.
The file is opened in append mode (a restarted run continues it; `step` and `time` tell the
runs apart), its directory is created, and every record is flushed as it is written, so a
killed process keeps what it logged.

JSON has no NaN or infinity: a non-finite float is written as `null` (a missing value to
pandas and jq, where a string would break arithmetic). Numpy and torch scalars become plain
numbers, nested dicts and lists are kept, anything else is written as its `str()`. W&B gets
the metrics as given (it records NaN itself).

>>> import json, tempfile
>>> path = Path(tempfile.mkdtemp()) / "deep" / "metrics.jsonl"
>>> with MetricsSink(path, "trainer") as sink:
...     _ = sink.log({"loss": 0.5, "kl": float("nan"), "grad": float("inf")}, step=1)
>>> record = json.loads(path.read_text())
>>> record["step"], record["source"], record["loss"], record["kl"], record["grad"]
(1, 'trainer', 0.5, None, None)
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atropos.metrics.wandb_run import WandbRun

log = logging.getLogger("atropos.metrics")

RESERVED = ("step", "time", "source")
"""Keys every record has; a metric of the same name is replaced by the record's own."""


def clean(value: Any) -> Any:
    """`value` as data `json.dumps` writes as standard JSON (non-finite floats: None).

    >>> clean(float("nan")), clean(-float("inf")), clean(2.5), clean(True), clean("x")
    (None, None, 2.5, True, 'x')
    >>> clean({"a": [1, float("nan")], 2: (3,)})
    {'a': [1, None], '2': [3]}
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    item = getattr(value, "item", None)  # numpy and torch scalars
    if callable(item):
        try:
            return clean(item())
        except (TypeError, ValueError, RuntimeError):  # an array of several values
            pass
    return str(value)


class MetricsSink:
    """Writes metric records to `path` (None: no file) and, when given, to a W&B run.

    `log()` never raises on a write or W&B failure (metrics must not stop training); the first
    failure of each kind is logged. After `close()`, `log()` does nothing.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None, source: str, wandb: WandbRun | None = None
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.source = source
        self.wandb = wandb
        self.records = 0
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._warned: set[str] = set()
        self._closed = False
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # closed by close()

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> dict[str, Any]:
        """Write one record of `metrics` at `step`; returns the record as written to the file."""
        record: dict[str, Any] = {"step": step, "time": time.time(), "source": self.source}
        for key, value in metrics.items():
            if key not in RESERVED:
                record[str(key)] = clean(value)
        with self._lock:
            if self._closed:
                return record
            if self._file is not None:
                try:
                    self._file.write(json.dumps(record, allow_nan=False) + "\n")
                    self._file.flush()
                except (OSError, ValueError) as err:
                    self._warn_once("file", "metrics: writing %s failed: %s", self.path, err)
            if self.wandb is not None:
                try:
                    self.wandb.log({k: v for k, v in metrics.items() if k not in RESERVED}, step)
                except Exception as err:  # W&B trouble never stops the run
                    self._warn_once("wandb", "metrics: W&B log failed: %s", err)
            self.records += 1
        return record

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, *args)

    def close(self) -> None:
        """Close the file and finish the W&B run (once; later calls do nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._file is not None:
                self._file.close()
            if self.wandb is not None:
                try:
                    self.wandb.close()
                except Exception as err:
                    log.warning("metrics: finishing the W&B run failed: %s", err)

    def __enter__(self) -> MetricsSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
