"""Live updates: the in-process broadcaster behind ``GET /api/v1/events`` (:mod:`.broadcaster`), what every
publisher sends through it in the shapes the API reads back (:mod:`.publish`: a job, its new points, its
events), its link to the other replicas on one PostgreSQL database (:mod:`.replicas`), and memory given back
after streams close (:mod:`.memory`).

The route is :mod:`..api.routes.events`. It uses :mod:`..store` (the replicas' channel, the records) and
:mod:`..views` (the shapes), the floors below it. Nothing is imported here.
"""
