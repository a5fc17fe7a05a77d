"""Saving and loading model artifacts with skops, never pickle.

Loading is guarded three ways before a single object is built:

1. the file's sha256 must equal the one in the model card (a changed or swapped file is refused);
2. the bytes must be a skops archive (zip); anything else, a pickle or joblib file in particular, is
   refused without being parsed;
3. every type the archive needs beyond skops' defaults must be in :data:`TRUSTED_TYPES`, an explicit
   allow-list; ``skops.io.load`` is then called with exactly that list.

The bytes are read once and verified and loaded from memory, so the file cannot change in between.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import skops.io as sio

from graphmode.core.errors import ModelError
from graphmode.selector.card import ArtifactInfo

# Types (beyond skops' own defaults) a selector artifact may hold. Nothing else is ever loaded.
TRUSTED_TYPES: list[str] = [
    "graphmode.selector.estimators.ColumnwiseRegressor",
    "sklearn.tree._tree.Tree",
    "sklearn.neighbors._kd_tree.KDTree",
    "sklearn.metrics._dist_metrics.EuclideanDistance64",
]
_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_HINT = (b"\x80", b"(", b"c", b"]", b"}")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save_artifact(obj: Any, path: Path) -> ArtifactInfo:
    """Dump ``obj`` with skops and describe it for the card. Refuses objects outside the allow-list."""
    buf = io.BytesIO()
    sio.dump(obj, buf)
    data = buf.getvalue()
    needed = sorted(sio.get_untrusted_types(data=data))
    unknown = [t for t in needed if t not in TRUSTED_TYPES]
    if unknown:
        raise ModelError(f"artifact would hold types outside the allow-list: {', '.join(unknown)}")
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return ArtifactInfo(file=path.name, sha256=sha256_bytes(data), bytes=len(data), trusted_types=needed)


def load_artifact(path: Path, info: ArtifactInfo) -> Any:
    """Verify ``path`` against its card entry and load it with skops (see the module docstring)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelError(f"cannot read model artifact {path}: {exc.strerror or exc}") from exc
    digest = sha256_bytes(data)
    if digest != info.sha256:
        raise ModelError(
            f"model artifact {path} does not match its card (sha256 {digest[:16]}…, card says "
            f"{info.sha256[:16]}…): it was changed or replaced; refusing to load it"
        )
    if not data.startswith(_ZIP_MAGIC):
        kind = "a pickle/joblib file" if data[:1] in _PICKLE_HINT else "not a skops archive"
        raise ModelError(f"model artifact {path} is {kind}; only skops archives are loaded, never pickle")
    try:
        needed = sio.get_untrusted_types(data=data)
    except Exception as exc:
        raise ModelError(f"model artifact {path} is not a readable skops archive: {exc}") from exc
    unknown = sorted(t for t in needed if t not in TRUSTED_TYPES)
    if unknown:
        raise ModelError(f"model artifact {path} holds types outside the allow-list: {', '.join(unknown)}")
    try:
        return sio.load(io.BytesIO(data), trusted=TRUSTED_TYPES)
    except Exception as exc:
        raise ModelError(f"model artifact {path} could not be loaded: {type(exc).__name__}: {exc}") from exc
