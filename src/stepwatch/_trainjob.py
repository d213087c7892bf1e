"""Whether this process runs in a pod of a Kubeflow TrainJob, and on which of its nodes: from the environment.

Kubeflow Trainer v2 runs a TrainJob as a JobSet whose trainer replicated job is called ``node``: each of
its pods is a pod of an indexed Job. What the trainer container ``node`` finds in its environment
(kubeflow/trainer, ``pkg/constants/constants.go`` and ``pkg/runtime/framework/plugins/``):

* in every pod of Kubernetes, ``KUBERNETES_SERVICE_HOST`` (the kubelet); in every pod of an indexed
  Job, ``JOB_COMPLETION_INDEX`` (the Job controller), and JobSet names the pod's host
  ``<trainjob>-node-<job index>-<pod index>``;
* the torch plugin: ``PET_NNODES``, ``PET_NODE_RANK`` (the completion index), ``PET_NPROC_PER_NODE``,
  ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``; the JAX plugin: ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``;
  the XGBoost plugin: ``DMLC_NUM_WORKER``, ``DMLC_TASK_ID``; the TrainJobStatus plugin (upstream's
  status server): ``KUBEFLOW_TRAINER_SERVER_URL``.

A TrainJob pod is a pod of Kubernetes with one of the plugins' variables, or with a completion index and
a ``node`` JobSet host name (a runtime without an ML policy); its node is the first of ``PET_NODE_RANK``,
``JAX_PROCESS_ID``, ``DMLC_TASK_ID``, ``JOB_COMPLETION_INDEX`` that is an integer (0 when none is).

This module imports ``os`` only: the auto-instrumentation hook asks it at interpreter start.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # not `from typing import ...`: this module is read at interpreter start
    from collections.abc import Mapping

__all__ = ["TRAINJOB_VARIABLES", "trainjob_node"]

_IN_KUBERNETES = "KUBERNETES_SERVICE_HOST"
_PLUGIN_VARIABLES = ("PET_NNODES", "JAX_NUM_PROCESSES", "DMLC_NUM_WORKER", "KUBEFLOW_TRAINER_SERVER_URL")
"""Set by one of Kubeflow Trainer's runtime plugins in the trainer container of every TrainJob pod."""
_NODE_VARIABLES = ("PET_NODE_RANK", "JAX_PROCESS_ID", "DMLC_TASK_ID", "JOB_COMPLETION_INDEX")
"""The pod's index among the TrainJob's nodes, by plugin; the completion index is the same number."""
TRAINJOB_VARIABLES = (*_PLUGIN_VARIABLES, *_NODE_VARIABLES)
"""Every variable that can make a process look like a TrainJob's (a test's clean environment drops them)."""


def trainjob_node(environ: Mapping[str, str] | None = None) -> int | None:
    """The index of this pod among its TrainJob's nodes (0: the first one), or ``None`` outside a TrainJob."""
    env = os.environ if environ is None else environ
    if not env.get(_IN_KUBERNETES):
        return None
    plugin = any(env.get(name) for name in _PLUGIN_VARIABLES)
    if not plugin and not (env.get("JOB_COMPLETION_INDEX") and _jobset_node_host(env.get("HOSTNAME", ""))):
        return None
    for name in _NODE_VARIABLES:
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    return 0


def _jobset_node_host(host: str) -> bool:
    """``<trainjob>-node-<job index>-<pod index>``: a pod of a JobSet's replicated job ``node``."""
    parts = host.rsplit("-", 3)
    return len(parts) == 4 and parts[0] != "" and parts[1] == "node" and parts[2].isdigit() and parts[3].isdigit()
