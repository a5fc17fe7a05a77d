"""The deployment configuration a measurement or an answer belongs to, beyond the model shape.

The same model on the same GPU answers differently with another attention backend, speculative decoding,
a quantized checkpoint, another batch limit or tensor parallelism: those change what a CUDA graph
captures (query length 1+k, FP8 kernels, a capture range bounded by ``max_num_seqs``, an all-reduce
per layer). :class:`DeploymentConfig` holds them, read from vLLM's arguments, its environment, the
served model's config.json and, where a start-up log exists, what vLLM says it resolved.

A field named in ``unknown`` could not be established; any other ``None`` means "not set": no speculative
decoding, an unquantized checkpoint, vLLM's default ``max_num_seqs``, the model's own ``max_model_len``.

With tensor parallelism every number vLLM logs about memory (model load, "Graph capturing finished ...
took X GiB", KV cache) is per rank, i.e. per GPU: a TP=2 row's ``graph_gib`` is one GPU's graph memory,
not the deployment's total.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from graphmode.core.records import StartupInfo

BackendSource = Literal["log", "args", "env"]
# The elements that make two deployments of one model different configurations, in the order labels use.
ELEMENTS: tuple[str, ...] = (
    "tensor_parallel_size", "attention_backend", "quantization", "speculative", "max_num_seqs", "max_model_len",
)


class DeploymentError(ValueError):
    """A vLLM argument that names a configuration but cannot be read (bad JSON, a non-number)."""


class DeploymentConfig(BaseModel):
    """Configuration of one vLLM deployment; see the module docstring for what ``None`` means."""

    model_config = ConfigDict(extra="forbid")

    attention_backend: str | None = Field(None, description="as vLLM resolved it (log), else as requested")
    attention_backend_source: BackendSource | None = Field(
        None, description="'log' (vLLM said so), 'args' (--attention-backend) or 'env' (VLLM_ATTENTION_BACKEND)"
    )
    attention_backend_requested: bool = Field(False, description="the backend was asked for, not left to vLLM")
    speculative_method: str | None = Field(None, description="--speculative-config method (ngram, eagle, ...)")
    speculative_k: int | None = Field(None, description="num_speculative_tokens: the query is 1+k per step")
    quantization: str | None = Field(None, description="--quantization, else the checkpoint's quant_method")
    max_num_seqs: int | None = Field(None, description="--max-num-seqs; None: vLLM's default")
    max_model_len: int | None = Field(None, description="--max-model-len; None: the model's own")
    tensor_parallel_size: int | None = Field(None, description="--tensor-parallel-size / -tp (1 when not given)")
    api_server_count: int | None = Field(None, description="--api-server-count / -asc; None: one, vLLM's default")
    num_experts: int | None = Field(None, description="routed experts per MoE layer; None for a dense model")
    num_experts_per_tok: int | None = None
    num_params_b: float | None = Field(None, description="all parameters, billions (every expert counted)")
    num_active_params_b: float | None = Field(None, description="parameters one token runs through, billions")
    unknown: list[str] = Field(default_factory=list, description="fields that could not be established")

    # ------------------------------------------------------------------ reading
    @classmethod
    def from_vllm_args(
        cls,
        args: Sequence[str],
        env: Mapping[str, str] | None = None,
        model_config: Mapping[str, Any] | None = None,
        startup: StartupInfo | None = None,
        *,
        shape: Mapping[str, Any] | None = None,
        strict: bool = True,
    ) -> DeploymentConfig:
        """Read a deployment from vLLM's ``args``, its ``env``, the served ``model_config`` (config.json) and
        the ``startup`` vLLM logged. Without a config.json, ``shape`` (fingerprint fields) supplies the
        parameter counts and, when it carries ``checkpoint_quantization``, the checkpoint's quantization.

        ``strict`` raises :class:`DeploymentError` on an argument that cannot be read; otherwise that field is
        reported ``unknown`` (a row must be written whatever its arguments were).
        """
        from graphmode.core.fingerprint import moe_shape
        from graphmode.vllm_args import get_flag

        argv = list(args)
        env = env or {}
        unknown: list[str] = []
        fields: dict[str, Any] = {}

        def bad(name: str, message: str) -> None:
            if strict:
                raise DeploymentError(message)
            unknown.append(name)

        requested = get_flag(argv, "--attention-backend", "--attention_backend")
        if not requested:
            try:
                requested = _attention_config_backend(argv)
            except DeploymentError:
                if strict:
                    raise  # else: as if not requested, unknown unless the log or env says

        from_env = env.get("VLLM_ATTENTION_BACKEND") or None
        logged = startup.attention_backend if startup is not None else None
        if logged:
            fields.update(attention_backend=_backend(logged), attention_backend_source="log")
        elif requested:
            fields.update(attention_backend=_backend(requested), attention_backend_source="args")
        elif from_env:
            fields.update(attention_backend=_backend(from_env), attention_backend_source="env")
        else:
            unknown.append("attention_backend")  # vLLM picks one at start-up
        fields["attention_backend_requested"] = bool(requested or from_env)

        try:
            fields.update(_speculative(argv))
        except DeploymentError as exc:
            bad("speculative", str(exc))

        quant = get_flag(argv, "--quantization", "-q")
        if quant:
            fields["quantization"] = quant.lower()
        elif model_config is not None:
            fields["quantization"] = _checkpoint_quantization(model_config)
        elif shape is not None and "checkpoint_quantization" in shape and shape.get("model_config_hash"):
            fields["quantization"] = shape.get("checkpoint_quantization")
        else:
            unknown.append("quantization")  # no flag, but the checkpoint itself may be quantized

        for name, flags in (("max_num_seqs", ("--max-num-seqs", "--max_num_seqs")),
                            ("max_model_len", ("--max-model-len", "--max_model_len")),
                            ("tensor_parallel_size", ("--tensor-parallel-size", "-tp", "--tensor_parallel_size")),
                            ("api_server_count", ("--api-server-count", "-asc", "--api_server_count"))):
            raw = get_flag(argv, *flags)
            if raw is None:
                fields[name] = 1 if name == "tensor_parallel_size" else None
                continue
            value = _size(raw)
            if value is None or value < 1:
                bad(name, f"{flags[0]} {raw!r} is not a positive whole number")
            else:
                fields[name] = value

        if model_config is not None:
            fields.update(moe_shape(dict(model_config)))
        elif shape is not None:
            for key in ("num_experts", "num_experts_per_tok", "num_params_b", "num_active_params_b"):
                fields[key] = shape.get(key)
            if shape.get("num_active_params_b") is None:
                unknown.append("num_active_params_b")
        else:
            unknown.append("num_active_params_b")
        return cls(**fields, unknown=sorted(set(unknown)))

    @classmethod
    def from_non_default_args(cls, non_default: Mapping[str, Any], **kwargs: Any) -> DeploymentConfig:
        """A deployment from vLLM's logged "non-default args" (every argument the user changed)."""
        return cls.from_vllm_args(_as_argv(non_default), **kwargs)

    # ------------------------------------------------------------------ views
    def shape_fields(self) -> dict[str, Any]:
        """The fields a model shape carries for this configuration (selector.featurize.shape_of_row, card
        shapes)."""
        return {
            "attention_backend": self.attention_backend,
            "attention_backend_requested": self.attention_backend_requested,
            "speculative_method": self.speculative_method,
            "speculative_k": self.speculative_k,
            "quantization": self.quantization,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "tensor_parallel_size": self.tensor_parallel_size,
            "api_server_count": self.api_server_count,
            "num_active_params_b": self.num_active_params_b,
            "deployment_unknown": list(self.unknown),
        }

    def label(self) -> str:
        return describe(self.shape_fields())


def _backend(name: str) -> str:
    """``FLASH_ATTN``, ``AttentionBackendEnum.FLASHINFER`` → the enum name; older prose stays as logged, upper."""
    return name.rsplit(".", 1)[-1].strip().upper().replace(" ", "_")


def _json_object(raw: str | None, flag: str) -> dict[str, Any] | None:
    """A vLLM flag's JSON-object value; None when the flag is absent or empty."""
    if not raw:
        return None
    try:
        cfg = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        hint = ""
        if raw.startswith("{") and '"' not in raw:
            # --vllm-args is split like a shell line, which strips the JSON's double quotes
            hint = (f" (its double quotes were lost: inside --vllm-args quote the JSON in single quotes, "
                    f"e.g. {flag} '{{\"method\": \"ngram\"}}')")
        raise DeploymentError(f"{flag} is not JSON: {exc}{hint}") from None
    if not isinstance(cfg, dict):
        raise DeploymentError(f"{flag} must be a JSON object")
    return cfg


def _attention_config_backend(argv: list[str]) -> str | None:
    """The backend of vLLM's ``--attention-config``/``-ac`` (JSON, or the dotted ``-ac.backend X``): vLLM
    0.33 selects a backend there as well as with ``--attention-backend`` (and no longer reads
    VLLM_ATTENTION_BACKEND)."""
    from graphmode.vllm_args import get_flag

    dotted = get_flag(argv, "--attention-config.backend", "-ac.backend", "--attention_config.backend")
    if dotted:
        return dotted
    cfg = _json_object(get_flag(argv, "--attention-config", "-ac", "--attention_config"), "--attention-config")
    if cfg is None:
        return None
    backend = cfg.get("backend")
    return str(backend) if backend not in (None, "", "auto") else None


def _speculative(argv: list[str]) -> dict[str, Any]:
    from graphmode.vllm_args import get_flag

    spec = _json_object(get_flag(argv, "--speculative-config", "--speculative_config"), "--speculative-config")
    method: str | None = None
    k: int | None = None
    if spec is not None:
        if spec.get("method") is not None:
            method = str(spec["method"]).lower()
        elif spec.get("model"):
            method = "draft_model"  # vLLM infers eagle/mtp/draft from the model; a draft model at least
        tokens = spec.get("num_speculative_tokens")
        if tokens is not None:
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
                raise DeploymentError(
                    f"--speculative-config num_speculative_tokens {tokens!r} is not a positive integer")
            k = tokens
    legacy_k = get_flag(argv, "--num-speculative-tokens", "--num_speculative_tokens")
    if legacy_k is not None and k is None:
        k = _size(legacy_k)
        if k is None or k < 1:
            raise DeploymentError(f"--num-speculative-tokens {legacy_k!r} is not a positive integer")
    if method is None and get_flag(argv, "--speculative-model", "--speculative_model"):
        method = "draft_model"
    if method is None and k is not None:
        method = "unknown"
    return {"speculative_method": method, "speculative_k": k}


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def _size(raw: str) -> int | None:
    """``4096``, ``32k`` (vLLM reads k as 1000 and K as 1024 for --max-model-len) → an int; else None."""
    match = _SIZE.match(str(raw))
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 1000, "K": 1024, "m": 1_000_000, "M": 1024 * 1024}[unit]
    value = number * scale
    if not math.isfinite(value) or value > 2**62 or value != int(value):
        return None  # absurd or fractional: not a size vLLM would take
    return int(value)


def _checkpoint_quantization(cfg: Mapping[str, Any]) -> str | None:
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        method = q.get("quant_method") or q.get("quantization_method") or "unknown"
        return str(method).lower()
    return None


def _as_argv(non_default: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for key, value in non_default.items():
        if value is None or isinstance(value, bool):
            continue
        argv += ["--" + key.replace("_", "-"), json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return argv


# ---------------------------------------------------------------------- rows
def _json_list(raw: Any) -> list[Any] | None:
    if isinstance(raw, list):
        return raw
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, list) else None


_ROW_COLUMNS: tuple[str, ...] = (
    *("dep_" + name for name in DeploymentConfig.model_fields),
    "fp_vllm_args", "fp_num_params_b", "fp_model_config_hash", "attention_backend", "non_default_args",
)


def deployment_of_row(row: Mapping[str, Any]) -> DeploymentConfig:
    """A copy of :func:`_deployment_of_row`'s answer; rows of one engine start share it (a dataset holds
    thousands of rows and a few starts), so it is computed once per distinct evidence."""
    key = tuple(json.dumps(v, sort_keys=True) if isinstance(v, list | dict) else v
                for v in (row.get(c) for c in _ROW_COLUMNS))
    return _cached_row(key).model_copy(deep=True)


@lru_cache(maxsize=1024)
def _cached_row(key: tuple[Any, ...]) -> DeploymentConfig:
    return _deployment_of_row(dict(zip(_ROW_COLUMNS, key, strict=True)))


def _deployment_of_row(row: Mapping[str, Any]) -> DeploymentConfig:
    """The configuration a dataset row was measured under.

    Rows written since the ``dep_*`` columns exist carry it. Older rows do not: their own evidence decides,
    never an assumption. Their vLLM args (``fp_vllm_args``: the exact arguments the profiler passed, so a
    flag that is absent was vLLM's default), else vLLM's logged non-default args, give TP, speculative
    decoding, the quantization flag, ``max_num_seqs`` and ``max_model_len``; the attention backend is the
    one the row's start-up log named. The checkpoint's own quantization and the active parameters were not
    recorded then: those stay ``unknown`` (as does everything when a row has neither args nor log).
    """
    recorded = _json_list(row.get("dep_unknown"))
    if recorded is not None:
        values = {name: row.get("dep_" + name) for name in DeploymentConfig.model_fields if name != "unknown"}
        values["attention_backend_requested"] = bool(values.get("attention_backend_requested"))
        try:
            dep = DeploymentConfig.model_validate({**values, "unknown": recorded})
        except ValueError:
            return DeploymentConfig(unknown=list(ELEMENTS))
        if dep.api_server_count is None:  # rows written before that column: the args they ran with say
            dep.api_server_count = _api_server_flag(row.get("fp_vllm_args"))
        return dep
    from graphmode.core.records import StartupInfo

    argv = [str(a) for a in (_json_list(row.get("fp_vllm_args")) or [])]
    shape = {k: row.get("fp_" + k) for k in ("num_params_b", "model_config_hash")}
    startup = StartupInfo(attention_backend=row.get("attention_backend"))
    if argv:
        return DeploymentConfig.from_vllm_args(argv, {}, None, startup, shape=shape, strict=False)
    nda = row.get("non_default_args")
    try:
        parsed = json.loads(nda) if isinstance(nda, str) else nda
    except (json.JSONDecodeError, RecursionError):
        parsed = None
    if isinstance(parsed, dict):
        return DeploymentConfig.from_non_default_args(parsed, startup=startup, shape=shape, strict=False)
    dep = DeploymentConfig(attention_backend=_backend(startup.attention_backend) if startup.attention_backend
                           else None, attention_backend_source="log" if startup.attention_backend else None,
                           num_params_b=finite_or_none(shape.get("num_params_b")))
    dep.unknown = sorted({"speculative", "quantization", "max_num_seqs", "max_model_len", "tensor_parallel_size",
                          "num_active_params_b", *([] if dep.attention_backend else ["attention_backend"])})
    return dep


def _api_server_flag(raw_args: Any) -> int | None:
    from graphmode.vllm_args import get_flag

    argv = [str(a) for a in (_json_list(raw_args) or [])]
    value = _size(get_flag(argv, "--api-server-count", "-asc", "--api_server_count") or "")
    return value if value is not None and value >= 1 else None


def finite_or_none(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


# ---------------------------------------------------------------------- comparing
def _element(shape: Mapping[str, Any], element: str) -> tuple[bool, Any]:
    """(known, value) of one configuration element of a shape dict; unknown when the shape lacks it."""
    unknown = shape.get("deployment_unknown")
    if not isinstance(unknown, list) or element in unknown:
        return False, None
    if element == "speculative":
        method, k = shape.get("speculative_method"), shape.get("speculative_k")
        return True, None if method is None and k is None else (method, k)
    if element == "attention_backend" and shape.get("attention_backend") is None:
        return False, None
    return True, shape.get(element)


def _show(element: str, known: bool, value: Any) -> str:
    if not known:
        return {"tensor_parallel_size": "TP unknown", "speculative": "speculative decoding unknown"}.get(
            element, f"{element.replace('_', ' ')} unknown")
    if element == "tensor_parallel_size":
        return f"TP={value}"
    if element == "attention_backend":
        return str(value)
    if element == "quantization":
        return "unquantized" if value is None else f"{value}-quantized"
    if element == "speculative":
        if value is None:
            return "without speculative decoding"
        method, k = value
        return f"speculative {method or '?'}" + (f" k={k}" if k is not None else "")
    if element == "max_num_seqs":
        return "max_num_seqs default" if value is None else f"max_num_seqs={value}"
    return "max_model_len of the model" if value is None else f"max_model_len={value}"


def describe(shape: Mapping[str, Any]) -> str:
    """One line for a configuration, e.g. ``TP=1 FLASH_ATTN unquantized without speculative decoding ...``."""
    text = " ".join(_show(e, *_element(shape, e)) for e in ELEMENTS)
    servers = api_servers(shape)
    return text + (f" api_server_count={servers}" if servers else "")


def api_servers(shape: Mapping[str, Any]) -> int | None:
    """More than one API server process, else None. Not an element of :data:`ELEMENTS` (which every label
    spells out, default or not) and not in the shape key: it matters only where a loaded frontend is the
    limit, where races with one and with several pool apart."""
    n = shape.get("api_server_count")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else None


def config_suffix(shape: Mapping[str, Any]) -> str:
    """What sets a configuration apart from vLLM's defaults, for a shape key ('' for the defaults).

    Only known elements that differ from a plain deployment count (TP>1, a requested backend, quantization,
    speculative decoding, an explicit max_num_seqs), so shapes trained before configurations were recorded
    keep their keys, and an unknown element never splits data it cannot tell apart.
    ``max_model_len`` stays out: it bounds the KV cache, not what a graph captures. So does the number of API
    servers (:func:`api_servers`): a deployment that adds some keeps its model's data; race verdicts pool
    apart by both (``graphmode.selector.verdicts.race_verdicts``).
    """
    parts: list[str] = []
    known, tp = _element(shape, "tensor_parallel_size")
    if known and tp not in (None, 1):
        parts.append(f"tp={tp}")
    known, backend = _element(shape, "attention_backend")
    if known and backend and shape.get("attention_backend_requested"):
        parts.append(f"attn={backend}")
    known, quant = _element(shape, "quantization")
    if known and quant:
        parts.append(f"q={quant}")
    known, spec = _element(shape, "speculative")
    if known and spec is not None:
        parts.append(f"spec={spec[0]}:{spec[1]}")
    known, seqs = _element(shape, "max_num_seqs")
    if known and seqs is not None:
        parts.append(f"seqs={seqs}")
    return "+".join(parts)


# A deployment value that is vLLM's default; against a training set that does not know that element, only a
# non-default value is worth a warning (the old datasets proved defaults for most elements, not every one).
_DEFAULTS: dict[str, Any] = {"tensor_parallel_size": 1, "quantization": None, "speculative": None,
                             "max_num_seqs": None}


def unlike(deployment: Mapping[str, Any], trained: Iterable[Mapping[str, Any]]) -> list[str]:
    """The elements of ``deployment`` (a shape dict) no trained shape had, each as 'X (trained: Y)'."""
    shapes = list(trained)
    out: list[str] = []
    for element in ELEMENTS:
        if element == "max_model_len":
            continue  # see config_suffix
        known, value = _element(deployment, element)
        if not known:
            continue
        seen = [_element(s, element) for s in shapes]
        values = [v for k, v in seen if k]
        if element == "attention_backend" and not deployment.get("attention_backend_requested"):
            continue  # left to vLLM: it picks on this GPU what it picked for the training data
        if value in values:
            continue
        if not values and element in _DEFAULTS and value == _DEFAULTS[element]:
            continue
        trained_text = ", ".join(sorted({_show(element, True, v) for v in values})) or "unknown"
        if any(not k for k, _ in seen) and values:
            trained_text += ", unknown"
        out.append(f"{_show(element, True, value)} (trained: {trained_text})")
    return out
