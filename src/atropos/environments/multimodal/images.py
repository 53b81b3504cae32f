"""Pictures downloaded for the multimodal environments: `fetch_url`, bounded and checked.

The rest of what the family does with pictures (Pillow on demand, base64 PNG, hub images, the
text-only copy the trainer tokenizes) is shared with `visual_counting` in
`atropos.environments.common.vision`.
"""

from __future__ import annotations

import hashlib
import urllib.request

from atropos.environments.common.vision import ImageUnavailable

__all__ = ["fetch_url"]

FETCH_TIMEOUT = 20.0  # seconds for one image download
MAX_IMAGE_BYTES = 20 * 2**20


def fetch_url(url: str, sha256: str | None = None, timeout: float = FETCH_TIMEOUT) -> bytes:
    """The bytes at `url` (at most 20 MiB), checked against `sha256` when given.

    Raises:
        ImageUnavailable: the download failed or timed out, was too large, or its hash differs
            (pixmo's web images move and change; such an item is skipped, never replaced).
    """
    if not url.startswith(("http://", "https://")):
        raise ImageUnavailable(f"not an http(s) image URL: {url!r}")
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "atropos-rl"})
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            body: bytes = reply.read(MAX_IMAGE_BYTES + 1)
    except Exception as e:  # urllib raises URLError, HTTPError, TimeoutError, OSError ...
        raise ImageUnavailable(f"could not download {url}: {e}") from e
    if len(body) > MAX_IMAGE_BYTES:
        raise ImageUnavailable(f"{url}: larger than {MAX_IMAGE_BYTES} bytes")
    if sha256 and hashlib.sha256(body).hexdigest() != sha256.lower():
        raise ImageUnavailable(f"{url}: its sha256 is not the dataset's (the image changed)")
    return body
