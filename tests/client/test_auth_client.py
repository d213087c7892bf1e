"""The SDK and the CLI against a real server with authentication on: the first admin token made in the
database, tokens made, listed and revoked through the API, ``--token`` and ``STEPWATCH_API_TOKEN`` sent
as ``Authorization: Bearer``, refusals as the SDK's errors and the CLI's messages, the audit log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from swtest import Server

from stepwatch.cli import main
from stepwatch.cli.token import parse_duration
from stepwatch.client import Client, Forbidden, Unauthorized


@pytest.fixture
def secured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[str, str]]:
    """A server with ``auth tokens`` and the secret of its first admin token, made in its database."""
    db = tmp_path / "secured.db"
    assert main(["token", "create", "--role", "admin", "-A", "--name", "root", "--db", str(db)]) == 0
    admin = capsys.readouterr().out.strip()
    srv = Server(db, auth="tokens").start()
    yield srv.url, admin
    srv.stop()


def _secret(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_the_first_admin_token_comes_from_the_database_and_opens_the_api(
    secured: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, admin = secured
    assert admin.startswith("swt_")
    with Client(url) as anonymous, pytest.raises(Unauthorized):
        anonymous.jobs()
    with Client(url, admin) as client:
        assert client.whoami()["grants"] == [{"role": "admin", "namespaces": ["*"]}]
        (root,) = client.tokens()
        assert root.name == "root" and root.created_by == "stepwatch token --db" and root.valid
        assert client.audit()[0].action == "token_created"


def test_the_cli_creates_lists_and_revokes_tokens_and_sends_them(
    secured: tuple[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, admin = secured
    with Client(url, admin) as client:
        client.register("one", "a")
    base = ["--server", url, "--token", admin]
    assert main(["token", "create", "--role", "viewer", "-n", "a", "--name", "dash", "--expires", "30d", *base]) == 0
    viewer = _secret(capsys)
    assert main(["token", "list", *base]) == 0
    table = capsys.readouterr().out
    assert "dash" in table and "viewer" in table and "valid" in table and viewer not in table

    assert main(["jobs", "-n", "a", "--server", url, "--token", viewer]) == 0
    assert "one" in capsys.readouterr().out
    assert main(["stop", "one", "-n", "a", "--server", url, "--token", viewer]) == 1
    assert "may not change namespace a" in capsys.readouterr().err
    monkeypatch.setenv("STEPWATCH_API_TOKEN", viewer)  # the environment's token, without --token
    assert main(["describe", "one", "-n", "a", "--server", url]) == 0
    capsys.readouterr()
    monkeypatch.delenv("STEPWATCH_API_TOKEN")

    with Client(url, viewer) as client:
        token_id = client.whoami()["token_id"]
    assert main(["token", "revoke", token_id, "--reason", "left the team", *base]) == 0
    capsys.readouterr()
    with Client(url, viewer) as client, pytest.raises(Unauthorized):
        client.jobs()
    assert main(["jobs", "-n", "a", "--server", url, "--token", viewer]) == 1
    with Client(url, admin) as client:
        revoked = client.audit()[-1]
        assert (revoked.action, revoked.reason) == ("token_revoked", "left the team")


def test_the_sdk_raises_forbidden_for_a_role_it_lacks_and_audits_what_it_did(secured: tuple[str, str]) -> None:
    url, admin = secured
    with Client(url, admin) as client:
        client.register("one", "a")
        _, editor = client.create_token("editor", ["a"], "ann")
        _, viewer = client.create_token("viewer", ["a"], "bob")
    with Client(url, viewer) as client, pytest.raises(Forbidden):
        client.stop("one", "a", reason="mine")
    with Client(url, editor) as client:
        client.checkpoint("one", "a", reason="before the review")
        (entry,) = client.audit("a", job="one")
        assert entry.action == "checkpoint" and entry.reason == "before the review" and "(ann)" in entry.actor
        with pytest.raises(Forbidden):
            client.tokens()


def test_durations() -> None:
    assert parse_duration("30d") == 30 * 86400 and parse_duration("12h") == 43200 and parse_duration("90") == 90
    for bad in ("", "0d", "-1d", "3 weeks", "1.5.2h"):
        with pytest.raises(ValueError):
            parse_duration(bad)
