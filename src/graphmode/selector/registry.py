"""The model registry: one folder per (GPU, vLLM version, model shape) under ``models/``.

Each folder holds ``card.json``, ``model.skops``, ``cv.json`` and ``table.json``; the card names the
dataset files it was trained on (under ``models/profiles/``) by path and sha256. A folder without a
readable card is listed as broken and never used.

Choosing a model for a target fingerprint (GPU, vLLM version, model config; any part may be unknown):

1. an explicit model id (argument, or ``GRAPHMODE_SELECTOR__MODEL_ID``) wins; differences from the
   target are still reported;
2. otherwise every model is scored on the parts of the target that are known: same GPU (8), same vLLM
   version (4, or 2 for the same major.minor), same model config (4; else 1 for the same architecture
   and 1 for a parameter count within a factor 1.5). The best wins;
3. ``exact`` means GPU, vLLM and model config are all known and equal; ``compatible`` that nothing known
   differs; ``nearest`` that something differs (a warning says what); ``unspecified`` that nothing of
   the target is known (no GPU here, no server), and the newest model with the most rows is used.

A model is **stale** for a target when its GPU, driver, CUDA, vLLM version or model config differ:
``graphmode retrain`` profiles (resuming) and trains for the new fingerprint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from graphmode.core.errors import ModelError
from graphmode.core.records import Fingerprint
from graphmode.selector.card import CARD_FILE, ModelCard

MatchKind = Literal["exact", "compatible", "nearest", "unspecified", "explicit"]


@dataclass
class ModelEntry:
    model_id: str
    folder: Path
    card: ModelCard | None
    error: str | None = None


class FingerprintMatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: str
    kind: MatchKind
    score: float = 0.0
    differences: list[str] = Field(default_factory=list, description="what differs between model and target")
    unknown: list[str] = Field(default_factory=list, description="target parts not known, not compared")
    stale: bool = False
    warnings: list[str] = Field(default_factory=list)
    other_gpu: str | None = Field(None, description="the model's GPU when the target names another: its verdicts "
                                                    "were measured there, not on the target's")
    release_assumed: str | None = Field(None, description="the model's release when the target names none: the "
                                                          "newest profiled release answers")


def default_models_dir() -> Path:
    from graphmode.core.settings import load_settings

    return load_settings().selector.models_dir


def list_models(models_dir: Path | None = None) -> list[ModelEntry]:
    """Every model folder under ``models_dir``, with its card or the reason it cannot be read."""
    root = Path(models_dir) if models_dir is not None else default_models_dir()
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and (p / CARD_FILE).is_file()):
        try:
            out.append(ModelEntry(folder.name, folder, ModelCard.load(folder)))
        except ModelError as exc:
            out.append(ModelEntry(folder.name, folder, None, str(exc)))
    return out


def model_card(model_id: str, models_dir: Path | None = None) -> ModelCard:
    root = Path(models_dir) if models_dir is not None else default_models_dir()
    return ModelCard.load(_folder(root, model_id))


def _folder(root: Path, model_id: str) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9_.\-+]+", model_id) or model_id in (".", ".."):
        raise ModelError(f"invalid model id {model_id!r}")
    folder = root / model_id
    if not (folder / CARD_FILE).is_file():
        known = ", ".join(e.model_id for e in list_models(root)) or "none"
        raise ModelError(f"no model {model_id!r} under {root} (known: {known})")
    return folder


def _minor(v: str | None) -> str | None:
    if not v:
        return None
    m = re.match(r"(\d+)\.(\d+)", v)
    return f"{m.group(1)}.{m.group(2)}" if m else v


def _closeness(a: str, b: str) -> float:
    """Below 1, more for nearer releases: an unprofiled vLLM gets the model of the release closest to it."""
    def parts(v: str) -> tuple[int, int] | None:
        m = re.match(r"(\d+)\.(\d+)", v)
        return (int(m.group(1)), int(m.group(2))) if m else None

    pa, pb = parts(a), parts(b)
    if pa is None or pb is None:
        return 0.0
    return 0.5 / (1 + 100 * abs(pa[0] - pb[0]) + abs(pa[1] - pb[1]))


def _norm(v: str | None) -> str | None:
    return v.strip().lower() if isinstance(v, str) and v.strip() else None


def match_card(c: ModelCard, target: Fingerprint | None) -> FingerprintMatch:
    """How well model card ``c`` fits ``target`` (see the module docstring)."""
    if target is None or not any(
        [target.gpu_name, target.vllm_version, target.model_config_hash, target.model_architecture]
    ):
        return FingerprintMatch(
            model_id=c.model_id,
            kind="unspecified",
            unknown=["gpu", "vllm", "model"],
            warnings=[f"target fingerprint unknown (no GPU here, no server given): using {c.model_id}"],
        )
    best: FingerprintMatch | None = None
    for fp in c.fingerprints or [Fingerprint()]:
        m = _match_one(c.model_id, fp, target)
        if best is None or m.score > best.score:
            best = m
    assert best is not None
    return best


def _match_one(model_id: str, fp: Fingerprint, t: Fingerprint) -> FingerprintMatch:
    score = 0.0
    other_gpu: str | None = None
    diffs: list[str] = []
    unknown: list[str] = []
    stale: list[str] = []
    if _norm(t.gpu_name) is None:
        unknown.append("gpu")
    elif _norm(t.gpu_name) == _norm(fp.gpu_name):
        score += 8
    else:
        diffs.append(f"GPU {t.gpu_name} vs model's {fp.gpu_name}")
        other_gpu = fp.gpu_name or "an unknown GPU"
    if not t.vllm_version:
        unknown.append("vllm")
    elif t.vllm_version == fp.vllm_version:
        score += 4
    else:
        same_minor = _minor(t.vllm_version) == _minor(fp.vllm_version)
        score += 2 if same_minor else _closeness(t.vllm_version, fp.vllm_version or "")
        diffs.append(f"vLLM {t.vllm_version} vs model's {fp.vllm_version}")
    if not t.model_config_hash and not t.model_architecture:
        unknown.append("model")
    elif t.model_config_hash and t.model_config_hash == fp.model_config_hash:
        score += 4
    else:
        if t.model_architecture and t.model_architecture == fp.model_architecture:
            score += 1
        if t.num_params_b and fp.num_params_b and 1 / 1.5 <= t.num_params_b / fp.num_params_b <= 1.5:
            score += 1
        diffs.append(_model_difference(t, fp))
    for name in ("driver_version", "cuda_version"):
        tv, fv = getattr(t, name), getattr(fp, name)
        if tv and fv and tv != fv:
            stale.append(f"{name.replace('_', ' ')} {tv} vs model's {fv}")
    kind: MatchKind = "nearest" if diffs else ("exact" if not unknown else "compatible")
    warnings = []
    if diffs:
        warnings.append(
            f"no model matches the target exactly; using the nearest, {model_id}: " + "; ".join(diffs)
        )
    if stale:
        warnings.append("model is stale for this host: " + "; ".join(stale) + " (graphmode retrain)")
    return FingerprintMatch(
        model_id=model_id,
        kind=kind,
        score=score,
        differences=diffs + stale,
        unknown=unknown,
        stale=bool(diffs or stale),
        warnings=warnings,
        other_gpu=other_gpu,
    )


def _model_difference(t: Fingerprint, fp: Fingerprint) -> str:
    """How the target's model differs from the model's: architecture and size, and when those read alike,
    the config.json fields that change the computation (or that the configs differ, if one is unknown here)."""
    from graphmode.core.fingerprint import config_differences

    text = (f"model {t.model_architecture or '?'} ({_params(t)}) vs model's {fp.model_architecture or '?'} "
            f"({_params(fp)})")
    if t.model_architecture != fp.model_architecture:
        return text
    fields = config_differences(t.model_config_hash, fp.model_config_hash)
    if fields:
        return text + ": config.json differs in " + ", ".join(fields)
    if _params(t) != _params(fp):
        return text
    return (text + f": config.json differs in a field that changes the computation (shape {t.model_config_hash} "
            f"vs {fp.model_config_hash})")


def _params(fp: Fingerprint) -> str:
    return f"{fp.num_params_b:.2g}B params" if fp.num_params_b else "size unknown"


def select_model(
    models_dir: Path | None = None, model_id: str | None = None, target: Fingerprint | None = None
) -> tuple[ModelEntry, FingerprintMatch]:
    """The model to answer for ``target`` (see the module docstring); ModelError when there is none."""
    root = Path(models_dir) if models_dir is not None else default_models_dir()
    if model_id is None:
        from graphmode.core.settings import load_settings

        model_id = load_settings().selector.model_id
    if model_id:
        folder = _folder(root, model_id)
        c = ModelCard.load(folder)
        m = match_card(c, target)
        return ModelEntry(model_id, folder, c), m.model_copy(
            update={"kind": "explicit"}
        ) if m.kind != "exact" else m
    entries = [e for e in list_models(root) if e.card is not None]
    if not entries:
        broken = [f"{e.model_id}: {e.error}" for e in list_models(root) if e.error]
        hint = ("; broken: " + "; ".join(broken)) if broken else ""
        raise ModelError(f"no trained model under {root}: run `graphmode train --dataset PATH`{hint}")

    def key(e: ModelEntry) -> tuple[float, tuple[int, ...], int, str]:
        # among equal matches the newest vLLM release answers (what users run), then the most rows
        assert e.card is not None
        return (match_card(e.card, target).score, release_key(e.card.vllm_version), e.card.dataset.rows_used,
                e.card.created_at)

    chosen = max(entries, key=key)
    assert chosen.card is not None
    m = match_card(chosen.card, target)
    releases = {e.card.vllm_version for e in entries if e.card is not None and e.card.vllm_version}
    if (target is None or not target.vllm_version) and len(releases) > 1:
        m.release_assumed = chosen.card.vllm_version
        # said once, as the answer's typed release_assumed note, not as a warning about an unknown target
        m.warnings = [w for w in m.warnings if not w.startswith("target fingerprint unknown")]
    return chosen, m


def release_key(version: str | None) -> tuple[int, ...]:
    """A vLLM version as numbers for ordering (``0.33.0+cu130`` -> (0, 33, 0)); () when it has none."""
    return tuple(int(p) for p in re.findall(r"\d+", (version or "").split("+")[0])[:3])


def _server_base(url: str) -> str:
    base = url.rstrip("/")
    return base[: -len("/metrics")] if base.endswith("/metrics") else base


_VERSION = re.compile(r"[0-9][0-9A-Za-z.+_-]{0,63}")


def server_version(base_url: str, timeout: float = 5.0) -> str | None:
    """The vLLM version a running server reports on ``/version``, or None when it says none (best effort).

    Only that one page is fetched and nothing else is read: the service calls this for servers its
    callers name, and must not open local paths such a server chooses (unlike :func:`server_fingerprint`).
    """
    import httpx

    try:
        with httpx.Client(timeout=timeout) as client:
            r = client.get(_server_base(base_url) + "/version")
        if r.status_code != 200:
            return None
        version = r.json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    # only a version-shaped token: the answer quotes it, and what a server sends is otherwise never quoted
    if not isinstance(version, str) or not _VERSION.fullmatch(version.strip()):
        return None
    return version.strip()


def server_fingerprint(base_url: str, timeout: float = 5.0) -> dict[str, Any]:
    """What a running vLLM server says about itself: version and, if its model dir is readable here, shape.

    Best effort: every part that cannot be read is left out.
    """
    import httpx

    from graphmode.core.fingerprint import model_shape

    out: dict[str, Any] = {}
    base = _server_base(base_url)
    try:
        with httpx.Client(timeout=timeout) as client:
            r = client.get(base + "/version")
            if r.status_code == 200:
                version = r.json().get("version")
                # only a version-shaped token, as server_version: the answer quotes it (no escapes, no NUL)
                if isinstance(version, str) and _VERSION.fullmatch(version.strip()):
                    out["vllm_version"] = version.strip()
            r = client.get(base + "/v1/models")
            if r.status_code == 200:
                data = r.json().get("data") or []
                root = (data[0].get("root") or data[0].get("id")) if data else None
                if root:
                    out.update(
                        {k: v for k, v in model_shape(str(root)).items() if k in Fingerprint.model_fields}
                    )
    except (httpx.HTTPError, ValueError, AttributeError, IndexError):
        pass
    return out


def target_fingerprint(
    *,
    server_url: str | None = None,
    model_path: str | None = None,
    gpu_name: str | None = None,
    vllm_version: str | None = None,
    use_local_gpu: bool = True,
) -> Fingerprint:
    """The fingerprint to match models against, from what is given and what can be read here."""
    from graphmode.core.fingerprint import load_model_config, shape_of_config
    from graphmode.profiling.gpu import gpu_facts

    fields: dict[str, Any] = {}
    if use_local_gpu:
        fields.update({k: v for k, v in gpu_facts().items() if v is not None and k in Fingerprint.model_fields})
    if server_url:
        fields.update({k: v for k, v in server_fingerprint(server_url).items() if v is not None})
    if model_path:
        fields.update(
            {
                k: v
                for k, v in shape_of_config(load_model_config(model_path)).items()
                if k in Fingerprint.model_fields and v is not None
            }
        )
    if gpu_name:
        fields["gpu_name"] = gpu_name
    if vllm_version:
        fields["vllm_version"] = vllm_version
    return Fingerprint.model_validate(fields)
