"""What ``graphmode check`` flags on the H200 campaign's configurations and on real argument lines, as a
markdown table for docs/check.md.

    python bench/check_table.py [--campaign bench/gpu/configs/h200-0.33.yaml] [--models models] > table.md

Each configuration's vLLM args come from the campaign file (``CampaignConfig.vllm_argv``) with the shape's
config.json (models/shapes/) as the model directory; the checks run as ``graphmode check --vllm-version 0.33.0
--gpu-memory-gib 141`` would, with the cost model of the release's model in ``--models``. The "measured" column
quotes docs/configs-campaign.md and docs/capture-sizes.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from graphmode.profiling.campaign import load_campaign

from graphmode.check.load import inputs_for
from graphmode.check.rules import check_deployment

ROOT = Path(__file__).resolve().parents[1]
MEASURED = {
    "1b-triton": "FULL ITL 1.053x undecided, TTFT 0.760x better; PIECEWISE ITL 2.99x worse",
    "8b-triton": "FULL ITL 0.979x undecided, TTFT 0.669x better; PIECEWISE ITL 2.94x worse",
    "1b-flashinfer": "FULL ran as FULL_AND_PIECEWISE (its race was the default against itself, ITL 1.028x)",
    "8b-fp8": "FULL ITL 1.007x equivalent, TTFT 0.741x undecided; PIECEWISE ITL 1.88x worse",
    "olmoe-1b-7b": "FULL ITL 0.976x undecided, TTFT 0.750x better; PIECEWISE ITL 2.12x worse",
    "8b-flashinfer": "FULL ran as FULL_AND_PIECEWISE (ITL 0.970x against itself); PIECEWISE 1.86x worse",
    "1b-ngram3": "FULL ITL 0.882x better, TTFT 0.718x better; PIECEWISE ITL 1.66x worse",
    "1b-ngram5": "FULL ITL 1.003x undecided, TTFT 0.765x; PIECEWISE ITL 1.97x worse",
    "8b-ngram3": "FULL ITL 0.995x equivalent, TTFT 0.776x better; PIECEWISE ITL 1.61x worse",
    "8b-ngram5": "docs/configs-campaign.md, lease 4c",
    "1b-long-prompt": "FULL ITL 0.896x better; PIECEWISE ITL 2.11x worse (lease 4b)",
    "1b-high-concurrency": "undecided; frontend-bound: API server at a full core, GPU 20-43% busy (lease 4c)",
    "moe30b-full": "docs/configs-campaign.md, lease 5",
    "moe30b-piecewise": "docs/configs-campaign.md, lease 5",
    "8b-eagle": "FULL ITL 0.986x undecided (dummy draft, 0% accepted; lease 5)",
    "1b-mid-prompt": "docs/configs-campaign.md, lease 6",
    "1b-high-concurrency-as4": "15-20k tokens/s with 4 API servers against 9-15k with one (lease 6)",
    "1b-saturated-as4": "no mode beyond the noise; engine core at 0.92-0.98 cores (lease 7)",
}
NGRAM3 = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'
REAL = [
    ("ngram k=3, 1B, --max-num-seqs 256", "llama-3.2-1b", ["--max-num-seqs", "256", "--speculative-config", NGRAM3],
     "ngram k=3 FULL ITL 0.882x better on the 1B (campaign, default max_num_seqs)"),
    ("EAGLE k=3, 8B, FULL", "llama-3.1-8b",
     ["--speculative-config", '{"method":"eagle","model":"DRAFT","num_speculative_tokens":3}',
      "--compilation-config", '{"cudagraph_mode":"FULL"}'], "FULL ITL 0.986x undecided (lease 5)"),
    ("8B, --max-num-seqs 1024", "llama-3.1-8b", ["--max-num-seqs", "1024"],
     "list to 1024 at 768 decoding: TPOT 0.73x the default list's (docs/capture-sizes.md)"),
    ("8B FP8", "llama-3.1-8b", ["--quantization", "fp8"], MEASURED["8b-fp8"]),
    ("FlashInfer with FULL, 8B", "llama-3.1-8b",
     ["--attention-backend", "FLASHINFER", "--compilation-config", '{"cudagraph_mode":"FULL"}'],
     MEASURED["8b-flashinfer"]),
]


def _row(name: str, shape: str, args: list[str], measured: str, models: Path, tmp: Path) -> str:
    model = tmp / shape
    if not model.exists():
        model.mkdir()
        shutil.copy(ROOT / "models" / "shapes" / f"{shape}.json", model / "config.json")
    inputs, _ = inputs_for(["--model", str(model), *args], vllm_version="0.33.0", gpu_memory_gib=141,
                           models_dir=models)
    rep = check_deployment(inputs)
    r, c = rep.resolved, rep.resolved.cost
    shown = [a if not a.startswith("{") else json.dumps(json.loads(a), separators=(",", ":")) for a in args]
    flags = "; ".join(f"**{f.severity}** {f.code}" for f in rep.findings if f.code != "graph-cost") or "-"
    cost = (f"{c.capture_s:.1f} s, {'-' if c.graph_gib is None else f'{c.graph_gib:.2f}'} GiB, "
            f"{'-' if c.kv_tokens is None else f'{c.kv_tokens:,}'} tok" if c.capture_s is not None else "-")
    mode = r.mode if r.mode == r.requested_mode else f"{r.requested_mode} → {r.mode}"
    return (f"| {name} | `{' '.join(shown) or '(defaults)'}` | {mode} | {len(r.capture_sizes)} to "
            f"{r.capture_sizes[-1] if r.capture_sizes else 0} | {flags} | {cost} | {measured} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--campaign", type=Path, default=ROOT / "bench" / "gpu" / "configs" / "h200-0.33.yaml")
    ap.add_argument("--models", type=Path, default=ROOT / "models")
    a = ap.parse_args(argv)
    camp = load_campaign(a.campaign, ROOT)
    head = ("| configuration | args | mode vLLM runs | capture list | findings | predicted capture, graphs, KV "
            "tokens | measured (H200, vLLM 0.33) |\n|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        print(f"### The campaign's {len(camp.configs)} configurations\n\n{head}")
        for c in camp.configs:
            args = c.vllm_argv("MODEL", "DRAFT")[2:]
            args = [x for x in args if x not in ("--load-format", "dummy", "--skip-tokenizer-init")]
            print(_row(c.name, c.shape, args, MEASURED.get(c.name, "-"), a.models, Path(tmp)))
        print(f"\n### Real argument lines\n\n{head}")
        for name, shape, args, measured in REAL:
            print(_row(name, shape, args, measured, a.models, Path(tmp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
