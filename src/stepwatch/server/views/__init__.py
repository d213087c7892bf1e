"""What goes on the wire: one serialiser per thing a client reads (:mod:`.serialisers`: a job with the figures
derived from it at read time, a metric point, an event), the figures themselves, computed once for every reader
(:mod:`.figures`: progress percent, the ETA shown, live rates, cost, waste, the health timeline), and history
downsampled for a chart (:mod:`.history`).

A package of its own rather than part of :mod:`..api`, because the API is one user among three: the live
stream (:mod:`..live.publish`) and the policies (costs and ETAs in notifications) show the same shapes and
must not depend on the HTTP face. It uses only :mod:`..analysis` (pure), :mod:`..store` (the records) and the
protocol. Nothing is imported here.
"""
