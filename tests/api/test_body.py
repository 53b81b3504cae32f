"""Bounded gunzip with ISA-L and with the standard library fallback."""

from __future__ import annotations

import gzip
import zlib

import pytest
from isal import isal_zlib

from atropos.http import body
from atropos.wire import ProtocolError


@pytest.fixture(params=["isal", "stdlib"])
def impl(request, monkeypatch):
    monkeypatch.setattr(body, "_zlib", isal_zlib if request.param == "isal" else zlib)
    return request.param


def test_round_trip_and_concatenated_members(impl):
    data = gzip.compress(b"a" * 5000) + gzip.compress(b"b" * 10)
    assert body.inflate(data, 5010) == b"a" * 5000 + b"b" * 10


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"plain text", 400),
        (gzip.compress(b"x" * 1000)[:-9], 400),  # truncated
        (b"\x1f\x8b\x08\x00" + b"garbage" * 10, 400),
        (gzip.compress(b"x" * 10_000), 413),  # over the limit below
        (gzip.compress(b"x" * 100) + b"junk", 400),  # trailing garbage after a member
    ],
)
def test_bad_or_oversize_gzip_is_a_clean_4xx(impl, data, status):
    with pytest.raises(ProtocolError) as err:
        body.inflate(data, 5000)
    assert err.value.status == status
