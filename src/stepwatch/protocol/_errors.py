"""The protocol's error, and how its messages name the field at fault and show the value."""

from __future__ import annotations

__all__ = ["BodyTooLarge", "ProtocolError"]


class ProtocolError(ValueError):
    """A message does not follow the wire format; ``field`` is the JSON path of the first problem."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class BodyTooLarge(ProtocolError):
    """The body is larger than :attr:`Limits.max_body_bytes`."""


class _prefix:
    """Prefix the field of a ProtocolError raised inside the block with ``prefix.``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, ProtocolError) and self.prefix:
            exc.field = f"{self.prefix}.{exc.field}" if exc.field else self.prefix
            exc.args = (f"{exc.field}: {exc.message}",)


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
