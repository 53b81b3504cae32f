"""The committed trainer-contract schema is the one `atropos.wire` generates, so it never goes
stale; it describes every contract body and validates real ones."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from atropos import wire

ROOT = Path(__file__).resolve().parent.parent


def test_committed_schema_equals_the_generated_one() -> None:
    committed = (ROOT / wire.SCHEMA_PATH).read_text(encoding="utf-8")
    assert committed == wire.schema_text(), (
        f"{wire.SCHEMA_PATH} is stale: run `python -m atropos.wire --schema {wire.SCHEMA_PATH}`"
    )


def test_schema_names_every_contract_body_and_the_version() -> None:
    schema = json.loads(wire.schema_text())
    assert schema["x-contract-version"] == wire.CONTRACT_VERSION
    assert {t.__name__ for t in wire.CONTRACT_TYPES} <= set(schema["$defs"])
    registration = schema["$defs"]["Registration"]
    assert registration["properties"]["batch_size"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": wire.SIZE_MAX,
    }
    assert "doctest" not in json.dumps(schema) and ">>>" not in json.dumps(schema)


def test_check_entry_point_finds_a_stale_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "schema.json"
    assert wire.main(["--schema", str(path)]) == 0
    assert wire.main(["--check", str(path)]) == 0
    path.write_text("{}\n", encoding="utf-8")
    assert wire.main(["--check", str(path)]) == 1
    assert "stale" in capsys.readouterr().out


def test_contract_version_is_major_dot_minor() -> None:
    major, minor = wire.CONTRACT_VERSION.split(".")
    assert major.isdigit() and minor.isdigit()


def test_bodies_round_trip_through_their_structs() -> None:
    """Each type in the schema is what the API decodes: an example body decodes as it."""
    reg = msgspec.json.encode(
        {
            "wandb_group": "g",
            "wandb_project": "p",
            "batch_size": 8,
            "max_token_len": 2048,
            "checkpoint_dir": "ckpt",
            "save_checkpoint_interval": 10,
            "starting_step": 0,
            "num_steps": 100,
        }
    )
    assert wire.decode(reg, wire.Registration).batch_size == 8
    assert wire.decode(b'{"version": 3}', wire.PolicyPublished).version == 3


def test_the_api_names_the_contract_version_on_every_route() -> None:
    """A header (old clients ignore it), on `/health` as on errors; `/health`'s body stays
    upstream-compatible `{"status": "ok"}`."""
    from starlette.testclient import TestClient

    from atropos.api import create_app

    with TestClient(create_app(), base_url="http://127.0.0.1") as client:
        health = client.get("/health")
        assert health.json() == {"status": "ok"}
        refused = client.post("/batch/ack", json={})
        assert refused.status_code == 422
        for answer in (health, refused, client.get("/batch")):
            assert answer.headers[wire.CONTRACT_HEADER] == wire.CONTRACT_VERSION
