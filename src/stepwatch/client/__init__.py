"""The stepwatch SDK: read, watch and act on training jobs from code (``pip install 'stepwatch[client]'``).

::

    from stepwatch.client import Client

    client = Client()                      # STEPWATCH_SERVER, else http://127.0.0.1:8642
    for job in client.jobs(state="running"):
        print(job["name"], job["progress"]["percent"])
    client.stop("llama-sft", reason="plateau")
"""

from ._client import DEFAULT_SERVER, Client, server_url
from ._errors import ApiError, Conflict, Forbidden, NotFound, ServerUnreachable, StepwatchError

__all__ = [
    "DEFAULT_SERVER",
    "ApiError",
    "Client",
    "Conflict",
    "Forbidden",
    "NotFound",
    "ServerUnreachable",
    "StepwatchError",
    "server_url",
]
