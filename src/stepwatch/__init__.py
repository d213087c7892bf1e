"""stepwatch: live progress, ETA, health and cost of training jobs.

This package is what a training process imports. It uses the standard library only::

    import stepwatch

    run = stepwatch.init(job="resnet50", total_steps=10_000)
    for batch in run.track(loader):
        loss = train_step(batch)
        run.log(loss=loss)          # or run.step(loss=loss) when you count steps yourself
    run.finish()

Configuration comes from the arguments of :func:`init`, then ``STEPWATCH_*`` environment variables,
then the upstream Kubeflow Trainer ones (``KUBEFLOW_TRAINER_SERVER_URL``...). Without an endpoint
every call is a no-op, except on rank 0 of a Kubeflow TrainJob's pod (or with ``STEPWATCH_METRICS_PORT``),
which serves Red Hat OpenShift AI's progression status and writes its termination message
(docs/openshift-ai.md). The server, the client and the CLI live in sub-packages that are imported
only when used.
"""

from ._run import Run, current, epoch, evaluating, finish, init, log, step, track
from ._version import __version__

__all__ = [
    "Run",
    "__version__",
    "current",
    "epoch",
    "evaluating",
    "finish",
    "init",
    "log",
    "step",
    "track",
]
