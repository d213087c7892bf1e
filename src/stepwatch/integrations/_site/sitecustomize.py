"""Put on a child's ``PYTHONPATH`` by ``stepwatch run``: the auto-instrumentation hook, then the real sitecustomize.

Python imports the first ``sitecustomize`` on ``sys.path`` at start. This one activates stepwatch's
import hook (:mod:`stepwatch.integrations._auto`) when the environment asks for it, then imports
the ``sitecustomize`` it shadows, if there is one, so that nothing else changes. It needs nothing
but the standard library: a child whose Python has no stepwatch gets only the chaining, and it never
raises (an error of the shadowed sitecustomize is reported the way ``site`` reports it).
"""

import os
import sys


def _activate() -> None:
    flag = os.environ.get("STEPWATCH_AUTOINSTRUMENT", "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return
    if not (os.environ.get("STEPWATCH_URL") or os.environ.get("KUBEFLOW_TRAINER_SERVER_URL")):
        return
    try:
        from stepwatch.integrations._auto import activate
    except Exception:  # this Python has no stepwatch (or a broken one): run without the hook
        return
    activate()


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    mine = sys.modules.pop("sitecustomize", None)
    removed: list[tuple[int, str]] = []
    for i in range(len(sys.path) - 1, -1, -1):
        try:
            same = os.path.abspath(sys.path[i] or os.curdir) == here
        except Exception:
            same = False
        if same:
            removed.append((i, sys.path.pop(i)))
    try:
        __import__("sitecustomize")  # the one this file shadows, if any
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _report(exc)
    except Exception as exc:
        _report(exc)
    finally:
        for i, entry in reversed(removed):
            sys.path.insert(i, entry)
        if "sitecustomize" not in sys.modules and mine is not None:
            sys.modules["sitecustomize"] = mine


def _report(exc: BaseException) -> None:
    if sys.flags.verbose:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    else:
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


try:
    _activate()
except Exception:
    pass
_chain()
