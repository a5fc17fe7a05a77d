"""The API's routers: :mod:`.recommend`, :mod:`.models` (cards, reload), :mod:`.jobs` (retrain),
:mod:`.health` (``/healthz``, ``/metrics``)."""
