"""``graphmode report``: one HTML page that leads with the decision, then the evidence behind it.

Data: :mod:`.load` (datasets → views), :mod:`.views` (cells, workloads, shapes: what the page shows),
:mod:`.analysis` (per-workload verdicts, the headline, the Pareto front), :mod:`.configs` (rows per deployment
configuration and vLLM release, each raced on its own rows), :mod:`.shapes` (model-shape names).
Sections: :mod:`.decide` (per GPU × vLLM release: race verdicts and the bundled model's answers),
:mod:`.decision` (the trained model: loading, cross-validation, decision map), :mod:`.capture` (capture
sizes), :mod:`.race` (a model card's race verdicts), :mod:`.arms` (each arm's engine memory and start-up).
Output: :mod:`.table` and :mod:`.tables` (tables as data), :mod:`.figures` (plotly figures), :mod:`.html`
(the Jinja page, autoescaped), :mod:`.build` (end to end). The package is the ``report`` extra
(``pip install 'graphmode[report]'``): the CLI imports it only when a report is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphmode.report.build import ReportResult, build_report, default_datasets

__all__ = ["ReportResult", "build_report", "default_datasets"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from graphmode.report import build

        return getattr(build, name)
    raise AttributeError(f"module 'graphmode.report' has no attribute {name!r}")
