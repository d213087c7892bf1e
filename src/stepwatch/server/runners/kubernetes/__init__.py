"""The Kubernetes runner: Kubeflow Trainer TrainJobs watched, mirrored, written back and stopped.

Decisions are pure (:mod:`.objects`, :mod:`.reconcile`: observed state in, actions out); the I/O is
thin (:mod:`.api` talks to the API server with the official ``kubernetes`` client, an extra;
:mod:`.runner` carries out the actions). See docs/kubernetes.md.
"""
