"""What the open endpoints may say about the host: no absolute paths (the models directory, a training
host's model folders in a card's vLLM arguments), only their last component.

The health check, the model list, the model cards and error messages answer anyone who can reach the
service; where the models live, or where the training host kept its weights, is none of their business
(issue 12). Token holders' job results keep full paths.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

# An absolute (or home-relative) path: at the start or after a separator that cannot be part of a path
# word (space, quote, '=', '(', ...). "http://x/y" is left alone: its '/' follows ':'.
_ABS_PATH = re.compile(r"(?<![\w:/.\-~])~?/(?:[^\s/'\"(),;:]+/)*([^\s/'\"(),;:]*)")
# A relative path: two or more separators, or a file name with an extension ("tok/s" is a unit).
_REL_PATH = re.compile(r"[\w.\-+@]+(?:/[\w.\-+@]+){2,}|[\w.\-+@]+(?:/[\w.\-+@]+)*/[\w\-+@]+\.\w+")


def redact_paths(text: str) -> str:
    """``text`` with every absolute path replaced by its last component (``/tmp/gm/model-x`` → ``model-x``)."""
    return _ABS_PATH.sub(lambda m: m.group(1) or "/", text)


def _redact_value(value: str) -> str:
    # A path-valued field, relative or absolute (a card's dataset source, a vLLM argument): its basename;
    # anything else (URLs, prose) only loses absolute paths.
    parts = value.split(" + ")
    if all(_REL_PATH.fullmatch(p.lstrip("~/")) for p in parts if p):
        return " + ".join(PurePath(p).name for p in parts)
    return redact_paths(value)


def redact_tree(value: Any) -> Any:
    """A JSON-like value with every path-looking string reduced to its last component."""
    if isinstance(value, str):
        return _redact_value(value)
    if isinstance(value, list):
        return [redact_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: redact_tree(v) for k, v in value.items()}
    return value
