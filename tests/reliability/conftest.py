"""The reliability suite's settings: Hypothesis profiles sized for CI, larger ones for local runs.

``STEPWATCH_HYPOTHESIS_PROFILE`` picks one (read at import: the autouse fixture of ``tests/conftest.py``
clears ``STEPWATCH_*`` before each test): ``ci`` (default, a few seconds per property, derandomized),
``thorough`` (10x) or ``soak`` (100x), both random. No deadline: CI machines are shared and slow at times.
The API fuzzing follows the profile too (``STEPWATCH_FUZZ_EXAMPLES`` sets its size).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
# CI is derandomized: the same examples on every run, so a red CI always means a change broke something
# (a shared CI that fails at random blocks everyone); the larger profiles explore afresh each run.
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=600, **_COMMON)
settings.register_profile("soak", max_examples=6000, **_COMMON)
settings.load_profile(os.environ.get("STEPWATCH_HYPOTHESIS_PROFILE", "ci"))
