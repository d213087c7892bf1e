"""A run: what a training loop holds to report its progress, and the module-level shortcuts.

The hot path (:meth:`Run.step`, :meth:`Run.log`, :meth:`Run.epoch`) touches only attributes of the
run and appends to a deque: no I/O, no clock, no lock held by the sender, no read of a value that
lives on an accelerator, and nothing escapes it as an exception. Everything else happens in the
sender thread. The one exception to "keep values by reference" is a torch tensor already in host
memory: it is read at once (see :func:`_settle`).
"""

from __future__ import annotations

import math
import operator
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

if TYPE_CHECKING:  # kept out of `import stepwatch`: loaded by init() when a run reports
    from types import FrameType, TracebackType

    from ._gpu import GpuReader
    from ._progression import Progression
    from ._sender import Sender
    from ._setup import Plan
    from ._transport import Transport
    from ._wire import Snapshot
    from .protocol import Command, ReportState

__all__ = ["Run", "current", "epoch", "evaluating", "finish", "init", "log", "step", "track"]


def _logger() -> Any:
    import logging

    return logging.getLogger("stepwatch")


T = TypeVar("T")
Mode = Literal["native", "kubeflow", "off"]
FinalState = Literal["finished", "failed", "stopped"]
Phase = Literal["train", "eval"]

_MAX_REASON = 256
"""``LIMITS.max_reason_length``, repeated here so that ``import stepwatch`` needs no protocol."""
_SOFT_QUEUE = 1024
"""Queued entries past which the hot path wakes the sender early (at each multiple of it)."""
_SOFT_MASK = _SOFT_QUEUE - 1
_HARD_QUEUE = 16 * _SOFT_QUEUE
"""Queued entries past which the hot path folds inline (bounded memory if the sender starves)."""
_STEP_KEY = 0
"""Where a queued metrics dict keeps its step: an int, which no keyword argument can be."""
_PLAIN = frozenset({float, int})
"""Value types the hot path queues without looking at them."""
_TORCH_TENSOR = 1
_kinds: dict[type, int] = {}
"""What the hot path does with each class of value it has met: ``_TORCH_TENSOR`` or 0 (queue it)."""


class Run:
    """One attempt of one job, as seen from one process. Create it with :func:`stepwatch.init`.

    ``step()``, ``log()`` and ``epoch()`` are safe to call on every iteration: they never raise,
    never block and never touch the network. A run without an endpoint (or on a rank other than 0
    for metrics) accepts the same calls and does nothing with them, unless rank 0 serves OpenShift
    AI's progression status (:attr:`metrics_address`), which needs no endpoint.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        total_steps: int | None = None,
        total_epochs: float | None = None,
        batch_size: int | None = None,
        params: Mapping[str, Any] | None = None,
        transport: Transport | None = None,
    ) -> None:
        import uuid

        from ._window import WindowBuffer

        self.job = plan.job
        self.namespace = plan.namespace
        self.identity = plan.identity
        self.mode: Mode = plan.mode
        self.url = plan.url
        self.run_id = uuid.uuid4().hex
        self._flush_timeout = plan.settings.flush_timeout
        self._step = 0
        self._epoch: float | None = None
        self._total_steps: int | None = None
        self._total_epochs: float | None = None
        self._batch_size: int | None = None
        self._state: ReportState = "running"
        self._reason = ""
        self._should_stop = False
        self._stop_reason = ""
        self._should_checkpoint = False
        self._command_reason = ""
        self._finished = False
        self._thread = threading.get_ident()
        """The thread that trains, whose stack the sender reads while a step stands (:mod:`._where`): the
        one that called ``init``, or the one that iterates :meth:`track` (recorded there, once per loop)."""
        self._phase: Phase = "train"
        self._phase_t = time.monotonic()
        """When the current phase began (the reporter's monotonic clock; only a duration is sent)."""
        self._gpus: GpuReader | None = None
        """Reads this process's GPUs for each report (made in the sender thread, at its first snapshot)."""
        self._warned: set[str] = set()
        self._new_params: list[dict[str, Any]] = []
        """Params given to update() since the last report (list.append and the sender's swap are atomic)."""
        self.update(total_steps=total_steps, total_epochs=total_epochs, batch_size=batch_size)
        self._buffer = WindowBuffer()
        self._queue = self._buffer.queue
        self._progression: Progression | None = None
        self.metrics_address: tuple[str, int] | None = None
        """Where this process serves OpenShift AI's progression status (host, port), or ``None``."""
        self._collect = False
        self._sender: Sender | None = None
        self._start(plan, transport, params)

    def _start(self, plan: Plan, transport: Transport | None, params: Mapping[str, Any] | None) -> None:
        """Listen for OpenShift AI's controller when the plan says so, and start the sender when anything
        is reported (to an endpoint, or only through that status)."""
        from ._setup import make_sender, start_progression

        if plan.metrics_address is not None:
            self._progression = start_progression(plan)
        if self._progression is not None:  # this run's status from now on, not a previous run's final one
            self.metrics_address = self._progression.address
            self._progression.collect([], self._first_snapshot())
        reports = self.mode != "off" or self._progression is not None
        self._collect = reports and self.identity.rank == 0
        if not reports:
            return
        sender = make_sender(
            plan,
            run_id=self.run_id,
            snapshot=self._snapshot,
            on_command=self._on_command,
            total_steps=lambda: self._total_steps,
            buffer=self._buffer if self._collect else None,
            transport=transport,
            params=params,
            progression=self._progression,
            current_step=lambda: self._step,
            thread=lambda: self._thread,
        )
        if sender.start():
            self._sender = sender
        else:
            self._collect = False
            self.mode = "off"
            self.yield_progression("")

    # ------------------------------------------------------------------------------------ hot path

    def step(self, step: int | None = None, **metrics: Any) -> None:
        """Count one training step (or jump to ``step``) and fold ``metrics`` into the window.

        Values may be Python numbers, NumPy scalars, torch tensors or JAX arrays. Accelerator
        tensors and JAX arrays are kept by reference (a torch tensor without its autograd graph) and
        read in the sender thread; a one-element torch tensor in host memory is read at once, which
        needs no device synchronisation. Never raises.
        """
        try:
            if step is None:
                step = self._step + 1
            elif step.__class__ is not int or step < 0:
                step = self._coerce_step(step)
                if step is None:
                    return
            self._step = step
            if metrics and self._collect:
                if not _PLAIN.issuperset(map(type, metrics.values())):
                    _settle(metrics)
                # The step travels inside the kwargs dict (a fresh dict of this call) under a key no
                # keyword can have: no tuple per step, so the garbage collector is not woken up.
                metrics[_STEP_KEY] = step  # type: ignore[index]
                queue = self._queue
                queue.append(metrics)
                queued = len(queue)
                if queued >= _SOFT_QUEUE and not queued & _SOFT_MASK:
                    self._relieve(queued)
        except Exception as exc:  # the hot path never raises into the training loop
            self._warn_once("step", "stepwatch: step() failed and was skipped: %r", exc)

    def log(self, **metrics: Any) -> None:
        """Fold metrics (eval results, say) into the window at the current step, without moving it."""
        try:
            if metrics and self._collect:
                if not _PLAIN.issuperset(map(type, metrics.values())):
                    _settle(metrics)
                metrics[_STEP_KEY] = self._step  # type: ignore[index]
                queue = self._queue
                queue.append(metrics)
                queued = len(queue)
                if queued >= _SOFT_QUEUE and not queued & _SOFT_MASK:
                    self._relieve(queued)
        except Exception as exc:
            self._warn_once("log", "stepwatch: log() failed and was skipped: %r", exc)

    def epoch(self, epoch: float) -> None:
        """Set the current epoch (fractional epochs are fine: 1.5 is half-way through the second)."""
        if epoch.__class__ in (int, float) and epoch >= 0 and epoch - epoch == 0:
            self._epoch = epoch
        else:
            self._warn_once("epoch", "stepwatch: epoch must be a finite number >= 0, got %r; ignored", epoch)

    def _coerce_step(self, step: object) -> int | None:
        try:
            integral = isinstance(step, float) and step.is_integer()
            value = int(step) if integral else operator.index(step)  # type: ignore[arg-type, call-overload]
        except Exception:
            value = -1
        if value < 0:
            self._warn_once("badstep", "stepwatch: step must be an integer >= 0, got %r; ignored", step)
            return None
        return value

    def _relieve(self, queued: int) -> None:
        """Called at every multiple of 1,024 queued entries: wake the sender, or fold here if starved."""
        if queued >= _HARD_QUEUE:
            self._buffer.drain(on_training_thread=True)
        elif self._sender is not None:
            self._sender.wake()

    # ---------------------------------------------------------------------------------- the phase

    @property
    def phase(self) -> Phase:
        """``"eval"`` while the loop evaluates (:meth:`evaluating`), else ``"train"``."""
        return self._phase

    def set_phase(self, phase: Phase) -> None:
        """Say whether the loop trains or evaluates; each report carries it, with the seconds since.

        While a rank says ``"eval"`` its step may stand without the job being called ``stalled`` for
        a longer limit (``docs/health.md``): an evaluation is not a hang. Integrations call this from
        their trainer's evaluation events; a plain loop uses ``with run.evaluating():``. Setting the
        phase it already has keeps its start. Never raises.
        """
        given: object = phase  # typed, but a caller may pass anything
        if given.__class__ is not str or given not in ("train", "eval"):  # no __eq__ of a user's object runs
            self._warn_once("phase", "stepwatch: phase must be 'train' or 'eval', got %r; ignored", phase)
            return
        if phase == self._phase:
            return
        self._phase_t = time.monotonic()
        self._phase = phase

    def evaluating(self) -> _Evaluating:
        """``with run.evaluating(): ...``: the block is an evaluation (nested blocks count once)."""
        return _Evaluating(self)

    # ---------------------------------------------------------------------------------- the rest

    @property
    def current_step(self) -> int:
        """The last step counted."""
        return self._step

    @property
    def should_stop(self) -> bool:
        """The server asked this job to stop (after saving a checkpoint, when it can)."""
        return self._should_stop

    @property
    def should_checkpoint(self) -> bool:
        """The server asked for a checkpoint; call :meth:`checkpoint_done` once it is saved."""
        return self._should_checkpoint

    @property
    def command_reason(self) -> str:
        """Why the server sent its last command (``"not learning for 30 min"``)."""
        return self._command_reason

    def checkpoint_done(self) -> None:
        """Say that the checkpoint asked for has been saved."""
        self._should_checkpoint = False

    @property
    def total_steps(self) -> int | None:
        """Total optimizer steps of the run, when known."""
        return self._total_steps

    def update(
        self,
        *,
        total_steps: int | None = None,
        total_epochs: float | None = None,
        batch_size: int | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        """Set what becomes known after ``init`` (a trainer learns its total steps at train start).

        ``batch_size`` is the number of samples in one optimizer step across all ranks. ``params``
        are hyperparameters to add to the job's (an integration that joins a run the user started
        sends its trainer's); they go with the next report. Invalid values are ignored with one
        warning.
        """
        if params:
            from ._setup import clean_params

            cleaned = clean_params(params, lambda *a: self._warn_once("params", *a))
            if cleaned:
                self._new_params.append(cleaned)
        if total_steps is not None:
            if _is_int(total_steps) and total_steps >= 1:
                self._total_steps = int(total_steps)
            else:
                self._warn_once("total_steps", "stepwatch: total_steps must be an integer >= 1, got %r", total_steps)
        if total_epochs is not None:
            if _is_number(total_epochs) and total_epochs > 0:
                self._total_epochs = total_epochs
            else:
                self._warn_once("total_epochs", "stepwatch: total_epochs must be a number > 0, got %r", total_epochs)
        if batch_size is not None:
            if _is_int(batch_size) and batch_size >= 1:
                self._batch_size = int(batch_size)
            else:
                self._warn_once("batch_size", "stepwatch: batch_size must be an integer >= 1, got %r", batch_size)

    def track(self, iterable: Iterable[T], total: int | None = None) -> Iterator[T]:
        """Yield from ``iterable`` (a data loader), counting one step after each item.

        When the run has no ``total_steps`` yet and the length is known (``total`` or
        ``len(iterable)``), it becomes that length times ``total_epochs`` (or the length alone).
        """
        if total is None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except Exception:
                total = None
        self._thread = threading.get_ident()  # the loop may run in another thread than init's
        if total and self._total_steps is None:
            epochs = self._total_epochs
            scale = int(epochs) if epochs and float(epochs).is_integer() else 1
            self.update(total_steps=self._step + total * scale)
        for item in iterable:
            yield item
            self.step()

    def _snapshot(self) -> Snapshot:
        from ._wire import Snapshot  # loaded by then: the sender imported them
        from .protocol import Progress

        step = self._step
        batch = self._batch_size
        evaluating = self._phase == "eval"
        progress = Progress(
            step=step,
            total_steps=self._total_steps,
            epoch=self._epoch,
            total_epochs=self._total_epochs,
            samples=step * batch if batch else None,
            phase="eval" if evaluating else None,  # training is the default: nothing to send
            phase_seconds=round(max(0.0, time.monotonic() - self._phase_t), 3) if evaluating else None,
        )
        params: dict[str, Any] | None = None
        if self._new_params:
            given, self._new_params = self._new_params, []
            params = {k: v for update in given for k, v in update.items()}
        if self._gpus is None:
            from ._gpu import GpuReader

            self._gpus = GpuReader()
        return Snapshot(
            wall_time=time.time(),
            progress=progress,
            state=self._state,
            reason=self._reason,
            params=params,
            gpus=self._gpus.read(),
        )

    def yield_progression(self, reason: str) -> None:
        """Leave OpenShift AI's progression to another reporter: serve nothing, write no termination message.

        Integrations call this when the trainer carries Red Hat's own progression callback, which serves
        the same status on the same port and writes the same message; ``reason`` says so in one info
        line. A run that was serving closes the port (the other reporter may bind it next), and one that
        reports nowhere else stops collecting. Never raises.
        """
        if reason:
            _logger().info("stepwatch: %s; stepwatch leaves OpenShift AI's progression endpoint to it", reason)
        progression, self._progression = self._progression, None
        if progression is None:
            return
        self.metrics_address = None
        progression.stand_aside()
        sender = self._sender
        if self.mode == "off" and sender is not None:  # it only fed the progression: nothing left to do
            self._collect = False
            self._sender = None
            _ACTIVE.discard(self)
            sender.abandon()

    def _first_snapshot(self) -> Snapshot:
        """What is known before the sender's first cycle (no GPU reading: that one is the sender's)."""
        from ._wire import Snapshot
        from .protocol import Progress

        progress = Progress(
            step=self._step, total_steps=self._total_steps, epoch=self._epoch, total_epochs=self._total_epochs
        )
        return Snapshot(wall_time=time.time(), progress=progress)

    def _on_command(self, command: Command) -> None:
        self._command_reason = command.reason
        if command.kind == "stop":
            self._should_stop = True
            self._stop_reason = command.reason
        elif command.kind == "checkpoint":
            self._should_checkpoint = True
        _logger().info(
            "stepwatch: the server asks this job to %s (%s)", command.kind, command.reason or "no reason given"
        )

    def finish(self, state: FinalState = "finished", reason: str = "") -> bool:
        """End the run: send the final state and wait for it (at most the flush timeout).

        A run the server asked to stop (:attr:`should_stop`) that ends ``finished`` ends ``stopped``,
        with the stop's reason: the loop obeyed the stop, or ran to its end while it was asked to
        stop; either way the job did not finish on its own. Returns whether the final report was
        delivered. Calling it again does nothing.
        """
        if self._finished:
            return False
        self._finished = True
        if state not in ("finished", "failed", "stopped"):
            self._warn_once(
                "state", "stepwatch: finish(state=%r) is not finished/failed/stopped; using 'failed'", state
            )
            state = "failed"
        if state == "finished" and self._should_stop:
            state, reason = "stopped", self._stop_reason or "stop requested"
        self._state = state
        self._reason = str(reason)[:_MAX_REASON]
        self._collect = False
        _ACTIVE.discard(self)
        global _current
        if _current is self:
            _current = None
        sender, self._sender = self._sender, None
        if sender is None:
            return False
        _FINISHING[self] = sender
        try:
            return sender.flush(self._snapshot(), self._flush_timeout)
        finally:
            _FINISHING.pop(self, None)

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish(*_exit_state(exc_type, exc))

    def __repr__(self) -> str:
        return (
            f"<stepwatch.Run {self.namespace}/{self.job} mode={self.mode} rank={self.identity.rank} step={self._step}>"
        )

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _logger().warning(message, *args)

    def _after_fork_in_child(self) -> None:
        """In a forked child the sender thread does not exist: the child reports nothing.

        Nor does it serve anything: the progression server closes its sockets in the child by itself
        (:mod:`stepwatch._status_server`), so a DataLoader worker never holds the port.
        """
        self._collect = False
        self._sender = None
        self._progression = None
        self.metrics_address = None
        self._finished = True
        self._buffer.reset_after_fork()
        self._queue = self._buffer.queue


class _Evaluating:
    """The context manager of :meth:`Run.evaluating`: ``"eval"`` inside, the phase before it after."""

    __slots__ = ("_before", "_run")

    def __init__(self, run: Run) -> None:
        self._run = run
        self._before: Phase = "train"

    def __enter__(self) -> Run:
        self._before = self._run.phase
        self._run.set_phase("eval")
        return self._run

    def __exit__(self, *exc: object) -> None:
        self._run.set_phase(self._before)


# ------------------------------------------------------------------------------------- init & co


_current: Run | None = None
_ACTIVE: set[Run] = set()
_FINISHING: dict[Run, Sender] = {}
"""Runs whose final report is on its way (a SIGTERM then waits for it instead of dying at once)."""
_process_hooks_installed = False
_uncaught: list[tuple[type[BaseException], BaseException]] = []


def init(
    job: str | None = None,
    *,
    namespace: str | None = None,
    total_steps: int | None = None,
    total_epochs: float | None = None,
    batch_size: int | None = None,
    params: Mapping[str, Any] | None = None,
    url: str | None = None,
    token: str | None = None,
    token_file: str | None = None,
    ca_cert: str | None = None,
    interval: float | None = None,
    flush_timeout: float | None = None,
    disabled: bool | None = None,
    metrics_port: int | str | bool | None = None,
    where: bool | None = None,
    transport: Transport | None = None,
) -> Run:
    """Start reporting: returns the :class:`Run` a training loop calls ``step()`` on.

    Every argument falls back to its environment variable (``STEPWATCH_URL``, ``STEPWATCH_TOKEN``,
    ``STEPWATCH_TOKEN_FILE``, ``STEPWATCH_JOB``, ``STEPWATCH_NAMESPACE``, ``STEPWATCH_METRICS_PORT``,
    ...), then to the upstream Kubeflow Trainer variables (``KUBEFLOW_TRAINER_SERVER_URL``,
    ``..._TOKEN``, ``..._CA_CERT``). ``metrics_port`` says where rank 0 serves OpenShift AI's
    progression status: a port, ``"HOST:PORT"`` or ``"off"``; unset, 28080 in a Kubeflow TrainJob's pod
    and nowhere elsewhere (``docs/openshift-ai.md``). ``where=False`` (``STEPWATCH_WHERE=off``) never
    reads the training thread's stack (``docs/reporting.md``, "Where a rank stands"). Without an
    endpoint or that status the run is a silent no-op after one info line. ``init`` never raises: a
    setting it cannot use is reported with a warning and reporting is switched off.
    """
    global _current
    from ._setup import plan_run

    if _current is not None:
        _current.finish("finished", "a new run was started in this process")
    plan = plan_run(
        {
            "job": job,
            "namespace": namespace,
            "url": url,
            "token": token,
            "token_file": token_file,
            "ca_cert": ca_cert,
            "interval": interval,
            "flush_timeout": flush_timeout,
            "disabled": disabled,
            "metrics_port": metrics_port,
            "where": where,
        }
    )
    run = Run(
        plan,
        total_steps=total_steps,
        total_epochs=total_epochs,
        batch_size=batch_size,
        params=params,
        transport=transport,
    )
    _current = run
    if run._sender is not None:
        _ACTIVE.add(run)
        _install_process_hooks(plan.settings.handle_sigterm)
    return run


def current() -> Run | None:
    """The run started last in this process, if it is not finished."""
    return _current


def _run() -> Run:
    return _current if _current is not None else init()


def step(step: int | None = None, **metrics: Any) -> None:
    """:meth:`Run.step` on the current run (started from the environment if there is none)."""
    _run().step(step, **metrics)


def log(**metrics: Any) -> None:
    """:meth:`Run.log` on the current run (started from the environment if there is none)."""
    _run().log(**metrics)


def epoch(epoch: float) -> None:
    """:meth:`Run.epoch` on the current run (started from the environment if there is none)."""
    _run().epoch(epoch)


def track(iterable: Iterable[T], total: int | None = None) -> Iterator[T]:
    """:meth:`Run.track` on the current run (started from the environment if there is none)."""
    return _run().track(iterable, total)


def evaluating() -> _Evaluating:
    """:meth:`Run.evaluating` on the current run (started from the environment if there is none)."""
    return _run().evaluating()


def finish(state: FinalState = "finished", reason: str = "") -> bool:
    """:meth:`Run.finish` on the current run; ``False`` when there is none."""
    return _current.finish(state, reason) if _current is not None else False


def _settle(metrics: dict[str, Any]) -> None:
    """Read one-element CPU torch tensors now; keep other tensors without their autograd graph.

    Why not keep a CPU tensor by reference until the sender reads it: its storage was allocated in
    the middle of the step's activations, and a window of such small live blocks pins glibc's heap,
    so every following step's activations land on fresh pages (in the benchmark's PyTorch loop the
    heap grew by about 0.35 MiB a step, 100 MiB over a 0.5 s window, with three times the page
    faults, and steps/s fell accordingly). ``.item()`` on a CPU tensor is a copy of one number
    (about 0.2 us) and waits for no device. A pinned tensor may still be the target of an
    asynchronous copy from a GPU, so it waits for the sender like an accelerator tensor; so do
    tensor subclasses (a ``DTensor``'s ``item()`` would be a collective). ``detach()`` drops the
    graph (and whatever it saved for backward) without a device synchronisation.
    """
    for name, value in metrics.items():
        cls = value.__class__
        kind = _kinds.get(cls)
        if kind is None:
            kind = _TORCH_TENSOR if cls.__name__ == "Tensor" and cls.__module__ == "torch" else 0
            if len(_kinds) < 256:
                _kinds[cls] = kind
        if kind == _TORCH_TENSOR:
            try:
                if value.is_cpu and value.numel() == 1 and not _maybe_copying(value):
                    metrics[name] = value.item()
                elif value.requires_grad:
                    metrics[name] = value.detach()
            except Exception:  # the sender reads it, or drops it with its warning
                pass


def _maybe_copying(tensor: Any) -> bool:
    """Whether a CPU tensor is pinned, so possibly still the target of a ``non_blocking`` copy.

    Only asked once CUDA is initialised: pinned memory needs it, and on some torch versions
    ``is_pinned()`` itself would initialise CUDA (a context on the GPU, and a poisoned ``fork()``).
    """
    return bool(sys.modules["torch"].cuda.is_initialized() and tensor.is_pinned())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _exit_state(exc_type: type[BaseException] | None, exc: BaseException | None) -> tuple[FinalState, str]:
    if exc_type is None:
        return "finished", ""
    if issubclass(exc_type, KeyboardInterrupt):
        return "stopped", "KeyboardInterrupt"
    if issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (None, 0):
        return "finished", ""
    return "failed", f"{exc_type.__name__}: {exc}"[:_MAX_REASON]


# --------------------------------------------------------------------------- process-wide hooks


def _install_process_hooks(handle_sigterm: bool) -> None:
    """At exit, on an uncaught exception, on SIGTERM and after fork(): once per process."""
    global _process_hooks_installed
    import atexit

    if _process_hooks_installed:
        return
    _process_hooks_installed = True
    atexit.register(_at_exit)
    previous_hook = sys.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        _uncaught.append((exc_type, exc))
        previous_hook(exc_type, exc, tb)

    sys.excepthook = excepthook
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    if handle_sigterm:
        _install_sigterm()


def _at_exit() -> None:
    exc_type, exc = _uncaught[-1] if _uncaught else (None, None)
    state, reason = _exit_state(exc_type, exc)
    for run in list(_ACTIVE):
        try:
            run.finish(state, reason or "the process exited")
        except Exception:
            pass


def _after_fork_in_child() -> None:
    global _current
    for run in list(_ACTIVE):
        run._after_fork_in_child()
    _ACTIVE.clear()
    _current = None


_in_sigterm = False
"""The SIGTERM handler is running (a second SIGTERM returns at once instead of entering it again)."""


def _flush_on_sigterm() -> None:
    """Send every run's final report (``stopped``), waiting at most the longest flush timeout.

    A signal handler runs in the main thread between two of its bytecodes, which may be inside a
    lock: an ``Event``'s while ``finish()`` waits for its flush, the logging module's while it logs.
    Waiting on one of those here would never end. So the finishing happens in a thread of its own
    (started with ``_thread``, which takes no lock of ``threading``), and this handler only polls
    plain flags (:attr:`Sender.finished`) until they are set or the time is up.
    """
    import _thread

    runs = list(_ACTIVE)
    found = [run._sender for run in runs] + list(_FINISHING.values())
    senders = [s for s in found if s is not None and s.alive]
    if not senders:
        return
    timeout = max(run._flush_timeout for run in runs + list(_FINISHING))

    def finish_all() -> None:
        for run in runs:
            try:
                run.finish("stopped", "SIGTERM")
            except Exception:
                pass

    if runs:
        try:
            _thread.start_new_thread(finish_all, ())
        except RuntimeError:  # no thread to spare: the process ends without its final report
            return
    deadline = time.monotonic() + timeout + 1.0
    while time.monotonic() < deadline and not all(s.finished for s in senders):
        time.sleep(0.005)


def _install_sigterm() -> None:
    import signal

    if threading.current_thread() is not threading.main_thread():
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return
    if previous is signal.SIG_IGN:
        return

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        global _in_sigterm
        if _in_sigterm:  # a SIGTERM during the first one's final flush: that one is on its way out
            return
        _in_sigterm = True
        try:
            _flush_on_sigterm()
        finally:
            _in_sigterm = False
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        pass
