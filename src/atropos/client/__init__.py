"""The public trainer client: any trainer's way onto Atropos batches (docs/client.md).

    from atropos.client import TrainerClient

    client = TrainerClient()                   # $ATROPOS_API_URL, as `atropos launch` sets it
    client.wait_ready()
    client.register(batch_size=64, max_token_len=2048, ...)   # wire.Registration's fields
    batch = client.next_batch(lease=600)
    t = batch.tensors(layout="packed")          # torch only now: input ids, targets, advantages
    ...                                         # the trainer's own step
    client.ack(batch.batch_id)
    client.publish(model, version=1)            # weights into $ATROPOS_SERVER_URLS, then told

- `api`: `TrainerClient`, `AsyncTrainerClient`, `Batch`, `ApiError`;
- `samples`: groups to one `Sample` per sequence, advantages worked out (no torch);
- `tensors`: samples to padded or packed torch tensors (imported when asked for);
- `publish`: `Publisher`, the weights into the inference servers, and `paused()`;
- `transfer`: the weight-transfer protocol (torch.distributed, imported when it joins).

Importing this package never imports torch. `atropos train` is built on it.
"""

from atropos.client.api import ApiError, AsyncTrainerClient, Batch, TrainerClient
from atropos.client.publish import SYNC_MODES, Publisher, SyncError
from atropos.client.samples import MissingTeacher, Sample, samples_from_groups

__all__ = [
    "SYNC_MODES",
    "ApiError",
    "AsyncTrainerClient",
    "Batch",
    "MissingTeacher",
    "Publisher",
    "Sample",
    "SyncError",
    "TrainerClient",
    "samples_from_groups",
]
