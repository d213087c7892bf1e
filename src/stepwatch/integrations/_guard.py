"""The guard every integration puts around its callback bodies: a reporting failure never stops training.

A framework calls an integration's callbacks inside the training loop. If one of them raises, the
framework usually lets the exception end the training (transformers' ``CallbackHandler.call_event``
does). :func:`guarded` catches ``Exception`` (never ``KeyboardInterrupt`` or ``SystemExit``), logs it
once per ``(integration, event)`` on the ``stepwatch`` logger with its traceback, and returns a
fallback instead::

    from stepwatch.integrations._guard import guarded

    class StepwatchCallback(TrainerCallback):
        @guarded
        def on_step_end(self, args, state, control, **kwargs):
            ...

        @guarded(fallback=False)
        def wants_stop(self) -> bool:
            ...

The integration's name is the last part of the function's module (``transformers`` for
``stepwatch.integrations.transformers``), the event its qualified name; both can be given.
Standard library only, and cheap: the wrapper costs one ``try`` per call.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

__all__ = ["guarded", "report_failure"]

P = ParamSpec("P")
R = TypeVar("R")

_log = logging.getLogger("stepwatch")
_reported: set[tuple[str, str]] = set()


def report_failure(integration: str, event: str, exc: BaseException) -> None:
    """Log ``exc`` once per ``(integration, event)``: a warning with the traceback, later ones at debug."""
    try:
        key = (integration, event)
        if key in _reported:
            _log.debug("stepwatch: %s %s failed again: %r", integration, event, exc)
            return
        _reported.add(key)
        _log.warning(
            "stepwatch: the %s integration failed in %s (%r); reporting may be incomplete, training goes on",
            integration,
            event,
            exc,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
    except Exception:  # logging itself must not end the training either
        pass


@overload
def guarded(fn: Callable[P, R], /) -> Callable[P, R | None]: ...


@overload
def guarded(
    *, integration: str | None = None, event: str | None = None
) -> Callable[[Callable[P, R]], Callable[P, R | None]]: ...


@overload
def guarded(
    *, fallback: R, integration: str | None = None, event: str | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def guarded(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    fallback: Any = None,
    integration: str | None = None,
    event: str | None = None,
) -> Any:
    """Wrap ``fn`` so that an ``Exception`` it raises is logged once and ``fallback`` returned.

    Use it bare (``@guarded``, fallback ``None``) or with arguments (``@guarded(fallback=False)``).
    """

    def decorate(func: Callable[P, R]) -> Callable[P, Any]:
        name = integration or func.__module__.rpartition(".")[2]
        where = event or func.__qualname__

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            try:
                return func(*args, **kwargs)
            except Exception as exc:
                report_failure(name, where, exc)
                return fallback

        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate
