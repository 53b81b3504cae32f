"""Images for the multimodal environments: Pillow on demand, PNG as base64, hub images, URLs.

A group carries its picture as base64 PNG text (no `data:` prefix) in `images`; the prompt
carries the same picture as an OpenAI `image_url` part holding a `data:` URL. The trainer's
tokens come from a text-only copy of the conversation (`text_only`), where each picture is the
literal `<image>`. Pillow is the `vision` extra, imported by `require_pillow` when a picture is
first drawn or converted, never at import.

>>> data_uri("iVBORw==")
'data:image/png;base64,iVBORw=='
>>> text_only([{"role": "user", "content": [
...     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
...     {"type": "text", "text": "What time is it?"}]}])
[{'role': 'user', 'content': '<image>\\nWhat time is it?'}]
"""

from __future__ import annotations

import base64
import hashlib
import io
import urllib.request
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from atropos.envs.types import Message

__all__ = [
    "IMAGE_PLACEHOLDER",
    "ImageUnavailable",
    "data_uri",
    "fetch_url",
    "image_part",
    "png_base64",
    "require_pillow",
    "text_only",
    "to_png_base64",
]

IMAGE_PLACEHOLDER = "<image>"  # stands for a picture in the text the trainer tokenizes
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FETCH_TIMEOUT = 20.0  # seconds for one image download
MAX_IMAGE_BYTES = 20 * 2**20


class ImageUnavailable(RuntimeError):
    """An item's picture could not be had (a download failed, or its bytes are not an image):
    the item gives no group and the runner counts it as `dropped/image_unavailable`."""


def require_pillow() -> SimpleNamespace:
    """Pillow's `Image`, `ImageDraw` and `ImageFont` modules (as attributes of one namespace),
    or an ImportError that names the `vision` extra."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise ImportError(
            "the multimodal environments draw and read pictures with Pillow:"
            " pip install 'atropos-rl[vision]' (or pip install pillow)"
        ) from None
    return SimpleNamespace(Image=Image, ImageDraw=ImageDraw, ImageFont=ImageFont)


def png_base64(image: Any) -> str:
    """A PIL image, or PNG bytes, as base64 PNG text (what a group's `images` holds)."""
    if not isinstance(image, bytes | bytearray):
        out = io.BytesIO()
        image.save(out, format="PNG")
        image = out.getvalue()
    return base64.b64encode(bytes(image)).decode("ascii")


def data_uri(b64: str) -> str:
    """Base64 PNG text as a `data:` URL, for an OpenAI `image_url` part."""
    return f"data:image/png;base64,{b64}"


def image_part(b64: str) -> dict[str, Any]:
    """The OpenAI chat content part that shows the picture `b64` (base64 PNG)."""
    return {"type": "image_url", "image_url": {"url": data_uri(b64)}}


def _raw_bytes(value: Any) -> Any:
    """Bytes for a base64 / `data:` text or a `datasets` image dict; anything else as given."""
    if isinstance(value, str):
        text = value.split(",", 1)[1] if value.startswith("data:") else value
        return base64.b64decode(text, validate=True)
    if isinstance(value, Mapping):
        if value.get("bytes"):
            return bytes(value["bytes"])
        if value.get("path"):
            with open(value["path"], "rb") as f:
                return f.read()
        raise ValueError("an image dict needs 'bytes' or 'path'")
    return value


def to_png_base64(value: Any) -> str:
    """A hub image as base64 PNG: a PIL image, image bytes, a `datasets` image dict (`bytes`
    or `path`), or base64 text / a `data:` URL. PNG bytes are kept; anything else is re-encoded
    (in RGB when its mode has no PNG form, e.g. CMYK)."""
    value = _raw_bytes(value)
    if isinstance(value, bytes | bytearray):
        if bytes(value[:8]) == PNG_MAGIC:
            return png_base64(value)
        value = require_pillow().Image.open(io.BytesIO(bytes(value)))
    if not hasattr(value, "save"):
        raise TypeError(f"cannot read an image from {type(value).__name__}")
    if getattr(value, "mode", "RGB") not in ("1", "L", "LA", "P", "RGB", "RGBA"):
        value = value.convert("RGB")
    return png_base64(value)


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


def text_only(messages: list[Message]) -> list[Message]:
    """The conversation with each content list flattened to text, each picture `<image>` on its
    own line; the messages given are left as they are."""
    flat: list[Message] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            lines = [
                part["text"] if part.get("type") == "text" else IMAGE_PLACEHOLDER
                for part in content
                if isinstance(part, Mapping)
            ]
            message = {**message, "content": "\n".join(lines)}
        flat.append(message)
    return flat
