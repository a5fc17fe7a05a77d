"""``graphmode check``: the whole CUDA graph configuration a vLLM command line gets, before it starts.

From the args, the served model's config.json and the vLLM release alone (no GPU, no traffic): the mode vLLM
will really run, the capture list it will build and which decode steps that list leaves eager, and what the
graphs cost in start-up seconds, GiB and KV cache tokens. Each finding has a severity, its evidence and a fix
as args (:mod:`graphmode.check.findings`); :func:`graphmode.check.rules.check_deployment` makes them.
"""

from graphmode.check.findings import CheckReport, Finding, Severity
from graphmode.check.rules import CheckInputs, check_deployment

__all__ = ["CheckInputs", "CheckReport", "Finding", "Severity", "check_deployment"]
