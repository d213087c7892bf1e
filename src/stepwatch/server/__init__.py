"""The stepwatch server: ingest, storage, live updates and the API (``pip install 'stepwatch[server]'``).

Build the ASGI app with :func:`create_app`; ``stepwatch server`` serves it with uvicorn.

The parts stand on floors: each imports only from its own floor and the ones below, never up
(``tests/test_import_cycles.py`` holds this order: no import goes up). Read from the top,
the floors are the trip of a report; from the bottom, what each part needs to be understood:

1. :mod:`.serving` — the process around the app: uvicorn's protocol with bounds on slow clients, the
   collector's settings. It uses only the error shape.
2. :mod:`.app` — the factory: builds the parts from the settings, mounts the routes, maps errors to HTTP.
3. :mod:`.settings` — what the server is told (flags, environment, files), read into the parts' own types.
4. :mod:`.api` — the routes parse, authorise and answer; a report is handed to ingest.
5. :mod:`.runners` — the other way in: Kubernetes TrainJobs observed, their status turned into reports.
6. :mod:`.services` — the collaborators the routes and the runner share (the ingest service reads them
   through its own protocol).
7. :mod:`.ingest` — a report's trip: write it, estimate the ETA, assess health (the health monitor keeps
   the rules per live job and sweeps them for stalls), apply the policies, publish.
8. :mod:`.policies` — what to do when a job goes bad (events, commands, notifications).
9. :mod:`.notify` — notifications leave the server (webhooks, chat); it knows no other part.
10. :mod:`.live` — the stream every reader follows, and what is published on it, in the API's shapes.
11. :mod:`.views` — the shapes on the wire, and the figures shown (progress, ETA, cost).
12. :mod:`.store` — the jobs, reports and history kept (SQLite, PostgreSQL) behind one interface, and how
    store calls leave the event loop (:mod:`.store.offload`).
13. :mod:`.analysis` — pure arithmetic on a job's history: health verdicts, cost, ETA; no I/O.

Why this order: a part sits above what it calls at run time. The store keeps roll-ups computed by
analysis; views shape what the store returns; live carries views; policies publish and notify; ingest
applies the policies; the routes and the runner feed ingest; the settings build the API's authenticator and
guard; the app assembles all; the serving process runs the app. ``web/`` holds the dashboard's files.
"""

from .app import create_app
from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
