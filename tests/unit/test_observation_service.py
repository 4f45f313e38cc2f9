"""Clients of the observation service: kept while used, dropped (and closed) once no tuning asks for them."""

from __future__ import annotations

from pathlib import Path

from vllm_autotuner.observe.client import Connection, _ca_file
from vllm_autotuner.observe.service import ObservationService


class Recorded:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_client_no_tuning_asked_for_in_a_tick_is_closed_and_dropped() -> None:
    service = ObservationService(Recorded)  # type: ignore[arg-type]
    old, rotated, other = (Connection(url=u, bearer_token=t) for u, t in
                           (("http://p:9090", "token-1"), ("http://p:9090", "token-2"), ("http://q:9090", None)))
    first, kept = service.client(old), service.client(other)
    service.forget()
    assert not first.closed and service.client(old) is first  # used in the tick before: kept
    service.forget()
    assert service.client(rotated) is not first and service.client(other) is not kept
    service.forget()
    assert first.closed and kept.closed  # neither was asked for in the last tick


def test_a_ca_bundle_is_written_once_whatever_the_clients(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    path = _ca_file(pem)
    assert _ca_file(pem) == path and Path(path).read_text() == pem
    assert _ca_file(pem.replace("MIIB", "MIIC")) != path
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".pem", ".pem"]  # no partial files left
