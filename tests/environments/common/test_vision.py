"""`common.vision`: pictures as base64 PNG, the text-only copy, Pillow named when missing.

`ImageEnv` itself (sampling with the picture, groups carrying it) is tested through the envs
built on it: tests/environments/test_visual_counting.py and test_multimodal.py.
"""

from __future__ import annotations

import base64
import io
import re
import sys

import pytest

pytest.importorskip("PIL", reason="needs Pillow (the vision extra)")
from PIL import Image  # noqa: E402

from atropos.environments.common.vision import (  # noqa: E402
    IMAGE_PLACEHOLDER,
    image_part,
    png_base64,
    require_pillow,
    text_only,
    to_png_base64,
)
from atropos.install import install_hint

from ..helpers import decode_png  # noqa: E402


def png_of(colour: tuple[int, int, int], fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 6), colour).save(out, format=fmt)
    return out.getvalue()


def test_images_of_every_form_become_base64_pngs():
    png = png_of((1, 2, 3))
    b64 = base64.b64encode(png).decode()
    assert to_png_base64(png) == b64 == png_base64(png)  # PNG bytes are kept as they are
    assert to_png_base64(b64) == b64 and to_png_base64("data:image/png;base64," + b64) == b64
    assert to_png_base64({"bytes": png, "path": None}) == b64
    assert png_base64(Image.open(io.BytesIO(png))) == to_png_base64(Image.open(io.BytesIO(png)))
    jpeg = png_of((200, 10, 10), "JPEG")
    for value in (jpeg, {"bytes": jpeg}, Image.open(io.BytesIO(jpeg)), Image.new("CMYK", (4, 4))):
        image = decode_png(to_png_base64(value))  # re-encoded as PNG
        assert image.format == "PNG" and image.size in ((8, 6), (4, 4))
    with pytest.raises(TypeError, match="int"):
        to_png_base64(7)
    with pytest.raises(ValueError, match="bytes"):
        to_png_base64({"path": None})


def test_the_prompt_part_is_a_data_url():
    assert image_part("AAAA") == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA"},
    }


def test_the_text_only_copy_flattens_content_lists_and_keeps_the_original():
    messages = [
        {"role": "system", "content": "S"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "How many?"},
            ],
        },
    ]
    assert text_only(messages) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": f"{IMAGE_PLACEHOLDER}\nHow many?"},
    ]
    assert isinstance(messages[1]["content"], list)  # the original is left alone


def test_missing_pillow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=re.escape(install_hint("vision"))):
        require_pillow()
