"""Live updates: the in-process broadcaster behind ``GET /api/v1/events`` (:mod:`.broadcaster`) and its link
to the other replicas on one PostgreSQL database (:mod:`.replicas`).

What is published, in which shape, is :mod:`..ingest.publish`'s; the route is :mod:`..api.routes.events`.
It uses :mod:`..store` (the replicas' channel) and :mod:`..serving.memory`, nothing else of the server.
Nothing is imported here.
"""
