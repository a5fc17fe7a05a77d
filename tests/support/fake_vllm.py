#!/usr/bin/env python3
"""A stand-in for ``vllm serve``: enough of vLLM's OpenAI-compatible server to profile against, stdlib only.

It takes vLLM's command line (``--model``/positional model, ``--host``, ``--port``, ``--served-model-name``,
``--compilation-config``/``-cc``; everything else is accepted and ignored), prints vLLM-like start-up log
lines (version, non-default args, model loading, "Graph capturing finished in N secs, took X GiB", ...) and
serves:

* ``GET /health``, ``GET /version``, ``GET /v1/models``;
* ``GET /metrics``: vLLM-style Prometheus text whose counters move as it serves
  (``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``,
  ``vllm:num_requests_running``/``waiting``, ``vllm:iteration_tokens_total``, request-length and
  TTFT/ITL histograms, ``vllm:kv_cache_usage_perc``);
* ``POST /v1/completions``: exactly ``max_tokens`` tokens, streamed as SSE chunks that carry
  ``token_ids``, then a usage chunk when ``stream_options.include_usage`` is set, then ``[DONE]``.

A small "engine" thread batches every running request into one step at a time, so ITL, batch size and
tokens per step behave like a continuous-batching server; the step time depends on the cudagraph mode.

Environment knobs (for tests and benchmarks):

``FAKE_VLLM_STARTUP_S``      seconds to sleep before listening (model load + capture), default 0
``FAKE_VLLM_STEP_S``         scales every step time (default 1.0)
``FAKE_VLLM_EXIT_AFTER``     ``os._exit(3)`` when this many completion requests have arrived ...
``FAKE_VLLM_EXIT_MODE``      ... but only when serving this cudagraph mode (default: any mode)
``FAKE_VLLM_EXIT_PORT``      ... and only when listening on this port (one replica of a race's arm)
``FAKE_VLLM_FAIL_AT_START``  comma-separated modes for which it exits with status 1 during start-up
``FAKE_VLLM_COLD_STARTUP_S`` extra start-up seconds while its compile cache is cold (default 0)
``FAKE_VLLM_JIT_AT``         logs vLLM 0.33's "Triton kernel JIT compilation during inference" warning when
                             this many completion requests have arrived (once, as vLLM warns once a kernel)

Like vLLM 0.33, ``--attention-backend FLASHINFER`` turns a requested FULL into FULL_AND_PIECEWISE (logging
vLLM's warning), and ``--attention-backend NAME`` must name a backend it knows (:data:`BACKENDS`): another name is
refused the way vLLM's argument parser refuses it (usage error, exit status 2), before any start-up line.

``--speculative-config '{"num_speculative_tokens": K, ...}'``: each decode step of a request proposes K draft
tokens with probability 0.8 (an ngram proposer finds no match otherwise), accepts a prefix of them (each
accepted with probability 0.5 while the previous ones were) and emits 1 + accepted tokens; /metrics then
carries ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total`` and
``..._num_accepted_tokens_total``, as vLLM's do.

Capture sizes: ``cudagraph_capture_sizes`` in the compilation config, else vLLM's default list for
``--max-num-seqs`` (default 256: 51 sizes up to 512), is printed in the resolved config. Capture seconds and
graph GiB scale with the number of sizes (the table below is for 51), and the KV cache gains what the graphs
do not take. A graphed step is padded to the smallest size at or above its tokens (the padding costs step
time like real tokens); a decode-only step above the largest size runs without a graph (NONE's step time).

Like vLLM, a start writes its "compile cache" under ``$VLLM_CACHE_ROOT``:
``torch_compile_cache/fake-MODE.json``, once, before it listens; a start that finds the directory missing or
without any file is cold. Without ``VLLM_CACHE_ROOT`` it writes nothing (never into the tester's home) and
every start is cold.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VERSION = "0.0.0+fake"
# Base step time (s) per mode: NONE pays the launch overhead, full graphs the least.
_STEP_S = {
    "NONE": 0.0040,
    "PIECEWISE": 0.0030,
    "FULL_DECODE_ONLY": 0.0026,
    "FULL": 0.0022,
    "FULL_AND_PIECEWISE": 0.0022,
}
_PER_TOKEN_S = 2e-6  # extra step time per token in the step (prefill cost)
# (capture secs, graph GiB, capture labels) per mode, printed in the start-up log.
_CAPTURE = {
    "PIECEWISE": (3, 0.45, ["mixed prefill-decode, PIECEWISE"]),
    "FULL_DECODE_ONLY": (1, 0.21, ["decode, FULL"]),
    "FULL": (2, 0.38, ["mixed prefill-decode, FULL"]),
    "FULL_AND_PIECEWISE": (4, 0.52, ["mixed prefill-decode, PIECEWISE", "decode, FULL"]),
}
_ITER_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
_LEN_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
_SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
_VOCAB = 1000


def log(source: str, file: str, msg: str, level: str = "INFO") -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"({source} pid={os.getpid()}) {level} {stamp} [{file}] {msg}", flush=True)


class Hist:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, le in enumerate(self.buckets):
            if v <= le:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f"# HELP {name} fake vLLM histogram", f"# TYPE {name} histogram"]
        for le, c in zip(self.buckets, self.counts, strict=True):
            out.append(f'{name}_bucket{{{labels},le="{float(le)}"}} {float(c)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        return out


class Request:
    def __init__(self, prompt_len: int, max_tokens: int) -> None:
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.emitted = 0
        self.prefilled = False
        self.cancelled = False
        self.tokens: queue.Queue[int] = queue.Queue()
        self.arrived_at = time.monotonic()
        self.last_at: float | None = None


class Engine:
    """Continuous batching in miniature: each step gives every running request one token."""

    def __init__(self, mode: str, step_scale: float, sizes: list[int] | None = None, spec_k: int = 0) -> None:
        self.mode = mode
        self.spec_k = spec_k
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.step_scale = step_scale
        self.sizes = sorted(sizes or default_sizes(256)) if mode != "NONE" else []
        self.cond = threading.Condition()
        self.active: list[Request] = []
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = 0
        self.arrived = 0
        self.iteration_tokens = Hist(_ITER_BUCKETS)
        self.request_prompt = Hist(_LEN_BUCKETS)
        self.request_generation = Hist(_LEN_BUCKETS)
        self.ttft = Hist(_SECONDS_BUCKETS)
        self.itl = Hist(_SECONDS_BUCKETS)
        self.rng = random.Random(0)
        threading.Thread(target=self._loop, name="engine", daemon=True).start()

    def submit(self, prompt_len: int, max_tokens: int) -> Request:
        req = Request(prompt_len, max_tokens)
        with self.cond:
            self.active.append(req)
            self.cond.notify()
        return req

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.active:
                    self.cond.wait()
                batch = [r for r in self.active if not r.cancelled]
                self.active = list(batch)
            if not batch:
                continue
            prefill = sum(r.prompt_len for r in batch if not r.prefilled)
            # tokens each request emits this step: 1, or 1 + accepted drafts of a request that proposed K
            emits, proposed = {}, 0
            for r in batch:
                emits[id(r)] = 1
                if self.spec_k and r.prefilled and self.rng.random() < 0.8:
                    accepted = 0
                    while accepted < self.spec_k and self.rng.random() < 0.5:
                        accepted += 1
                    emits[id(r)] += accepted
                    proposed += 1
                    self.draft_tokens += self.spec_k
                    self.accepted_tokens += accepted
            self.drafts += proposed
            tokens = prefill + len(batch) + proposed * self.spec_k
            base, cost = _STEP_S.get(self.mode, 0.003), tokens
            graph = next((s for s in self.sizes if s >= tokens), None)
            if graph is not None:
                cost = graph  # replays the padded graph
            elif self.sizes and not prefill:
                base = _STEP_S["NONE"]  # a decode step above the largest size: no graph
            time.sleep((base + _PER_TOKEN_S * cost) * self.step_scale)
            with self.cond:
                now = time.monotonic()
                self.iteration_tokens.observe(tokens)
                self.prompt_tokens += prefill
                for r in batch:
                    r.prefilled = True
                    n = min(emits[id(r)], r.max_tokens - r.emitted)
                    self.generation_tokens += n
                    r.emitted += n
                    # as vLLM's frontend does: one TTFT per request, then one gap per step that emitted
                    if r.last_at is None:
                        self.ttft.observe(now - r.arrived_at)
                    else:
                        self.itl.observe(now - r.last_at)
                    r.last_at = now
                    for _ in range(n):
                        r.tokens.put(self.rng.randrange(10, _VOCAB))
                    if r.emitted >= r.max_tokens:
                        self.success += 1
                        self.request_prompt.observe(r.prompt_len)
                        self.request_generation.observe(r.emitted)
                        self.active.remove(r)

    def metrics(self, model: str) -> str:
        labels = f'engine="0",model_name="{model}"'
        with self.cond:
            running = len(self.active)
            lines = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{labels}}} {float(running)}",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{labels}}} 0.0",
                "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{{{labels}}} {min(1.0, running / 256)}",
                "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
                "# TYPE vllm:prompt_tokens_total counter",
                f"vllm:prompt_tokens_total{{{labels}}} {float(self.prompt_tokens)}",
                "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
                "# TYPE vllm:generation_tokens_total counter",
                f"vllm:generation_tokens_total{{{labels}}} {float(self.generation_tokens)}",
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(self.success)}',
                f'vllm:request_success_total{{{labels},finished_reason="stop"}} 0.0',
                "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
                "# TYPE vllm:num_preemptions_total counter",
                f"vllm:num_preemptions_total{{{labels}}} 0.0",
            ]
            if self.spec_k:
                for name, value in (("drafts", self.drafts), ("draft_tokens", self.draft_tokens),
                                    ("accepted_tokens", self.accepted_tokens)):
                    lines += [f"# HELP vllm:spec_decode_num_{name}_total fake speculative decoding counter",
                              f"# TYPE vllm:spec_decode_num_{name}_total counter",
                              f"vllm:spec_decode_num_{name}_total{{{labels}}} {float(value)}"]
            lines += self.iteration_tokens.lines("vllm:iteration_tokens_total", labels)
            lines += self.request_prompt.lines("vllm:request_prompt_tokens", labels)
            lines += self.request_generation.lines("vllm:request_generation_tokens", labels)
            lines += self.ttft.lines("vllm:time_to_first_token_seconds", labels)
            lines += self.itl.lines("vllm:inter_token_latency_seconds", labels)
        return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # A stream's small writes (headers, then one SSE chunk) on a kept-alive connection otherwise wait for
    # the client's delayed ACK: every request after a connection's first read ~40 ms more TTFT. vLLM's
    # uvicorn sets TCP_NODELAY too.
    disable_nagle_algorithm = True
    server_version = "fake-vllm"
    state: Any = None  # set in main()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # vLLM's access log is off in profiles too; keep the log readable

    def _json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _text(self, code: int, text: str, ctype: str = "text/plain; version=0.0.4; charset=utf-8") -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        s = self.state
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._text(200, "", "text/plain")
        elif path == "/version":
            self._json(200, {"version": VERSION})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": s.served, "object": "model", "created": int(s.started), "owned_by": "vllm",
                 "root": s.model, "max_model_len": 4096}]})
        elif path == "/metrics":
            self._text(200, s.engine.metrics(s.served))
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        s = self.state
        if self.path.split("?", 1)[0] != "/v1/completions":
            self._json(404, {"detail": "Not Found"})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            prompt = body.get("prompt")
            prompt_len = len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt or "").split()))
            max_tokens = int(body.get("max_tokens") or 16)
        except (ValueError, TypeError) as exc:
            self._json(400, {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}})
            return
        if body.get("model") != s.served:
            self._json(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                       "type": "NotFoundError", "code": 404}})
            return
        with s.engine.cond:
            s.engine.arrived += 1
            arrived = s.engine.arrived
        if arrived == s.jit_at:
            log("EngineCore", "jit_monitor.py:140", "Triton kernel JIT compilation during inference: "
                "fused_moe_kernel. This causes a latency spike; consider extending warmup to cover this "
                "shape/config.", "WARNING")
        if s.exit_after and arrived >= s.exit_after and s.exit_mode in (None, s.mode) and s.exits_here:
            log("EngineCore", "core.py:1", "RuntimeError: fake engine core died (FAKE_VLLM_EXIT_AFTER)", "ERROR")
            os._exit(3)
        req = s.engine.submit(prompt_len, max_tokens)
        rid = f"cmpl-{os.getpid()}-{arrived}"
        created = int(time.time())
        try:
            if body.get("stream"):
                self._stream(req, rid, created, body)
            else:
                ids = [req.tokens.get() for _ in range(max_tokens)]
                self._json(200, {
                    "id": rid, "object": "text_completion", "created": created, "model": s.served,
                    "choices": [{"index": 0, "text": " tok" * len(ids), "token_ids": ids, "logprobs": None,
                                 "finish_reason": "length"}],
                    "usage": {"prompt_tokens": prompt_len, "completion_tokens": len(ids),
                              "total_tokens": prompt_len + len(ids)},
                })
        except (BrokenPipeError, ConnectionResetError):
            req.cancelled = True

    def _chunk(self, obj: Any) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        payload = f"data: {data}\n\n".encode()
        self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.flush()

    def _stream(self, req: Request, rid: str, created: int, body: dict[str, Any]) -> None:
        s = self.state
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(req.max_tokens):
            tok = req.tokens.get()
            last = i == req.max_tokens - 1
            self._chunk({"id": rid, "object": "text_completion", "created": created, "model": s.served,
                         "choices": [{"index": 0, "text": " tok", "token_ids": [tok], "logprobs": None,
                                      "finish_reason": "length" if last else None, "stop_reason": None}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            self._chunk({"id": rid, "object": "text_completion", "created": created, "model": s.served,
                         "choices": [], "usage": {"prompt_tokens": req.prompt_len,
                                                  "completion_tokens": req.max_tokens,
                                                  "total_tokens": req.prompt_len + req.max_tokens}})
        self._chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class State:
    def __init__(self, model: str, served: str, mode: str, sizes: list[int] | None = None,
                 port: int | None = None, spec_k: int = 0) -> None:
        self.model = model
        self.served = served
        self.mode = mode
        self.started = time.time()
        self.engine = Engine(mode, float(os.environ.get("FAKE_VLLM_STEP_S", "1.0")), sizes, spec_k)
        self.exit_after = int(os.environ.get("FAKE_VLLM_EXIT_AFTER", "0") or 0)
        self.jit_at = int(os.environ.get("FAKE_VLLM_JIT_AT", "0") or 0)
        self.exit_mode = os.environ.get("FAKE_VLLM_EXIT_MODE") or None
        exit_port = os.environ.get("FAKE_VLLM_EXIT_PORT")
        self.exits_here = not exit_port or int(exit_port) == port


BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")


def _backend(value: str) -> str:
    if value.upper() not in BACKENDS:
        raise argparse.ArgumentTypeError(f"invalid AttentionBackendEnum value: {value!r}")
    return value.upper()


def parse(argv: list[str]) -> tuple[argparse.Namespace, str, str]:
    p = argparse.ArgumentParser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("--attention-backend", type=_backend, default=None)
    p.add_argument("--model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--compilation-config", "-cc", "--compilation_config", dest="cc", default="{}")
    p.add_argument("--speculative-config", dest="spec", default=None)
    args, _ = p.parse_known_args(argv)
    positional = argv[1] if argv[:1] == ["serve"] and len(argv) > 1 else (argv[0] if argv else "")
    model = args.model or (positional if positional and not positional.startswith("-") else "fake-model")
    cc = json.loads(args.cc)
    mode = str(cc.get("cudagraph_mode", "FULL_AND_PIECEWISE")).rsplit(".", 1)[-1].upper()
    return args, model, mode


def default_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default capture sizes (vllm/config/vllm.py): 1, 2, 4, steps of 8 below 256, of 16 from 256."""
    top = min(2 * max_num_seqs, 512)
    return [s for s in (1, 2, 4) if s <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))


def capture_sizes(args: argparse.Namespace) -> list[int]:
    given = json.loads(args.cc).get("cudagraph_capture_sizes")
    return sorted({int(x) for x in given}) if given else default_sizes(args.max_num_seqs)


def compile_cache(mode: str) -> bool:
    """Write this mode's cache file under ``$VLLM_CACHE_ROOT`` unless there; whether the root was warm."""
    root = os.path.expanduser(os.environ.get("VLLM_CACHE_ROOT", ""))
    if not root:
        return False
    warm = os.path.isdir(root) and any(files for _, _, files in os.walk(root))
    path = os.path.join(root, "torch_compile_cache", f"fake-{mode}.json")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"mode": mode, "written_at": time.time()}, f)
    log("EngineCore", "backends.py:1", f"Compile cache {'hit' if warm else 'miss'}: {root}")
    return warm


def main(argv: list[str]) -> int:
    args, model, mode = parse(argv)
    served = args.served_model_name or model
    log("APIServer", "api_server.py:1", f"vLLM API server version {VERSION}")
    non_default = {"model": model, "host": args.host, "port": args.port,
                   "compilation_config": {"cudagraph_mode": mode}}
    log("APIServer", "utils.py:1", f"non-default args: {non_default!r}")
    log("APIServer", "model.py:1", "Resolved architecture: LlamaForCausalLM")
    if args.attention_backend:
        log("EngineCore", "cuda.py:1", f"Using {args.attention_backend} attention backend out of potential "
            f"backends: {list(BACKENDS)}")
    if args.attention_backend == "FLASHINFER" and mode == "FULL":
        # vLLM 0.33 on the H200 (2026-12-02): FlashInfer supports uniform single-token decode graphs only
        log("EngineCore", "compilation.py:1419", "CUDAGraphMode.FULL is not supported with FlashInferBackend "
            "backend (support: AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE); setting "
            "cudagraph_mode=FULL_AND_PIECEWISE", "WARNING")
        mode = "FULL_AND_PIECEWISE"
    if mode in {m.strip() for m in os.environ.get("FAKE_VLLM_FAIL_AT_START", "").split(",") if m.strip()}:
        log("EngineCore", "core.py:1", f"ValueError: fake vLLM refuses cudagraph_mode {mode} "
            "(FAKE_VLLM_FAIL_AT_START)", "ERROR")
        return 1
    sizes = capture_sizes(args)
    log("EngineCore", "core.py:1", f"Initializing a V1 LLM engine (v{VERSION}) with config: model={model!r}, "
        f"compilation_config={{'cudagraph_mode': <CUDAGraphMode.{mode}: 0>, 'cudagraph_capture_sizes': {sizes}, "
        f"'max_cudagraph_capture_size': {sizes[-1]}}}")
    secs, gib, labels = _CAPTURE.get(mode, (2, 0.4, [mode]))
    # the table is for vLLM's 51 default sizes; fewer sizes capture faster into less memory
    scale = len(sizes) / 51
    secs, gib_now = round(secs * scale, 2), round(gib * (0.3 + 0.7 * scale), 2)
    freed = gib - gib_now if mode != "NONE" else 0.0
    startup_s = float(os.environ.get("FAKE_VLLM_STARTUP_S", "0") or 0)
    if not compile_cache(mode):
        time.sleep(float(os.environ.get("FAKE_VLLM_COLD_STARTUP_S", "0") or 0))  # the compile
    time.sleep(startup_s / 2)
    log("EngineCore", "gpu_model_runner.py:1", f"Model loading took 0.12 GiB and {startup_s / 2:.6f} seconds")
    log("EngineCore", "gpu_worker.py:1", f"Available KV cache memory: {10 + freed:.2f} GiB")
    log("EngineCore", "kv_cache_utils.py:1", f"GPU KV cache size: {81920 + int(freed * 8192):,} tokens")
    if mode == "NONE":
        log("EngineCore", "gpu_model_runner.py:1", "Skipping CUDA graph capture. To turn on CUDA graph "
            "capture, ensure `cudagraph_mode` was not manually set to `NONE`")
    else:
        n = len(sizes)
        for label in labels:
            print(f"Capturing CUDA graphs ({label}): 100%|##########| {n}/{n} [00:0{int(secs)}<00:00]", flush=True)
        time.sleep(startup_s / 2)
        log("EngineCore", "gpu_model_runner.py:1", f"Graph capturing finished in {secs:g} secs, took {gib_now:.2f} GiB")

    spec_k = int(json.loads(args.spec).get("num_speculative_tokens", 0)) if args.spec else 0
    Handler.state = State(model, served, mode, sizes, args.port, spec_k)
    server = ThreadingHTTPServer((args.host, args.port), Handler, bind_and_activate=False)
    server.daemon_threads = True
    server.request_queue_size = 1024
    server.server_bind()
    server.server_activate()

    def on_term(signum: int, frame: object) -> None:
        log("APIServer", "launcher.py:1", "Shutting down FastAPI HTTP server.")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    log("APIServer", "launcher.py:1", f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    print("INFO:     Application startup complete.", flush=True)
    server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
