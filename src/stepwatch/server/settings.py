"""Server settings: each declared once (name, default, type, help, variable); read at start, never at import."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SERVER_SETTINGS", "ServerSettings", "default_data_dir"]


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the embedded database lives: ``$STEPWATCH_HOME``, else ``$XDG_DATA_HOME/stepwatch``."""
    env = os.environ if environ is None else environ
    if env.get("STEPWATCH_HOME"):
        return Path(env["STEPWATCH_HOME"])
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "stepwatch"


@dataclass(frozen=True)
class _Setting:
    name: str
    env: str
    default: Any
    parse: Callable[[str], Any]
    help: str


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"a port is 0..65535, got {value}")
    return value


SERVER_SETTINGS: tuple[_Setting, ...] = (
    _Setting("host", "STEPWATCH_SERVER_HOST", "127.0.0.1", str, "address to listen on (loopback by default)"),
    _Setting("port", "STEPWATCH_SERVER_PORT", 8642, _port, "port to listen on"),
    _Setting("db", "STEPWATCH_DB", None, str, "SQLite file (default: stepwatch.db in the data directory)"),
    _Setting(
        "database_url", "STEPWATCH_DATABASE_URL", None, str, "database URL (sqlite:///PATH; PostgreSQL comes later)"
    ),
)


@dataclass(frozen=True)
class ServerSettings:
    """The resolved settings of one server."""

    host: str = "127.0.0.1"
    port: int = 8642
    db: str | None = None
    database_url: str | None = None

    @classmethod
    def resolve(cls, arguments: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> ServerSettings:
        """Arguments, then environment variables, then defaults; ``ValueError`` names the culprit."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for setting in SERVER_SETTINGS:
            given = arguments.get(setting.name)
            if given is not None:
                values[setting.name] = given
            elif env.get(setting.env):
                try:
                    values[setting.name] = setting.parse(env[setting.env])
                except ValueError as exc:
                    raise ValueError(f"{setting.env}: {exc}") from None
            else:
                values[setting.name] = setting.default
        return cls(**values)

    def database_path(self, environ: Mapping[str, str] | None = None) -> str:
        """The SQLite file this server uses."""
        if self.database_url:
            if not self.database_url.startswith("sqlite:///"):
                raise ValueError(
                    f"unsupported database URL {self.database_url!r}: this server stores in SQLite "
                    "(sqlite:///PATH); PostgreSQL support is planned"
                )
            return self.database_url.removeprefix("sqlite:///") or ":memory:"
        if self.db:
            return self.db
        return str(default_data_dir(environ) / "stepwatch.db")
