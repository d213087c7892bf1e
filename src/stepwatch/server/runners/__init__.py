"""Runners: what starts, watches and stops jobs. The Kubernetes runner (Kubeflow TrainJobs) lives here;
the local runner is the ``stepwatch run`` command on the CLI side."""
