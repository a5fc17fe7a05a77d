"""The service's own Prometheus metrics (``GET /metrics``), in a registry of its own per app.

* ``graphmode_http_requests_total{method,route,status}`` and
  ``graphmode_http_request_duration_seconds{method,route}``: every HTTP request, labelled by the route
  *template* (``/v1/models/{model_id}``), so label cardinality stays bounded; ``unmatched`` for 404s;
* ``graphmode_recommendations_total{mode,model_id,source}``: answers by chosen mode;
* ``graphmode_recommend_compute_seconds``: the in-process ``Recommender.recommend`` time;
* ``graphmode_model_info{model_id,gpu,vllm_version,synthetic,default}`` (1 per loaded model),
  ``graphmode_models_loaded``, ``graphmode_model_reloads_total{result}``;
* ``graphmode_jobs_total{kind,status}``, ``graphmode_job_running``;
* ``graphmode_service_info{version}`` and the standard ``process_*`` metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from graphmode import __version__

if TYPE_CHECKING:
    from graphmode.service.state import LoadedModels

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)
COMPUTE_BUCKETS = (0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.05)


class ServiceMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        self.requests = Counter(
            "graphmode_http_requests", "HTTP requests served", ["method", "route", "status"], registry=r
        )
        self.latency = Histogram(
            "graphmode_http_request_duration_seconds",
            "HTTP request latency inside the server, first byte received to response sent",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.recommendations = Counter(
            "graphmode_recommendations",
            "Recommendations answered",
            ["mode", "model_id", "source"],
            registry=r,
        )
        self.compute = Histogram(
            "graphmode_recommend_compute_seconds",
            "In-process Recommender.recommend time",
            buckets=COMPUTE_BUCKETS,
            registry=r,
        )
        self.model_info = Gauge(
            "graphmode_model_info",
            "Loaded selector models (value 1)",
            ["model_id", "gpu", "vllm_version", "synthetic", "default"],
            registry=r,
        )
        self.shed = Counter("graphmode_requests_shed", "Requests answered 503 at once: past capacity",
                            ["reason"], registry=r)
        self.models_loaded = Gauge("graphmode_models_loaded", "Models in memory", registry=r)
        self.reloads = Counter("graphmode_model_reloads", "Model (re)loads", ["result"], registry=r)
        self.jobs = Counter("graphmode_jobs", "Background jobs finished", ["kind", "status"], registry=r)
        self.job_running = Gauge("graphmode_job_running", "1 while a background job runs", registry=r)
        info = Gauge("graphmode_service_info", "graphmode service build info", ["version"], registry=r)
        info.labels(version=__version__).set(1)

    def set_models(self, models: LoadedModels) -> None:
        self.model_info.clear()
        default_id = models.default.model_id if models.default is not None else None
        for model_id, rec in models.by_id.items():
            card = rec.card
            self.model_info.labels(
                model_id=model_id,
                gpu=card.gpu_name or "",
                vllm_version=card.vllm_version or "",
                synthetic=str(card.synthetic).lower(),
                default=str(model_id == default_id).lower(),
            ).set(1)
        self.models_loaded.set(len(models.by_id))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
