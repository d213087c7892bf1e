"""The routes of the server, one module per area: ingest, jobs, and the live stream with the API docs."""
