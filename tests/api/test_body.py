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
        pytest.param(b"plain text", 400, id="plain"),
        pytest.param(gzip.compress(b"x" * 1000, mtime=0)[:-9], 400, id="truncated"),
        pytest.param(b"\x1f\x8b\x08\x00" + b"garbage" * 10, 400, id="garbage"),
        pytest.param(gzip.compress(b"x" * 10_000, mtime=0), 413, id="over-limit"),
        pytest.param(gzip.compress(b"x" * 100, mtime=0) + b"junk", 400, id="trailing-junk"),
    ],
)
def test_bad_or_oversize_gzip_is_a_clean_4xx(impl, data, status):
    with pytest.raises(ProtocolError) as err:
        body.inflate(data, 5000)
    assert err.value.status == status
