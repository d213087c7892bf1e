"""Auto-instrumentation: frameworks imported after :func:`activate` get stepwatch's callback, no code change.

An import hook (a finder first on ``sys.meta_path``) watches for the modules in :data:`TRIGGERS`.
When one of them has been executed, it imports the integration by name
(``stepwatch.integrations.<name>``) and calls its ``install()``, which patches the framework so that
every trainer created afterwards carries the stepwatch callback. The finder wraps the loader of the
watched modules only; every other import passes through untouched, and the real loader is put back
on the module before it runs.

Two ways in, both inert unless the environment asks for reporting:

- ``stepwatch run`` puts ``_site/`` (a ``sitecustomize.py`` that chains to the one it shadows) on
  the child's ``PYTHONPATH``;
- the wheel ships ``stepwatch-autoinstrument.pth``, which calls :func:`activate` at interpreter start
  when ``STEPWATCH_URL``, ``KUBEFLOW_TRAINER_SERVER_URL`` or ``STEPWATCH_METRICS_PORT`` is set, or
  the process may be in a Kubeflow TrainJob's pod (its first test, on a few variables; :func:`enabled`
  decides), where rank 0 serves OpenShift AI's progression status with no endpoint at all.

``STEPWATCH_AUTOINSTRUMENT=0`` turns both off. Nothing here raises: a failure to install is logged
once at debug level on the ``stepwatch`` logger and the import goes on. This module imports only
``os`` and ``sys`` (both loaded at interpreter start), so that activating it costs next to nothing.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # not `from typing import ...`: typing alone would double the cost of this module
    from collections.abc import Mapping
    from typing import Any

__all__ = ["TRIGGERS", "activate", "active", "deactivate", "enabled"]

TRIGGERS: dict[str, str] = {
    # the module whose import triggers the install -> the integration (stepwatch.integrations.<name>)
    "transformers.trainer": "transformers",  # not `transformers`: `import transformers` stays lazy
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "keras": "keras",
    "tqdm": "tqdm",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
}
"""What the hook watches. Trainer-less imports of transformers (a tokenizer) install nothing."""

_OFF = ("0", "false", "no", "off")
_pending: dict[str, str] = {}
_installed: dict[str, bool] = {}
_seen: set[str] = set()
"""Triggers already handled (each calls its integration's idempotent install() once: a script that
imports both ``lightning`` and ``pytorch_lightning`` gets both namespaces patched)."""
_finder: _Finder | None = None


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for auto-instrumentation, and does not opt out.

    It asks with an endpoint (``STEPWATCH_URL``, ``KUBEFLOW_TRAINER_SERVER_URL``), with a progression
    port (``STEPWATCH_METRICS_PORT`` other than ``off``), or by being a Kubeflow TrainJob's pod
    (:func:`stepwatch._trainjob.trainjob_node`), unless ``STEPWATCH_METRICS_PORT`` is ``off`` there.
    """
    env = os.environ if environ is None else environ
    if env.get("STEPWATCH_AUTOINSTRUMENT", "").strip().lower() in _OFF:
        return False
    if env.get("STEPWATCH_DISABLED", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    if env.get("STEPWATCH_URL") or env.get("KUBEFLOW_TRAINER_SERVER_URL"):
        return True
    port = env.get("STEPWATCH_METRICS_PORT", "").strip().lower()
    if port:
        return port not in _OFF
    from .._trainjob import trainjob_node  # os only, like this module

    return trainjob_node(env) is not None


def active() -> bool:
    """Whether the hook is on ``sys.meta_path``."""
    return _finder is not None and _finder in sys.meta_path


def activate(environ: Mapping[str, str] | None = None, *, force: bool = False) -> bool:
    """Put the hook first on ``sys.meta_path`` when :func:`enabled` (or ``force``); never raises.

    Frameworks already imported are instrumented at once. Returns whether the hook is active.
    """
    global _finder
    try:
        if not force and not enabled(environ):
            return False
        if active():
            return True
        _pending.update({k: v for k, v in TRIGGERS.items() if k not in _seen})
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
        for trigger in list(_pending):
            if trigger in sys.modules:
                _imported(trigger)
        return True
    except Exception:
        return False


def deactivate() -> None:
    """Take the hook off ``sys.meta_path`` (what was installed stays installed)."""
    global _finder
    try:
        while _finder is not None and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
    except Exception:
        pass
    _finder = None
    _pending.clear()


class _Finder:
    """Finds nothing itself: for a watched module it asks the other finders, then wraps the loader."""

    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _pending or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in list(sys.meta_path):
                if finder is self or isinstance(finder, _Finder):
                    continue
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
        except Exception:
            return None  # let the import machinery look again, without us
        finally:
            self._busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        spec.loader = _Loader(loader, fullname)
        return spec

    def invalidate_caches(self) -> None:
        """Nothing cached here (``importlib.invalidate_caches`` calls every finder's)."""


class _Loader:
    """The real loader, with a call to the integration's ``install()`` after the module has run."""

    def __init__(self, loader: Any, trigger: str) -> None:
        self.loader = loader
        self.trigger = trigger

    def create_module(self, spec: Any) -> Any:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        try:  # the module sees its real loader, as if the hook were not there
            module.__loader__ = self.loader
            if getattr(module.__spec__, "loader", None) is self:
                module.__spec__.loader = self.loader
        except Exception:
            pass
        self.loader.exec_module(module)  # the framework's own errors propagate unchanged
        _imported(self.trigger)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, get_code, ...
        return getattr(self.loader, name)


def _imported(trigger: str) -> None:
    name = _pending.pop(trigger, None)
    if name is None or trigger in _seen:
        return
    _seen.add(trigger)
    _installed.setdefault(name, False)
    try:
        import importlib

        module = importlib.import_module(f"stepwatch.integrations.{name}")
        _installed[name] = bool(module.install()) or _installed[name]
        _debug("stepwatch: auto-instrumentation: %s installed=%s", name, _installed[name])
    except Exception as exc:
        _debug("stepwatch: auto-instrumentation of %s skipped: %r", name, exc)


def _debug(message: str, *args: object) -> None:
    try:
        import logging

        logging.getLogger("stepwatch").debug(message, *args)
    except Exception:
        pass
