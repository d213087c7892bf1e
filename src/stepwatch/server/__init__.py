"""The stepwatch server: ingest, storage, live updates and the API (``pip install 'stepwatch[server]'``).

Build the ASGI app with :func:`create_app`; ``stepwatch server`` serves it with uvicorn.
"""

from .app import create_app
from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
