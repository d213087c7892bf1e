"""The HTTP face of the server: the routes (:mod:`.routes`, one module per area) and what they stand on.

Who is asking and what they may do (:mod:`.auth`); what every route reads from a request (:mod:`.request`:
the app's services, the bounded body, the bearer token, names); request bodies declared once (:mod:`.bodyspec`,
the native API's in :mod:`.bodies`); the one error shape (:mod:`.errors`); the guard in front of every
route (:mod:`.guard`), which hands the report endpoint straight to it, past Starlette's middleware and router
(:mod:`.direct`); JSON answers encoded fast (:mod:`.responses`); the OpenAPI description
(:mod:`.openapi`) and the Prometheus exposition of ``GET /metrics`` (:mod:`.prometheus`).

Routes parse, authorise and answer: a report's trip is :mod:`..ingest`'s and the shape of what goes on the
wire is :mod:`..views`'. This package may use every other server package. The others use little of it: the
body declarations (the policies declare theirs with :mod:`.bodyspec`), the error shape (services, the
serving process) and the identities (:mod:`.auth`: settings, services, the Kubernetes runner). Nothing is
imported here.
"""
