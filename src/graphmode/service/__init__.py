"""``graphmode serve``: the selector as an HTTP service (FastAPI).

::

    from graphmode.service.app import create_app
    app = create_app(settings)          # models load in the lifespan, once; POST /v1/reload swaps them

Layout: :mod:`.app` (factory, lifespan, middleware wiring), :mod:`.state` (loaded models, swapped
atomically), :mod:`.deps` (dependencies: state, models, bearer token), :mod:`.schemas` (request and
response bodies), :mod:`.routers` (recommend, models, jobs, health), :mod:`.jobs` (background retrain
jobs), :mod:`.metrics` (the service's own Prometheus metrics), :mod:`.middleware` (body-size limit and
read deadline, catch-all 500, request metrics), :mod:`.server` (uvicorn with slow-client limits, as
``graphmode serve`` runs it), :mod:`.redact` (no host paths on open endpoints).
"""
