"""``graphmode report``: one self-contained HTML report of a measurement campaign.

Modules: :mod:`.data` (datasets → cells, verdicts, headline, Pareto points; no plotting),
:mod:`.decision` (the trained model: loading, cross-validation, decision map over a feature grid),
:mod:`.figures` (plotly figures), :mod:`.html` (tables and the page), :mod:`.build` (end to end).
plotly is imported only when a report is built (``pip install 'graphmode[report]'``).
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
