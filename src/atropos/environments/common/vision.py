"""Pictures in prompts and groups: Pillow on demand, base64 PNG, the text-only copy, `ImageEnv`.

A group carries its picture as base64 PNG text (no `data:` prefix) in `images`, one entry per
sequence; the prompt carries the same picture as an OpenAI `image_url` part holding a `data:`
URL. The trainer's tokens come from a text-only copy of the conversation (`text_only`), where
each picture is the literal `<image>`. `ImageEnv` is the `Env` that does this: it samples the
conversation, picture included, through the server's chat completions and retokenizes the
text-only copy (`visual_counting` and the multimodal family). Pillow is the `vision` extra,
imported by `require_pillow` when a picture is first drawn or converted, never at import.

>>> data_uri(png_base64(b"\\x89PNG"))
'data:image/png;base64,iVBORw=='
>>> text_only([{"role": "user", "content": [
...     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
...     {"type": "text", "text": "What time is it?"}]}])
[{'role': 'user', 'content': '<image>\\nWhat time is it?'}]
"""

from __future__ import annotations

import asyncio
import base64
import io
from abc import abstractmethod
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, ClassVar

from atropos.envs.base import ConfigT
from atropos.envs.simple import Env, Rollout
from atropos.envs.types import Item, Message, ScoredDataGroup
from atropos.install import install_hint

__all__ = [
    "IMAGE_PLACEHOLDER",
    "ImageEnv",
    "ImageUnavailable",
    "data_uri",
    "image_part",
    "png_base64",
    "require_pillow",
    "text_only",
    "to_png_base64",
]

IMAGE_PLACEHOLDER = "<image>"  # stands for a picture in the text the trainer tokenizes
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
            f"the vision environments draw and read pictures with Pillow: {install_hint('vision')}"
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


class ImageEnv(Env[ConfigT]):
    """An `Env` whose prompt holds the item's picture (`image_base64`, shown by `image_part`).

    Every server type gets the conversation, picture included, through its chat completions
    (the token-exact path renders the template locally and would drop the picture); the
    trainer's tokens are the text-only copy retokenized (`token_source: "retokenized"`), and the
    group's `images` holds the picture once per sequence. TRL's text-only `/generate/` is
    refused at setup, and Pillow is checked there. An item whose picture raises
    `ImageUnavailable` gives no group (`dropped/image_unavailable`).
    """

    requires: ClassVar[dict[str, str]] = {"PIL": "vision"}  # checked before a run

    @abstractmethod
    def image_base64(self, item: Item) -> str:
        """The item's picture as base64 PNG (may block: it is asked for off the event loop);
        ImageUnavailable when it cannot be had."""

    async def setup(self) -> None:
        require_pillow()  # fail now, naming the `vision` extra, not at the first prompt
        if self._server_type() == "trl":
            raise ValueError(
                f"{self.name} needs a chat-completions server that takes images (openai, vllm,"
                " sglang); TRL's /generate/ renders the prompt as text and would drop the image"
            )
        await super().setup()

    async def generate(
        self, messages: list[Message], n: int, split: str = "train", **sampling: Any
    ) -> list[Rollout]:
        """Sample `n` completions of `messages` (picture included) through the server's chat
        completions; the trainer's tokens are the text-only conversation, retokenized here."""
        from atropos.inference.base import PolicyVersions
        from atropos.inference.tokenize import tokenize_for_trainer

        params = {
            "max_tokens": self.max_tokens or self.config.max_token_length,
            "temperature": self.temperature,
            **sampling,
        }
        tokenizer = self.tokenizer
        with PolicyVersions() as seen:
            reply = await self.server.chat_completion(messages=messages, n=n, split=split, **params)
        prompt = text_only(messages)
        rollouts = []
        switches = self.server.template_plan(tokenizer).kwargs  # the env's reasoning switches
        for choice in reply.choices:
            text, reason = choice.message.content or "", str(choice.finish_reason or "")
            chat = [*prompt, {"role": "assistant", "content": text}]
            out = tokenize_for_trainer(
                tokenizer, chat, finish_reason=reason, template_kwargs=switches
            )
            rollouts.append(
                Rollout(text, out["tokens"], out["masks"], None, reason, "retokenized", seen.lowest)
            )
        return rollouts

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        try:  # drawn or downloaded off the event loop; `prompt` then finds it cached
            image = await asyncio.to_thread(self.image_base64, item)
        except ImageUnavailable:
            self.drop("image_unavailable")
            return None, []
        group, backlog = await super().collect_trajectories(item)
        if group is None:
            return None, backlog
        group["messages"] = [text_only(m) for m in group["messages"] or []]
        group["images"] = [image] * len(group["tokens"])  # one per sequence, like the tokens
        return group, backlog
