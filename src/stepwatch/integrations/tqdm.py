"""tqdm: a loop that already shows a progress bar reports its step, total and ETA, with no code change.

::

    from tqdm import tqdm

    for batch in (bar := tqdm(loader)):          # unchanged training code
        loss = train_step(batch)
        bar.set_postfix(loss=loss)               # numbers in the postfix become metrics

Under ``stepwatch run`` the auto-instrumentation calls :func:`install` once ``tqdm`` is imported;
elsewhere call it yourself (``stepwatch.integrations.tqdm.install()``). From then on:

* the **outermost open bar with a total** that **your code** creates feeds the current run: its
  ``n`` is the step, its total the total, and the run's ETA follows (a run is started from the
  environment if there is none). Bars opened inside it (``leave=False`` inner loops) are left
  alone; a bar opened after it closed (the next epoch's) counts on from where it stopped;
* numbers given to ``set_postfix`` (``loss=0.31``, ``lr="1e-4"``, a tensor) become metrics;
* bars made by installed libraries (a download, ``datasets.map``, a framework's own progress bar)
  are ignored, and so are all bars when the run was started by someone else (your own
  ``stepwatch.init()``, the Transformers or Lightning integration): they report better.

Only ``tqdm.__init__`` is patched (once per bar: a few microseconds). The bar that feeds a run gets
its own ``update``/``close``/``reset``/``set_postfix``; every other bar, and tqdm's own per-item
loop in ``__iter__`` (which calls ``update`` about ten times a second), run exactly tqdm's code.
"""

from __future__ import annotations

import math
import os
import sys
import sysconfig
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

try:
    import tqdm.std  # type: ignore[import-untyped,unused-ignore]
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("stepwatch.integrations.tqdm needs tqdm: pip install 'stepwatch[tqdm]'") from exc

from ._guard import report_failure

if TYPE_CHECKING:
    from types import FrameType

    from .._run import Run

__all__ = ["install"]

_original_init: Callable[..., None] | None = None
_started: Run | None = None
"""The run this integration started (bars join only it, never a run started elsewhere)."""
_owner: weakref.ref[Any] | None = None
"""The bar that feeds the run now, if it is still open."""
_library_dirs: tuple[str, ...] = ()
_user_files: dict[str, bool] = {}
"""Whether a source file is the user's, per file name (decided once: a bar may be made per batch)."""
_SKIP_MODULES = frozenset({"tqdm", "stepwatch"})
_DEVICE_MODULES = frozenset({"numpy", "torch", "jax", "jaxlib", "tensorflow", "cupy", "mlx"})


def install() -> bool:
    """Make the outermost bar with a total feed the current run (see the module doc). Idempotent."""
    global _original_init, _library_dirs
    if _original_init is not None:
        return True
    paths = sysconfig.get_paths()
    dirs = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key)}
    _library_dirs = tuple(sorted(os.path.join(os.path.realpath(d), "") for d in dirs))
    original = tqdm.std.tqdm.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            _adopt(self)
        except Exception as exc:
            report_failure("tqdm", "__init__", exc)

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    tqdm.std.tqdm.__init__ = __init__
    _original_init = original
    return True


def _uninstall() -> None:
    """Undo :func:`install` (for tests)."""
    global _original_init, _started, _owner
    if _original_init is not None:
        tqdm.std.tqdm.__init__ = _original_init
    _original_init, _started, _owner = None, None, None


def _adopt(bar: Any) -> None:
    """Make ``bar`` feed the run if it is the outermost open bar with a total, made by user code."""
    global _started, _owner
    if bar.disable:
        return
    outer = _owner() if _owner is not None else None
    if outer is not None and not outer.disable:  # an outer bar is open (close() disables it)
        if _started is not None and _made_by_user_code():
            _Feed(bar, _started, steps=False)  # an inner bar: its postfix numbers still count
        return
    if not _is_total(bar.total) or not _made_by_user_code():
        return
    import stepwatch

    run = stepwatch.current()
    if run is None:
        run = _started = stepwatch.init()
    elif run is not _started:
        return  # the user's own run, or another integration's: they report the steps
    _Feed(bar, run, steps=True)
    _owner = weakref.ref(bar)


def _is_total(total: Any) -> bool:
    return isinstance(total, (int, float)) and not isinstance(total, bool) and 0 < total < math.inf


class _Feed:
    """The instance methods of a bar that feeds the run (every other bar keeps tqdm's own).

    The outermost bar (``steps``) gets ``update``, ``close`` and ``reset`` that move the run's step;
    it and the bars inside it get a ``set_postfix`` that logs the numbers.
    """

    __slots__ = ("offset", "run")

    def __init__(self, bar: Any, run: Run, *, steps: bool) -> None:
        self.run = run
        self.offset = run.current_step - bar.n
        """Steps of the bars before this one (a bar's ``initial`` counts as steps it already did)."""
        cls = type(bar)
        ref: Callable[[], Any] = weakref.ref(bar)
        # Closures over a weak reference: no cycle, so an unclosed bar still closes when dropped.
        base_update, base_close, base_reset, base_postfix = cls.update, cls.close, cls.reset, cls.set_postfix
        step, log = run.step, run.log

        def update(n: float = 1) -> Any:
            b = ref()
            result = base_update(b, n)
            if result:  # tqdm refreshed the bar (about ten times a second): the step follows it
                try:
                    step(self.offset + b.n)
                except Exception as exc:
                    report_failure("tqdm", "update", exc)
            return result

        def close() -> Any:
            b = ref()
            if b is None:
                return None
            was_open = not b.disable
            result = base_close(b)
            if was_open:
                try:
                    step(self.offset + b.n)
                except Exception as exc:
                    report_failure("tqdm", "close", exc)
            return result

        def reset(total: float | None = None) -> Any:
            b = ref()
            self.offset += b.n  # a bar reused for the next epoch counts on
            result = base_reset(b, total)
            self._total(b)
            return result

        def set_postfix(ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> Any:
            try:
                metrics = _numbers(ordered_dict, kwargs)
                if metrics:
                    log(**metrics)
            except Exception as exc:
                report_failure("tqdm", "set_postfix", exc)
            return base_postfix(ref(), ordered_dict, refresh, **kwargs)

        bar.set_postfix = set_postfix
        if steps:
            self._total(bar)
            bar.update, bar.close, bar.reset = update, close, reset

    def _total(self, bar: Any) -> None:
        if _is_total(bar.total):
            self.run.update(total_steps=max(1, math.ceil(self.offset + bar.total)))


def _numbers(ordered_dict: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The postfix entries that are numbers: Python and NumPy numbers, tensors, numeric strings."""
    found: dict[str, Any] = {}
    for items in (ordered_dict, kwargs):
        if not items:
            continue
        for key, value in items.items():
            cls = value.__class__
            if cls is float or cls is int:
                found[str(key)] = value
            elif cls is str:
                try:
                    found[str(key)] = float(value.strip().rstrip("%"))
                except ValueError:
                    pass
            elif cls is not bool and cls.__module__.partition(".")[0] in _DEVICE_MODULES:
                found[str(key)] = value  # kept by reference: read in the sender thread
    return found


def _made_by_user_code() -> bool:
    """Whether the code that created the bar is the user's (not an installed library, not stdlib)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.partition(".")[0] not in _SKIP_MODULES:
            filename = frame.f_code.co_filename
            mine = _user_files.get(filename)
            if mine is None:
                mine = _user_files[filename] = _is_user_file(filename)
            return mine
        frame = frame.f_back
    return False


def _is_user_file(filename: str) -> bool:
    if filename.startswith("<"):  # python -c, a notebook cell, an exec'd string
        return not filename.startswith("<frozen")
    path = os.path.realpath(filename)
    return not path.startswith(_library_dirs) and not any(
        part in ("site-packages", "dist-packages") for part in path.split(os.sep)
    )
