"""The serving process: what ``stepwatch server`` sets up around the app.

The garbage collector's settings (:mod:`.process`) and uvicorn's HTTP protocol with bounds on a request's
head (:mod:`.slow_clients`). Nothing here knows a job: it uses only the error shape (:mod:`..api.errors`).
The two names the CLI serves with are imported here. Freed memory given back to the system is the live
stream's (:mod:`..live.memory`).
"""

from .process import tune_for_serving
from .slow_clients import protocol_class

__all__ = ["protocol_class", "tune_for_serving"]
