"""Where a rank stands: its training thread's stack, read from the sender thread, as a :class:`~.protocol.Where`.

Two parts, both standard library only and both run in the sender thread, never on the hot path:

* :class:`StackReader` turns one thread's stack (``sys._current_frames()``) into a reading: what the
  thread does (one of :data:`~.protocol.ACTIVITIES`), the library call that decided it (dotted,
  ``torch.distributed.all_reduce``), and the innermost frames of the user's own code as
  ``function (file:line)``. What it learns of a code object (library or user, which activity) is
  cached by the code object, so a sample costs a walk of at most :data:`MAX_DEPTH` frames and a dict
  lookup each. Nothing else of a frame is read: no locals, no arguments.
* :class:`WhereSampler` decides when to read. It watches the run's step counter at about 1 Hz (an
  attribute read: the hot path records nothing for it); a step that has stood longer than
  ``max(3 x the median step time, 5 s)`` is *standing*, and while it stands every tick reads the
  stack and keeps the latest reading, which every report then carries. The same ticks, while
  nothing stands, count the activity of each report's interval (``Report.activity_shares``).

Why the deciding call and not the innermost frame: a checkpoint written to a slow file spends its
time in the file's ``write`` under ``torch.save``, a data loader in ``queue.get`` under
``DataLoader.__next__``; what the stack is *for* is decided by the outermost frame that says so.
When several activities appear, the order of :data:`_PRECEDENCE` decides (a save or an evaluation
over what it calls, then collectives, data, compute, waits).
"""

from __future__ import annotations

import linecache
import logging
import os
import re
import statistics
import sys
import threading
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Final

from .protocol import LIMITS, Frame, Where

__all__ = ["MAX_DEPTH", "StackReader", "WhereSampler"]

_log = logging.getLogger("stepwatch")

MAX_DEPTH: Final = 200
"""Frames walked per sample at most (a deep recursion costs no more than this)."""
_PRECEDENCE: Final[dict[str, int]] = {
    "checkpointing": 6,
    "evaluating": 5,
    "communicating": 4,
    "loading_data": 3,
    "computing": 2,
    "waiting": 1,
    "other": 0,
}
_CACHE_LIMIT: Final = 8192
"""Code objects remembered; past it the cache starts again (bounded memory in a long job)."""

_USER, _LIBRARY, _OURS = 0, 1, 2
_WRAPPERS: Final = frozenset(
    {"wrapper", "inner", "_fn", "decorate_context", "_call_impl", "_wrapped_call_impl", "__call__", "<lambda>"}
)
"""Library functions that only forward a call: never the deciding call."""
_EVAL_NAME: Final = re.compile(r"(evaluate\w*|eval|eval_\w*|validate\w*|validation\w*|\w+_(eval|evaluate|validation))")
"""A user function whose name says it evaluates (so an evaluation without the eval hook reads evaluating)."""
_CHECKPOINT_FUNCTIONS: Final = frozenset(
    {"_save_checkpoint", "save_checkpoint", "save_model", "save_state", "load_checkpoint", "load_state",
     "_load_from_checkpoint", "save_pretrained", "save_file", "load_file"}
)  # fmt: skip
"""Library functions that save or load a checkpoint (transformers, Lightning, DeepSpeed, Accelerate, safetensors)."""
_EVAL_FUNCTIONS: Final = frozenset(
    {"evaluate", "evaluation_loop", "prediction_loop", "predict", "_run_evaluate", "validate", "test"}
)
_EVAL_LIBRARIES: Final = ("transformers", "keras", "tf_keras", "lightning", "pytorch_lightning", "tensorflow")
_ALIASES: Final[dict[str, str]] = {
    "torch.serialization": "torch",
    "torch.distributed.distributed_c10d": "torch.distributed",
    "torch.utils.data.dataloader": "torch.utils.data.DataLoader",
    "transformers.trainer": "transformers.Trainer",
    "torch._tensor": "torch.Tensor",
    "torch.autograd": "torch.autograd",
    "torch.nn.modules.module": "torch.nn.Module",
}
"""Modules whose public name is shorter: ``torch.serialization.save`` is ``torch.save``."""
_WAIT_CALLS: Final = frozenset(
    {"sleep", "acquire", "wait", "wait_for", "join", "select", "poll", "recv", "recv_bytes", "get", "put",
     "result", "communicate", "__enter__"}
)  # fmt: skip
"""Calls of C code that block: what a standing frame's own call is when it waits (``time.sleep``, ``lock.acquire``)."""
_COMPUTE_LIBRARIES: Final = frozenset({"torch", "jax", "jaxlib", "numpy", "flax", "optax", "deepspeed"})
_WAIT_MODULES: Final = frozenset({"threading", "queue", "selectors", "subprocess", "concurrent"})
_WAIT_PACKAGES: Final = ("multiprocessing.connection", "multiprocessing.queues", "multiprocessing.synchronize")
_COMPUTE_PREFIXES: Final = ("torch.", "F.", "np.", "numpy.", "jax.", "jnp.")
_CALLEE: Final = re.compile(r"[A-Za-z_][\w.]*")


def _library_roots() -> tuple[str, ...]:
    """Folders of the standard library and the interpreter's prefixes: code there is not the user's own.

    Read from where ``os`` lives and from ``sys``, not ``sysconfig`` (which loads a data module that a
    training process need not carry); installed packages are recognised by their ``site-packages``.
    """
    roots = {os.path.dirname(os.path.abspath(os.__file__)) + os.sep}
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        roots.add(os.path.join(os.path.abspath(prefix), "lib") + os.sep)
    return tuple(sorted(roots))


class StackReader:
    """Reads one thread's stack into a :class:`~.protocol.Where` (what, the deciding call, the user's frames)."""

    def __init__(self, cwd: str | None = None) -> None:
        self._cwd = (cwd or os.getcwd()).rstrip(os.sep) + os.sep
        self._roots = _library_roots()
        self._ours = os.path.dirname(os.path.abspath(__file__)) + os.sep
        self._codes: dict[CodeType, tuple[int, str | None, str]] = {}
        self._calls: dict[tuple[CodeType, int], str] = {}

    # -------------------------------------------------------------------------------- one frame

    def _code(self, code: CodeType, frame: FrameType) -> tuple[int, str | None, str]:
        """(whose code, its activity or None, the dotted name it decides with) of one code object, cached."""
        known = self._codes.get(code)
        if known is not None:
            return known
        if len(self._codes) >= _CACHE_LIMIT:
            self._codes.clear()
        module = frame.f_globals.get("__name__")
        module = module if isinstance(module, str) else ""
        known = self._learn(code, module)
        self._codes[code] = known
        return known

    def _learn(self, code: CodeType, module: str) -> tuple[int, str | None, str]:
        filename = code.co_filename
        name = code.co_name
        qualname = getattr(code, "co_qualname", name)  # Python >= 3.11
        if filename.startswith(self._ours) or module == "stepwatch" or module.startswith("stepwatch."):
            # our own run.track: the loop waits for its next item (the iterable's own frames say more)
            if name == "track":
                return _OURS, "loading_data", "stepwatch.Run.track"
            return _OURS, None, ""
        absolute = os.path.abspath(filename) if not filename.startswith("<") else filename
        if filename.startswith("<") or absolute.startswith(self._roots) or _in_site_packages(absolute):
            return _LIBRARY, *_library_activity(module, name, qualname)
        if _EVAL_NAME.fullmatch(name):
            return _USER, "evaluating", qualname
        return _USER, None, ""

    def _call(self, frame: FrameType, code: CodeType) -> str:
        """The callee of the call a frame stands in (``time.sleep``, ``lock.acquire``), from its source, cached."""
        lasti = frame.f_lasti
        key = (code, lasti)
        known = self._calls.get(key)
        if known is not None:
            return known
        if len(self._calls) >= _CACHE_LIMIT:
            self._calls.clear()
        callee = ""
        try:
            callee = _callee(code, lasti, frame.f_lineno)
        except Exception:  # a code object without positions or source: no callee
            callee = ""
        self._calls[key] = callee
        return callee

    # ------------------------------------------------------------------------------- one stack

    def read(self, frame: FrameType, stood: float = 0.0, samples: int = 1) -> Where:
        """The reading of the stack whose innermost frame is ``frame``."""
        activity, detail, frames = self._walk(frame, with_frames=True)
        return Where(activity=activity, stood_seconds=round(stood, 3), detail=detail, frames=frames, samples=samples)

    def activity(self, frame: FrameType) -> str:
        """Only the activity of a stack (what the low-rate samples for ``activity_shares`` need)."""
        return self._walk(frame, with_frames=False)[0]

    def _walk(self, innermost: FrameType, with_frames: bool) -> tuple[str, str, tuple[Frame, ...]]:
        best, rank, detail, weak = "other", -1, "", True
        user: list[Frame] = []
        limit = LIMITS.max_where_frames
        frame: FrameType | None = innermost
        depth = 0
        while frame is not None and depth < MAX_DEPTH:
            code = frame.f_code
            whose, activity, name = self._code(code, frame)
            if depth == 0:  # the call this thread stands in, when it is C code (time.sleep, a lock)
                call_activity, call = _call_activity(self._call(frame, code))
                if call_activity is not None and activity is None:
                    best, rank, detail, weak = call_activity, _PRECEDENCE[call_activity], call, False
            if activity is not None:
                level = _PRECEDENCE[activity]
                if level > rank:
                    best, rank, detail, weak = activity, level, name, whose == _OURS
                elif level == rank and name and (weak or whose != _OURS):
                    detail, weak = name, whose == _OURS  # outer frames of the same activity: the call the user made
            if with_frames and whose == _USER and len(user) < limit:
                user.append(self._frame(code, frame))
            frame = frame.f_back
            depth += 1
        return best, detail[: LIMITS.max_where_detail_length], tuple(user)

    def _frame(self, code: CodeType, frame: FrameType) -> Frame:
        filename = code.co_filename
        if filename.startswith(self._cwd):
            filename = filename[len(self._cwd) :]
        function = _printable(getattr(code, "co_qualname", code.co_name))[: LIMITS.max_frame_function_length]
        filename = _printable(filename)
        if len(filename) > LIMITS.max_frame_file_length:  # keep the end: the file's name says most
            filename = "\u2026" + filename[-(LIMITS.max_frame_file_length - 1) :]
        return Frame(function=function, file=filename, line=max(0, frame.f_lineno or 0))


def _in_site_packages(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def _printable(text: str) -> str:
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def _dotted(module: str, name: str, qualname: str) -> str:
    alias = _ALIASES.get(module)
    if alias is not None:
        return f"{alias}.{name}"
    return f"{module}.{qualname}" if module else qualname


def _library_activity(module: str, name: str, qualname: str) -> tuple[str | None, str]:
    """What a library function says its caller does (``None``: nothing), with its dotted name."""
    top = module.partition(".")[0]
    dotted = "" if name in _WRAPPERS or name.startswith("<") else _dotted(module, name, qualname)
    if module.startswith(("torch.distributed.checkpoint", "safetensors")) or module == "torch.serialization":
        return "checkpointing", dotted
    if name in _CHECKPOINT_FUNCTIONS and top not in ("threading", "queue", "io"):
        return "checkpointing", dotted
    if top in _EVAL_LIBRARIES and (name in _EVAL_FUNCTIONS or ".loops.evaluation_loop" in module):
        return "evaluating", dotted
    if module.startswith(("torch.distributed", "deepspeed.comm", "horovod", "accelerate.utils.operations")):
        return "communicating", dotted
    if module.startswith(("torch.utils.data", "lightning.pytorch.loops.fetchers", "pytorch_lightning.loops.fetchers")):
        return "loading_data", dotted
    if top in _COMPUTE_LIBRARIES or module.startswith("transformers.models"):
        return "computing", dotted
    waits = top in _WAIT_MODULES or module.startswith(_WAIT_PACKAGES)
    if waits and (name in _WAIT_CALLS or name == "_wait_for_tstate_lock"):
        return "waiting", dotted
    return None, ""


def _call_activity(callee: str) -> tuple[str | None, str]:
    """What a standing frame's own call of C code says (``time.sleep``: waiting; ``torch.mm``: computing)."""
    if not callee:
        return None, ""
    if callee.startswith(_COMPUTE_PREFIXES) or callee.endswith(".backward"):
        return "computing", callee
    if callee.rpartition(".")[2] in _WAIT_CALLS:
        return "waiting", callee
    return None, ""


def _callee(code: CodeType, lasti: int, lineno: int | None) -> str:
    """The dotted callee of the instruction at ``lasti``, read from the source span Python records for it."""
    positions = getattr(code, "co_positions", None)
    text = ""
    if positions is not None and lasti >= 0:
        for i, position in enumerate(positions()):
            if i == lasti // 2:
                start, end, col, end_col = position
                if start is not None and col is not None:
                    line = linecache.getline(code.co_filename, start)
                    text = line[col : end_col if end == start and end_col is not None else None]
                break
    elif lineno:
        text = linecache.getline(code.co_filename, lineno)
    text = text.strip()
    if text.startswith("with "):
        text = text[5:]
    if "(" in text:
        head = text[: text.index("(")].strip()
        return head if _CALLEE.fullmatch(head) else ""
    opname = _opname(code, lasti)
    if opname in ("BEFORE_WITH", "SETUP_WITH") and _CALLEE.fullmatch(text.rstrip(":").strip()):
        return text.rstrip(":").strip() + ".__enter__"  # `with lock:` stands in the lock's C __enter__
    return ""


def _opname(code: CodeType, lasti: int) -> str:
    import dis

    try:
        return dis.opname[code.co_code[lasti]]
    except (IndexError, TypeError):
        return ""


class WhereSampler:
    """Watches a run's step from the sender thread and reads the training thread's stack while it stands.

    ``current_step`` and ``thread`` are read at each tick: the run's step counter and the ident of
    the thread that trains. ``tick(now)`` is called by the sender at least every :attr:`period`
    seconds (:meth:`next_due`); it returns ``True`` when a step has just begun to stand, so that a
    rank that heartbeats rarely sends at once. Every failure switches the sampler off with one info
    line; it never raises.
    """

    def __init__(
        self,
        current_step: Callable[[], int],
        thread: Callable[[], int | None],
        *,
        period: float = 1.0,
        factor: float = 3.0,
        floor: float = 5.0,
        shares: bool = True,
        cwd: str | None = None,
    ) -> None:
        self.period = period
        self.factor = factor
        self.floor = floor
        self.shares = shares
        self.enabled = True
        self._current_step = current_step
        self._thread = thread
        self._reader: StackReader | None = None
        self._cwd = cwd
        self._next = 0.0
        self._step: int | None = None
        self._changed_at: float | None = None
        """When the step was last seen to move (the sender's clock): the current step began about then."""
        self._durations: deque[float] = deque(maxlen=64)
        """Seconds per step of the recent ticks that saw it move: their median is the usual step time."""
        self._where: Where | None = None
        self._samples = 0
        self._counts: dict[str, int] = {}
        self.reads = 0
        """Stacks read so far (for benchmarks and tests: the sampler really ran)."""

    @property
    def standing(self) -> bool:
        """Whether a step stands now (a reading is held)."""
        return self._where is not None

    def next_due(self) -> float:
        """When the sender should tick next."""
        return self._next

    def threshold(self) -> float:
        """How long a step may stand before it is read: ``max(factor x median step time, floor)``."""
        if not self._durations:
            return self.floor
        return max(self.factor * statistics.median(self._durations), self.floor)

    def tick(self, now: float) -> bool:
        """Watch the step; read the stack when it stands (or for the shares). ``True``: a stand just began."""
        if not self.enabled or now < self._next:
            return False
        self._next = now + self.period
        try:
            return self._tick(now)
        except Exception as exc:
            self.enabled = False
            self._where = None
            _log.info("stepwatch: reading where the rank stands failed (%r); switched off", exc)
            return False

    def _tick(self, now: float) -> bool:
        step = self._current_step()
        if self._changed_at is None:  # the first tick, at the sender's start: only note the step (a short
            self._step, self._changed_at = step, now  # run never pays for the first, cold, read)
            return False
        if step != self._step:
            if self._step is not None and self._changed_at is not None and step > self._step:
                self._durations.append((now - self._changed_at) / (step - self._step))
            self._step, self._changed_at = step, now
            self._where, self._samples = None, 0
        stood = now - self._changed_at
        standing = stood >= self.threshold()
        if not standing and not self.shares:
            return False
        frame = self._frame()
        if frame is None:
            return False
        reader = self._reader
        if reader is None:
            reader = self._reader = StackReader(self._cwd)
        began = False
        self.reads += 1
        if standing:
            began = self._where is None
            self._samples += 1
            self._where = reader.read(frame, stood, self._samples)
            activity = self._where.activity
        else:
            activity = reader.activity(frame)
        del frame
        if self.shares:
            self._counts[activity] = self._counts.get(activity, 0) + 1
        return began

    def _frame(self) -> FrameType | None:
        ident = self._thread()
        frames = sys._current_frames()
        frame = frames.get(ident) if ident is not None else None
        if frame is None:  # the thread that trained is gone: the main thread is the best guess
            frame = frames.get(threading.main_thread().ident or -1)
        return frame

    def reading(self) -> Where | None:
        """The latest reading while the step stands, else ``None``."""
        return self._where

    def take_shares(self) -> dict[str, float] | None:
        """The share of each activity among the samples since the last call (``None``: no samples)."""
        counts, self._counts = self._counts, {}
        total = sum(counts.values())
        if not total:
            return None
        return {activity: round(n / total, 4) for activity, n in counts.items()}
