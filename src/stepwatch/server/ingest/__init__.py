"""Ingest: a report's one trip on the server (:mod:`.service`) and what it publishes (:mod:`.publish`).

Nothing is imported here, so that the analysis and the policies can import :mod:`.publish` while
:mod:`.service` imports them.
"""
