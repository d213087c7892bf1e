"""The routes, one module per area: reports and Kubeflow statuses (:mod:`.ingest`), pod tokens
(:mod:`.pod_tokens`), jobs, policies, costs, access (tokens, audit), the live stream (:mod:`.events`), what
the server says about itself (:mod:`.server_info`: version, API docs, health probe, metrics) and the web
dashboard (:mod:`.web`)."""
