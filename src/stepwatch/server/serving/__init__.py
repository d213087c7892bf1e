"""The serving process: what ``stepwatch server`` sets up around the app.

The garbage collector's settings (:mod:`.process`), uvicorn's HTTP protocol with bounds on a request's
head (:mod:`.slow_clients`), and uvicorn's server that ends the live streams when a stop begins
(:mod:`.stopping`). Nothing here knows a job: it uses only the error shape (:mod:`..api.errors`) and the
live stream's broadcaster. The names the CLI serves with are imported here. Freed memory given back to
the system is the live stream's (:mod:`..live.memory`).
"""

from .process import tune_for_serving
from .slow_clients import protocol_class
from .stopping import Server, serve

__all__ = ["Server", "protocol_class", "serve", "tune_for_serving"]
