"""The stepwatch server: ingest, storage, live updates and the API (``pip install 'stepwatch[server]'``).

Build the ASGI app with :func:`create_app`; ``stepwatch server`` serves it with uvicorn.

A report's way, package by package: :mod:`.api` (the routes parse, authorise and answer) → :mod:`.ingest`
(the one service: write to :mod:`.store`, estimate the ETA, assess health with :mod:`.analysis`, apply
:mod:`.policies`) → :mod:`.live` (the stream), everything on the wire in the shapes of :mod:`.views`.
Beside them: :mod:`.notify` (webhooks, chat), :mod:`.runners` (Kubernetes TrainJobs), :mod:`.serving` (the
serving process) and ``web/`` (the dashboard's files). At this root only the factory (:mod:`.app`), the
settings (:mod:`.settings`) and what the app's parts share (:mod:`.services`).
"""

from .app import create_app
from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
