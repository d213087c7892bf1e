"""Integrations: one leaf module per framework, each turning the framework's events into stepwatch calls.

==========================================  ===============================================================
module                                      what it gives
==========================================  ===============================================================
``stepwatch.integrations.transformers``     ``StepwatchCallback`` for ``transformers.Trainer`` (and TRL)
``stepwatch.integrations.accelerate``       ``init_for(accelerator)``: a run for a custom Accelerate loop
``stepwatch.integrations.lightning``        a Lightning callback (``lightning`` and ``pytorch_lightning``)
``stepwatch.integrations.keras``            a Keras callback
``stepwatch.integrations.torch``            helpers for custom PyTorch loops (DDP, FSDP)
``stepwatch.integrations.jax``              helpers for JAX/Flax loops
``stepwatch.integrations.xgboost``          an XGBoost callback
``stepwatch.integrations.lightgbm``         a LightGBM callback
``stepwatch.integrations.tqdm``             progress bars that report
==========================================  ===============================================================

Each module imports its framework and nothing imports it but the user and the auto-instrumentation
hook (:mod:`stepwatch.integrations._auto`), which loads it by name after the framework is imported
and calls its ``install()``. The contract every integration with a trainer follows:

``install() -> bool``
    Idempotent. Patches the framework so that every trainer (fit, loop) created afterwards gets the
    stepwatch callback unless the user already added one; returns ``True`` when it installed.

Every callback body is wrapped in :func:`stepwatch.integrations._guard.guarded`: a reporting failure
is logged once and training goes on. This package's ``__init__`` imports nothing.
"""
