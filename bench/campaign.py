"""A configuration campaign: deployment configurations (attention backend, speculative decoding, quantization,
batch and length limits, MoE shapes) raced one after another on one GPU, from one YAML file.

``bench/gpu/config_chain.sh`` runs a campaign on the GPU host in the background; this module holds what it
needs and what can be tested without a GPU:

* :func:`load_campaign` reads and checks the file (every problem is a :class:`~graphmode.core.errors.
  ConfigError` naming the configuration and field): shapes and grids exist, every request fits
  ``max_model_len``, the race's engines fit the GPU's memory (a 30B MoE races in pairs), the vLLM args
  read as a deployment (:class:`~graphmode.core.deployment.DeploymentConfig`);
* :func:`lease_plan` packs the configurations, in file order, into leases of ``lease_min`` GPU-minutes, so
  that a lease finishes whole configurations;
* :func:`race_command` is the ``graphmode.profiling profile --race`` command of one configuration;
* :func:`run_config` runs it and writes one status line: the race's end, or for a configuration vLLM
  refused, vLLM's root cause from the log (:func:`root_cause`), so the chain can go on to the next one.

``python bench/campaign.py check|plan|names|run`` is the command line the chain calls (graphmode's core and
profiler, pydantic and PyYAML only: the GPU host's vLLM environment lacks the selector's model dependencies).
A configuration's verdicts in its status line are :func:`graphmode.selector.verdicts.race_verdicts` over its
dataset's rows, the verdicts the report and the recommender read.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from graphmode.core.dataset import ProfileStore
from graphmode.core.deployment import DeploymentConfig, DeploymentError
from graphmode.core.errors import ConfigError
from graphmode.core.modes import DEFAULT_MODE, CudaGraphMode, parse_mode
from graphmode.core.settings import RACE_GRID
from graphmode.profiling.grid import load_grid
from graphmode.profiling.race_fit import size_gib as kv_gib
from graphmode.profiling.race_fit import weights_gib
from graphmode.profiling.race_rounds import KNOWN_RACE_METRICS
from graphmode.selector.verdicts import race_verdicts

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# Flags a configuration sets through its own fields (or the chain sets): vllm_args must not repeat them.
_OWNED_FLAGS = (
    "--model", "--load-format", "--skip-tokenizer-init", "--max-model-len", "--max-num-seqs",
    "--attention-backend", "--attention-config", "-ac", "--speculative-config", "--quantization", "-q",
    "--kv-cache-memory-bytes", "--gpu-memory-utilization", "--compilation-config", "-cc", "--port",
)
DRAFT_PLACEHOLDER = "{draft}"
DEFAULT_VLLM_CMD = "python3 -m vllm.entrypoints.openai.api_server"


class CampaignConfig(BaseModel):
    """One deployment configuration: a race of its modes against vLLM's default on one model shape."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME, max_length=64)
    shape: str = Field(pattern=NAME, description="models/shapes/SHAPE.json, served with --load-format dummy")
    draft_shape: str | None = Field(None, pattern=NAME, description="a draft model's shape; its dir is {draft}")
    kv: str = Field("8G", description="--kv-cache-memory-bytes of every engine")
    budget_min: float = Field(gt=0, le=60, description="the race's GPU-minutes, engine starts included")
    estimate_min: float | None = Field(None, gt=0, le=60, description="planned GPU-minutes (budget + 0.5)")
    grid: str = Field("race", description="'race' (the bundled race design) or a grid file")
    workloads: list[str] = Field(default_factory=list, description="a subset of the grid's workloads")
    modes: list[str] | None = Field(None, description="challengers raced against the default (all: None)")
    control: bool = False
    starts: int = Field(2, ge=1, le=10)
    replicas: int = Field(1, ge=1, le=32, description="resident engines per arm (--replicas); > 1 replaces starts")
    max_rounds: int | None = Field(None, ge=1)
    race_metrics: list[str] = Field(default_factory=list, description="metrics decided (the race's default: empty)")
    cell_s: float | None = Field(None, ge=0.5, le=600)
    cell_warmup_s: float | None = Field(None, ge=0, le=600)
    attention_backend: str | None = Field(None, pattern=r"^[A-Z][A-Z0-9_]*$")
    speculative: dict[str, Any] | None = Field(None, description="--speculative-config as a mapping")
    quantization: str | None = Field(None, pattern=r"^[a-z0-9_]+$")
    max_model_len: int = Field(4096, ge=16, le=1_048_576)
    max_num_seqs: int | None = Field(None, ge=1, le=65536)
    vllm_args: list[str] = Field(default_factory=list, description="anything else vLLM should get")
    loadgen_processes: int = Field(1, ge=1, le=16, description="--loadgen-processes: processes sending the load")
    vllm_cmd: str | None = Field(
        None, min_length=1, max_length=500,
        description="the command that starts vLLM for this configuration (None: the chain's); e.g. "
                    "'python3 -m vllm.entrypoints.cli.main serve', since only `vllm serve` starts several "
                    "API servers (--api-server-count)")
    note: str = ""

    @field_validator("kv")
    @classmethod
    def _kv(cls, v: str) -> str:
        if kv_gib(v) is None:
            raise ValueError(f"{v!r} is not a byte size such as 8G or 4096M")
        return v

    @field_validator("modes")
    @classmethod
    def _modes(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        if not v:
            raise ValueError("an empty list races nothing; leave modes out to race every mode")
        modes = [parse_mode(m) for m in v]
        if DEFAULT_MODE in modes:
            raise ValueError(f"{DEFAULT_MODE.value} is the default: it races in every configuration")
        return [m.value for m in dict.fromkeys(modes)]

    @field_validator("race_metrics")
    @classmethod
    def _metrics(cls, v: list[str]) -> list[str]:
        unknown = [m for m in v if m not in KNOWN_RACE_METRICS]
        if unknown:
            raise ValueError(f"unknown race metric {', '.join(unknown)}; known: {', '.join(KNOWN_RACE_METRICS)}")
        return list(dict.fromkeys(v))

    @field_validator("vllm_cmd")
    @classmethod
    def _cmd(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            words = shlex.split(v)
        except ValueError as exc:
            raise ValueError(f"vllm_cmd {v!r} is not a shell command line: {exc}") from None
        if not words:
            raise ValueError("vllm_cmd is empty")
        return v

    @field_validator("vllm_args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        for a in v:
            flag = a.split("=", 1)[0]
            if flag in _OWNED_FLAGS or flag.replace("_", "-") in _OWNED_FLAGS:
                raise ValueError(f"{flag} is set by the configuration's own fields or by the chain")
        return v

    @property
    def planned_min(self) -> float:
        # the budget counts engine starts; the rest is stopping the engines and writing the status
        return self.estimate_min if self.estimate_min is not None else self.budget_min + 0.5

    def vllm_argv(self, model_dir: str, draft_dir: str | None = None) -> list[str]:
        argv = ["--model", model_dir, "--load-format", "dummy", "--skip-tokenizer-init",
                "--max-model-len", str(self.max_model_len)]
        if self.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.attention_backend:
            argv += ["--attention-backend", self.attention_backend]
        if self.quantization:
            argv += ["--quantization", self.quantization]
        if self.speculative is not None:
            spec = json.dumps(self.speculative, sort_keys=True)
            if draft_dir is not None:
                spec = spec.replace(DRAFT_PLACEHOLDER, draft_dir)
            argv += ["--speculative-config", spec]
        return [*argv, *self.vllm_args]

    def engines(self) -> int:
        challengers = len(self.modes) if self.modes is not None else len(CudaGraphMode) - 1
        return (1 + challengers + int(self.control)) * self.replicas


class Campaign(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME)
    vllm: str | None = Field(None, description="the vLLM release it is for (documentation)")
    lease_min: float = Field(25.0, gt=0, le=600, description="usable GPU-minutes of one lease")
    gpu_gib: float = Field(141.0, gt=0, description="the GPU's memory")
    engine_overhead_gib: float = Field(
        6.0, ge=0, description="per engine beside weights and KV: CUDA context, activations, graph pool")
    configs: list[CampaignConfig] = Field(min_length=1)

    def get(self, name: str) -> CampaignConfig:
        for c in self.configs:
            if c.name == name:
                return c
        raise ConfigError(f"campaign {self.name}: no configuration {name!r}; "
                          f"known: {', '.join(c.name for c in self.configs)}")


def _shape(root: Path, shape: str, where: str) -> dict[str, Any]:
    path = root / "models" / "shapes" / f"{shape}.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: shape {shape!r}: cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: shape {shape!r}: {path} is not JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{where}: shape {shape!r}: {path} is not a JSON object")
    return cfg


def grid_path(root: Path, grid: str) -> Path:
    if grid == "race":
        return RACE_GRID
    p = Path(grid)
    return p if p.is_absolute() else root / p


def _check(c: CampaignConfig, camp: Campaign, root: Path) -> None:
    where = f"campaign {camp.name}, configuration {c.name}"
    cfg = _shape(root, c.shape, where)
    draft = _shape(root, c.draft_shape, where) if c.draft_shape else None
    spec_text = json.dumps(c.speculative) if c.speculative is not None else ""
    if (DRAFT_PLACEHOLDER in spec_text) != (c.draft_shape is not None):
        raise ConfigError(f"{where}: draft_shape and a speculative \"model\": \"{DRAFT_PLACEHOLDER}\" go together")
    if c.speculative is not None and not c.speculative.get("method"):
        raise ConfigError(f"{where}: speculative needs a method (ngram, eagle, eagle3, draft_model, ...)")
    try:
        DeploymentConfig.from_vllm_args(c.vllm_argv("model", "draft"), {}, cfg, strict=True)
    except DeploymentError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    try:
        grid = load_grid(grid_path(root, c.grid))
        workloads = grid.select(c.workloads)
    except ConfigError as exc:
        raise ConfigError(f"{where}: grid: {exc}") from None
    for w in workloads:
        need = w.input.bounds()[1] + w.output.bounds()[1]
        if need > c.max_model_len:
            raise ConfigError(f"{where}: workload {w.name} sends up to {need} tokens (prompt + output), "
                              f"more than max_model_len {c.max_model_len}")
    limit = cfg.get("max_position_embeddings")
    if isinstance(limit, int) and c.max_model_len > limit and not cfg.get("rope_scaling"):
        raise ConfigError(f"{where}: max_model_len {c.max_model_len} exceeds shape {c.shape}'s "
                          f"max_position_embeddings {limit}")
    w_gib = weights_gib(cfg, c.quantization)
    if w_gib is not None:
        if draft is not None:
            w_gib += weights_gib(draft, None) or 0.0
        per_engine = w_gib + (kv_gib(c.kv) or 0.0) + camp.engine_overhead_gib
        total = per_engine * c.engines()
        if total > camp.gpu_gib:
            fit = max(0, int(camp.gpu_gib // per_engine))
            raise ConfigError(
                f"{where}: {c.engines()} engines × {per_engine:.1f} GiB (weights {w_gib:.1f} + KV "
                f"{kv_gib(c.kv):g} + {camp.engine_overhead_gib:g}) = {total:.0f} GiB, more than the GPU's "
                f"{camp.gpu_gib:g} GiB; {fit} fit: race fewer modes (e.g. pairs: one mode per configuration) or "
                f"fewer replicas")


def load_campaign(path: str | Path, root: str | Path = ".") -> Campaign:
    """Read and check a campaign file; ``root`` holds ``models/shapes/`` and relative grid paths."""
    path, root = Path(path), Path(root)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read campaign file {path}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"campaign file {path} is not YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"campaign file {path}: expected a mapping with name and configs")
    defaults = raw.pop("defaults", None) or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"campaign file {path}: defaults must be a mapping")
    configs = raw.get("configs")
    if isinstance(configs, list):
        raw["configs"] = [{**defaults, **c} if isinstance(c, dict) else c for c in configs]
    try:
        camp = Campaign.model_validate(raw)
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            loc = list(e["loc"])
            if loc[:1] == ["configs"] and len(loc) > 1 and isinstance(loc[1], int) and isinstance(configs, list):
                item = configs[loc[1]]
                label = item.get("name") if isinstance(item, dict) else None
                loc[1] = f"{loc[1]} ({label})" if label else loc[1]
            problems.append(f"{'.'.join(str(x) for x in loc) or '(top)'}: {e['msg']}")
        raise ConfigError(f"campaign file {path}: " + "; ".join(problems)) from None
    seen: set[str] = set()
    for c in camp.configs:
        if c.name in seen:
            raise ConfigError(f"campaign file {path}: configuration {c.name!r} appears twice")
        seen.add(c.name)
        if c.planned_min > camp.lease_min:
            raise ConfigError(f"campaign file {path}: configuration {c.name} plans {c.planned_min:g} GPU-min, "
                              f"more than a lease's {camp.lease_min:g}")
        _check(c, camp, root)
    return camp


@dataclass(frozen=True)
class Lease:
    number: int
    configs: tuple[CampaignConfig, ...]

    @property
    def planned_min(self) -> float:
        return sum(c.planned_min for c in self.configs)


def lease_plan(camp: Campaign) -> list[Lease]:
    """Configurations in file order, a new lease whenever the next one would overrun ``lease_min``."""
    leases: list[list[CampaignConfig]] = [[]]
    for c in camp.configs:
        if leases[-1] and sum(x.planned_min for x in leases[-1]) + c.planned_min > camp.lease_min:
            leases.append([])
        leases[-1].append(c)
    return [Lease(i + 1, tuple(cs)) for i, cs in enumerate(leases)]


def plan_text(camp: Campaign, profiles: Path | None = None, tag: str | None = None) -> str:
    """The lease plan; with *profiles* and *tag*, each configuration's progress from its committed dataset
    (``PROFILES/TAG-NAME.sqlite``): what a session reads before it picks the next lease."""
    lines = [f"campaign {camp.name}" + (f" (vLLM {camp.vllm})" if camp.vllm else "")
             + f": {len(camp.configs)} configurations, leases of {camp.lease_min:g} usable GPU-min"]
    for lease in lease_plan(camp):
        if profiles is None or tag is None:
            names = " ".join(c.name for c in lease.configs)
        else:
            names = " ".join(f"{c.name} [{progress(profiles / f'{tag}-{c.name}.sqlite')}]" for c in lease.configs)
        lines.append(f"  lease {lease.number} (~{lease.planned_min:g} GPU-min): {names}")
    return "\n".join(lines)


def progress(dataset: Path) -> str:
    """``not raced``, or the ok cells, rounds and GPU-minutes a configuration's dataset holds."""
    if not dataset.exists():
        return "not raced"
    try:
        with ProfileStore(dataset, readonly=True) as store:
            rows = store.rows()
    except Exception as exc:  # a broken dataset is reported, not fatal to the plan
        return f"unreadable: {exc}"
    ok = [r for r in rows if r.get("status") == "ok"]
    rounds = {(r.get("race_id"), r.get("race_round")) for r in ok if r.get("race_round") is not None}
    failed = len(rows) - len(ok)
    return f"{len(ok)} ok cells, {len(rounds)} rounds" + (f", {failed} failed" if failed else "")


def select(camp: Campaign, items: Sequence[str]) -> list[CampaignConfig]:
    """Configuration names, or ``@N`` for lease N of the plan, in the order given."""
    plan = lease_plan(camp)
    out: list[CampaignConfig] = []
    for item in items:
        if item.startswith("@"):
            try:
                n = int(item[1:])
            except ValueError:
                raise ConfigError(f"{item!r}: a lease is @N, N a number") from None
            if not 1 <= n <= len(plan):
                raise ConfigError(f"{item}: the plan has leases 1 to {len(plan)}")
            out.extend(plan[n - 1].configs)
        else:
            out.append(camp.get(item))
    return list({c.name: c for c in out}.values())


# ---------------------------------------------------------------------- running one configuration
def race_command(c: CampaignConfig, *, work: Path, tag: str, python: str, vllm_cmd: str, port: int,
                 root: Path) -> list[str]:
    draft = str(work / f"model-{c.draft_shape}") if c.draft_shape else None
    cmd = [python, "-m", "graphmode.profiling", "profile", "--race",
           "--dataset", str(work / f"{tag}-{c.name}.sqlite"), "--port", str(port),
           "--log-dir", str(work / f"logs-{c.name}"), "--vllm-cmd", c.vllm_cmd or vllm_cmd,
           "--kv-cache-memory-bytes", c.kv, "--budget-min", f"{c.budget_min:g}",
           *(["--replicas", str(c.replicas)] if c.replicas > 1 else ["--starts", str(c.starts)]),
           "--grid", str(grid_path(root, c.grid))]
    if c.modes is not None:
        cmd += ["--modes", ",".join(c.modes)]
    if c.workloads:
        cmd += ["--workloads", ",".join(c.workloads)]
    if c.control:
        cmd.append("--control")
    if c.race_metrics:
        cmd += ["--race-metrics", ",".join(c.race_metrics)]
    if c.loadgen_processes > 1:
        cmd += ["--loadgen-processes", str(c.loadgen_processes)]
    for flag, value in (("--max-rounds", c.max_rounds), ("--cell-s", c.cell_s),
                        ("--cell-warmup-s", c.cell_warmup_s)):
        if value is not None:
            cmd += [flag, f"{value:g}"]
    return [*cmd, "--", *c.vllm_argv(str(work / f"model-{c.shape}"), draft)]


# vLLM log prefixes: "(EngineCore pid=1) ERROR 12-01 10:00:00 [core.py:1] " / "ERROR 12-01 ... [x.py:1] "
_PREFIX = re.compile(r"^(\(\w+ pid=\d+\)\s*)?((DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?")
_CAUSE = re.compile(
    r"^([\w.]*(Error|Exception|Interrupt)\b.*|.*: error: .*|CUDA out of memory.*|.*No module named .*)$")
_WRAPPERS = ("RuntimeError: Engine core initialization failed", "EngineStartError", "EngineDiedError")


def root_cause(text: str) -> str | None:
    """vLLM's root cause in a log (tail): the last exception or argparse error line that is not a wrapper."""
    found: list[str] = []
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw.strip()).strip()
        if _CAUSE.match(line):
            found.append(line)
    for line in reversed(found):
        if not line.startswith(_WRAPPERS):
            return line[:400]
    return found[-1][:400] if found else None


def status_line(c: CampaignConfig, dataset: Path, race_out: str, rc: int) -> str:
    """One line for summary.txt: verdict counts, failed arms with their root causes, or the whole failure."""
    rows: list[dict[str, Any]] = []
    if dataset.exists():
        try:
            with ProfileStore(dataset, readonly=True) as store:
                rows = store.rows()
        except Exception as exc:  # a broken dataset must not stop the chain
            return f"{c.name}: FAILED: cannot read {dataset.name}: {exc}"
    ok = [r for r in rows if r.get("status") == "ok"]
    failed: dict[str, str] = {}
    for r in rows:
        if r.get("status") != "ok":
            arm = str(r.get("race_arm") or r.get("mode"))
            reason = str(r.get("reason") or "")
            failed[arm] = root_cause(reason) or (reason.splitlines()[0] if reason else "no reason recorded")
    if not ok:
        cause = next(iter(failed.values()), None) or root_cause(race_out)
        if cause is None:
            tail = [ln for ln in race_out.splitlines() if ln.strip()]
            cause = tail[-1] if tail else f"exit status {rc}, no output"
        every = "every engine failed" if failed else "no engine measured"
        return f"{c.name}: FAILED ({every}): {cause}"
    arms = sorted(failed)
    rounds = len({r.get("race_round") for r in ok if r.get("race_round") is not None})
    text = f"{c.name}: ok, {len(ok)} cells, {rounds} rounds"
    verdicts = verdict_texts(ok)
    if verdicts:
        text += "; " + ", ".join(verdicts)
    ran = sorted({(str(r.get("race_arm")), str(r["effective_mode"])) for r in ok
                  if r.get("effective_mode") and r.get("requested_mode")
                  and r["effective_mode"] != r["requested_mode"]})
    if ran:  # vLLM ran another mode than asked: that arm's verdicts are not about the mode it is named after
        text += "; downgraded by vLLM: " + ", ".join(f"{a} runs as {m}" for a, m in ran)
    if c.speculative is not None:
        text += "; " + _spec_text(ok)
    if arms:
        text += "; failed arms: " + "; ".join(f"{a}: {failed[a]}" for a in arms)
    return text


def verdict_texts(ok: Sequence[dict[str, Any]]) -> list[str]:
    """``FULL itl_p50 better 0.768×`` per pooled (arm, metric) verdict of the race's ok rows."""
    out = []
    for v in race_verdicts(ok):
        if v.workload is None:
            out.append(f"{v.mode} {v.metric} {v.verdict}" + ("" if v.ratio is None else f" {v.ratio:.3f}×"))
    return out


def _spec_text(ok: list[dict[str, Any]]) -> str:
    """What speculative decoding did over the race's cells: with synthetic prompts and dummy weights an ngram
    proposer drafts only when the output repeats, and a race whose cells never drafted raced plain decoding."""
    rates = [float(r["obs_spec_acceptance_rate"]) for r in ok
             if isinstance(r.get("obs_spec_acceptance_rate"), int | float)]
    lengths = [float(r["obs_spec_accept_length"]) for r in ok
               if isinstance(r.get("obs_spec_accept_length"), int | float)]
    if not rates and not lengths:
        return ("speculative decoding: no draft in any cell (or no vllm:spec_decode_* metrics): this configuration "
                "raced plain decoding")
    bits = [f"drafts {sum(rates) / len(rates) * 100:.0f}% accepted"] if rates else []
    bits += [f"{sum(lengths) / len(lengths):.2f} tokens per verification step"] if lengths else []
    return f"speculative decoding: {', '.join(bits)} (mean over {max(len(rates), len(lengths))} of {len(ok)} cells)"


def run_config(c: CampaignConfig, *, work: Path, tag: str, python: str, vllm_cmd: str, port: int,
               root: Path) -> str:
    """Race one configuration (unless its status file says it is done) and write its status line."""
    status = work / f"status-{c.name}.txt"
    if status.exists():
        return status.read_text(encoding="utf-8").strip() + " (done before)"
    for shape in (c.shape, c.draft_shape):
        if shape:
            d = work / f"model-{shape}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "config.json").write_text(json.dumps(_shape(root, shape, c.name)), encoding="utf-8")
    cmd = race_command(c, work=work, tag=tag, python=python, vllm_cmd=vllm_cmd, port=port, root=root)
    out = work / f"race-{c.name}.out"
    with out.open("a", encoding="utf-8") as f:
        f.write(f"configuration {c.name}: {shlex.join(cmd)}\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    line = status_line(c, work / f"{tag}-{c.name}.sqlite", out.read_text(encoding="utf-8", errors="replace"), rc)
    if rc in (130, 137, 143):  # killed (the lease ended): no status, so the next lease resumes it
        return f"{c.name}: interrupted (exit {rc}); {line}"
    status.write_text(line + "\n", encoding="utf-8")
    return line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/campaign.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("check", "plan", "names", "run"):
        s = sub.add_parser(name)
        s.add_argument("file")
        s.add_argument("--root", default=".", help="holds models/shapes/ and relative grid paths")
        if name == "plan":
            s.add_argument("--tag", help="with it, each configuration's progress from PROFILES/TAG-NAME.sqlite")
            s.add_argument("--profiles", default="models/profiles", help="where the campaign's datasets are")
        if name in ("names", "run"):
            s.add_argument("items", nargs="+", help="configuration names or @N (lease N)")
        if name == "run":
            s.add_argument("--work", required=True)
            s.add_argument("--tag", required=True)
            s.add_argument("--port", type=int, default=8200)
            s.add_argument("--vllm-cmd", default=DEFAULT_VLLM_CMD)
            s.add_argument("--python", default=sys.executable)
    a = p.parse_args(argv)
    try:
        camp = load_campaign(a.file, a.root)
        if a.cmd == "check":
            print(f"campaign {camp.name}: {len(camp.configs)} configurations ok")
        elif a.cmd == "plan":
            print(plan_text(camp, Path(a.profiles), a.tag) if a.tag else plan_text(camp))
        elif a.cmd == "names":
            print(" ".join(c.name for c in select(camp, a.items)))
        else:
            work = Path(a.work)
            for c in select(camp, a.items):
                try:
                    line = run_config(c, work=work, tag=a.tag, python=a.python, vllm_cmd=a.vllm_cmd,
                                      port=a.port, root=Path(a.root))
                except Exception as exc:  # one configuration's surprise must not stop the chain
                    line = f"{c.name}: FAILED (campaign runner): {type(exc).__name__}: {exc}"
                    (work / f"status-{c.name}.txt").write_text(line + "\n", encoding="utf-8")
                print(line, flush=True)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
