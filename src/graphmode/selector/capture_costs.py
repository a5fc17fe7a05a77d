"""What a capture size list costs, and vLLM's own lists.

vLLM's default list (``default_capture_sizes``), the FULL decode graphs it captures under speculative decoding
(``spec_decode_sizes``) and the graphs a mode captures per size (``graphs_per_size``); the KV bytes a token
takes; and the cost model.

Costs (:class:`CaptureCosts`)
    Capture seconds linear in the number of graphs and the sum of their sizes; graph GiB linear in the
    number of graphs and the largest size, the shape of vLLM's own estimate (one largest capture fills the
    shared pool, each further graph adds an overhead). Least squares through the origin on measured engine
    starts (vLLM's "Graph capturing finished in N secs, took X GiB" with the resolved size list). When every
    measured start captured the same list the size terms cannot be told apart and the fit is per graph
    only: the GiB saved is then an upper bound, and ``basis`` says so.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from graphmode.core.records import StartupInfo

__all__ = [
    "GIB",
    "GIB_BASE_MIN_STARTS",
    "CaptureCosts",
    "costs_from_dataset",
    "default_capture_sizes",
    "graphs_per_size",
    "kv_bytes_per_token",
    "lone_starts",
    "measured_kv_bytes_per_token",
    "spec_decode_sizes",
    "start_tuples",
]

GIB = 1024**3
# Each capture size is one graph per routine the mode captures (fixture logs: 51 PIECEWISE + 51 FULL
# graphs for FULL_AND_PIECEWISE, 51 for each single mode).
_GRAPHS_PER_SIZE = {"NONE": 0, "PIECEWISE": 1, "FULL": 1, "FULL_DECODE_ONLY": 1, "FULL_AND_PIECEWISE": 2}


def graphs_per_size(mode: str) -> int:
    return _GRAPHS_PER_SIZE.get(mode.upper(), 1)


def default_capture_sizes(max_num_seqs: int = 256, max_num_batched_tokens: int | None = None,
                          max_capture_size: int | None = None) -> list[int]:
    """vLLM's own list for these scheduler settings (see the module docstring for where it comes from)."""
    top = max_capture_size if max_capture_size is not None else min(2 * max_num_seqs, 512)
    if max_num_batched_tokens is not None:
        top = min(top, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return sizes


def spec_decode_sizes(sizes: Sequence[int], query_len: int) -> list[int]:
    """The FULL decode graphs vLLM captures for ``sizes`` when a decode step verifies ``query_len`` = 1 + k
    tokens a request (speculative decoding): each size rounded up to a multiple of ``query_len``, none above
    the largest size, ``[query_len]`` if that leaves none (vLLM 0.33, ``adjust_cudagraph_sizes_for_spec_decode``
    in vllm/config/compilation.py; on the H200 the default list of 51 sizes gave 49 FULL graphs at k = 3)."""
    if query_len <= 1 or not sizes:
        return sorted(sizes)
    top = max(sizes)
    out = sorted({-(-s // query_len) * query_len for s in sizes if -(-s // query_len) * query_len <= top})
    return out or ([query_len] if query_len <= top else [])


# Graph GiB has a part no list choice saves: the H200 8B's lone starts (vLLM 0.33) took 0.38 GiB for 7 sizes
# to 512 and 0.45 for 51, 0.87 for 41 to 2048. Without a base term the fit put it on the largest size and,
# leaving each start out in turn, predicted 0.20 for the 7 sizes and 1.28 for the list to 2048; with it
# 0.39 and 0.99 (docs/capture-sizes.md, "Graph GiB has a base"). A third term needs a fourth start to be
# more than a curve through three points.
GIB_BASE_MIN_STARTS = 4


class CaptureCosts(BaseModel):
    """Capture seconds and graph GiB of a size list, fit on measured engine starts.

    Seconds: ``s_per_graph * graphs + s_per_token * (sum of sizes over graphs)`` (each graph is one capture,
    larger ones take longer). GiB: ``gib_base + gib_per_graph * graphs + gib_per_max_token * largest size``,
    the shape of vLLM's own estimate (``profile_cudagraph_memory`` in vllm/v1/worker/gpu_model_runner.py: the
    first, largest capture fills the shared pool, every further graph adds a per-graph overhead; FULL and
    PIECEWISE overlay the pool) plus what any list costs. ``gib_base`` is fit only from more starts than
    the three terms, whose lists differ in both count and largest size (:data:`GIB_BASE_MIN_STARTS`);
    otherwise it is 0 and the largest-size term carries it. ``identified`` is False when every start
    captured one list, so only the per-graph terms could be fit: the GiB saved is then an upper bound (the
    largest graph's pool stays).

    ``reserved_*``: the same form fit on what vLLM *reserved* for the graphs before it sized the KV cache
    (its profiled estimate, "CUDA graph pool memory: X GiB (actual), Y GiB (estimated)"), which is what
    KV cache tokens gained follow: on the H200 (vLLM 0.33) the estimate ran 1.6-2.4x the graphs' actual
    GiB, and the KV tokens a list gained matched the estimate's difference (8B, 22 sizes: +1,440 tokens
    measured, 0.18 GiB less reserved = 1,474; the actual 0.04 GiB less = 327). ``reserved_n_starts`` 0:
    no start logged an estimate, and KV gains fall back to the actual GiB.
    """

    s_per_graph: float = 0.0
    s_per_token: float = 0.0
    gib_base: float = Field(0.0, description="graph GiB any list costs, whatever its count and largest size")
    gib_per_graph: float = 0.0
    gib_per_max_token: float = 0.0
    reserved_gib_base: float = 0.0
    reserved_gib_per_graph: float = 0.0
    reserved_gib_per_max_token: float = 0.0
    reserved_n_starts: int = Field(0, description="starts that logged vLLM's graph-memory estimate")
    n_starts: int = 0
    identified: bool = False
    top_identified: bool = Field(True, description="False when every fitted start's list ended at one size: the "
                                 "largest size's term is then unknown, and no GiB is predicted above it")
    basis: str = "no measured engine start"
    loo_rel_error_s: float | None = Field(None, description="largest leave-one-out relative error of capture s "
                                          "over the fitted starts (None: not computed, or fewer than 3 starts)")
    loo_rel_error_gib: float | None = Field(None, description="the same for graph GiB")
    max_top: int | None = Field(None, description="the largest size any fitted start captured (None: not "
                                                  "recorded, as in costs saved before it was)")

    def knows_gib(self, sizes: Sequence[int]) -> bool:
        """Whether :meth:`predict`'s GiB means anything for *sizes*. Fit on one list, it knows the per-graph
        term only, which can bound a saving only while the largest graph (the shared pool's) is no larger
        than a measured one: the H200 8B with --max-num-seqs 1024 (2026-12-03) was predicted 0.25 GiB for a
        list to 1024 from one start of the default's to 512, and its lone start took 0.60 against 0.45."""
        return ((self.identified and self.top_identified) or self.max_top is None
                or max(sizes, default=0) <= self.max_top)

    def predict(self, sizes: Sequence[int], mode: str) -> tuple[float, float]:
        g = graphs_per_size(mode)
        n, tok, top = g * len(sizes), g * sum(sizes), max(sizes, default=0)
        gib = self.gib_base + self.gib_per_graph * n + self.gib_per_max_token * top if n else 0.0
        return (self.s_per_graph * n + self.s_per_token * tok, gib)

    def predict_reserved(self, sizes: Sequence[int], mode: str) -> float | None:
        """GiB vLLM would reserve for *sizes*' graphs before sizing the KV cache (``None``: never logged)."""
        if not self.reserved_n_starts:
            return None
        n, top = graphs_per_size(mode) * len(sizes), max(sizes, default=0)
        return (self.reserved_gib_base + self.reserved_gib_per_graph * n
                + self.reserved_gib_per_max_token * top) if n else 0.0

    @classmethod
    def fit(cls, starts: Iterable[tuple[Any, ...]], *, gib_base: bool = True) -> CaptureCosts:
        """Fit from ``(sizes, mode, capture_s, graph_gib[, reserved_gib])`` of measured engine starts
        (``reserved_gib``: vLLM's logged estimate, or ``None``); ``gib_base=False`` fits GiB through the
        origin whatever the starts (the model before 2026-12-04, for comparison)."""
        rows = [(list(t[0]), t[1], t[2], t[3], t[4] if len(t) > 4 else None) for t in starts
                if t[0] and graphs_per_size(t[1]) > 0]
        if not rows:
            return cls()
        n = np.array([graphs_per_size(r[1]) * len(r[0]) for r in rows], float)
        x_s = np.column_stack([n, [graphs_per_size(r[1]) * sum(r[0]) for r in rows]])
        secs = np.array([r[2] for r in rows], float)
        # The size terms are identified only when the starts captured lists of different shape.
        ident_s = np.linalg.matrix_rank(x_s / n[:, None]) >= 2
        a_s, b_s = _nonneg_lstsq(x_s, secs) if ident_s else (float(secs @ n / (n @ n)), 0.0)
        ident_g, top_g, c_g, a_g, b_g = _fit_gib([(r[0], r[1], r[3]) for r in rows], base=gib_base)
        reserved = [(r[0], r[1], r[4]) for r in rows if r[4] is not None]
        _, _, rc, ra, rb = _fit_gib(reserved, base=gib_base) if reserved else (False, False, 0.0, 0.0, 0.0)
        top = max(max(r[0]) for r in rows)
        if ident_s and ident_g:
            basis = f"least squares on {len(rows)} engine starts with different size lists"
            if not top_g:
                basis += (f" all ending at {top} (a list ending lower is credited no smaller graph pool; one "
                          "ending higher gets no graph GiB)")
            elif c_g:
                basis += f" (graph GiB with a base of {c_g:.2f})"
        else:
            basis = (f"per graph, from {len(rows)} engine starts that all captured one size list (the size "
                     "terms need starts with another list; graph GiB saved is an upper bound)")
        if reserved:
            basis += f"; KV cache tokens from vLLM's graph-memory estimate in {len(reserved)} of them"
        return cls(s_per_graph=a_s, s_per_token=b_s, gib_base=c_g, gib_per_graph=a_g, gib_per_max_token=b_g,
                   reserved_gib_base=rc, reserved_gib_per_graph=ra, reserved_gib_per_max_token=rb,
                   reserved_n_starts=len(reserved), n_starts=len(rows), identified=bool(ident_s and ident_g),
                   top_identified=top_g, basis=basis, max_top=top)

    @classmethod
    def from_startups(cls, startups: Iterable[StartupInfo], *, max_num_seqs: int = 256) -> CaptureCosts:
        """:meth:`fit` on parsed start-up logs; one without a resolved size list is taken to have captured
        vLLM's default list for its ``max_num_seqs`` (what the resolved config of such logs shows)."""
        return cls.fit(start_tuples(startups, max_num_seqs=max_num_seqs))

    def with_loo_error(self, starts: Sequence[tuple[Any, ...]]) -> CaptureCosts:
        """This fit with its leave-one-out errors: each start predicted by the fit on the others, the largest
        relative error of capture seconds and of graph GiB (``None`` with fewer than three starts)."""
        if len(starts) < 3:
            return self
        err_s: list[float] = []
        err_g: list[float] = []
        for i, (sizes, mode, secs, gib, *_rest) in enumerate(starts):
            other = type(self).fit([t for j, t in enumerate(starts) if j != i])
            p_s, p_g = other.predict(sizes, mode)
            if secs > 0:
                err_s.append(abs(p_s - secs) / secs)
            if gib > 0 and other.knows_gib(sizes):
                err_g.append(abs(p_g - gib) / gib)
        return self.model_copy(update={"loo_rel_error_s": round(max(err_s), 3) if err_s else None,
                                       "loo_rel_error_gib": round(max(err_g), 3) if err_g else None})


def start_tuples(startups: Iterable[StartupInfo], *, max_num_seqs: int = 256) -> list[tuple[Any, ...]]:
    """``(sizes, mode, capture_s, graph_gib, reserved_gib)`` of the starts that logged their capture; one
    without a resolved size list is taken to have captured vLLM's default list for its ``max_num_seqs``."""
    starts: list[tuple[Any, ...]] = []
    for st in startups:
        mode = st.effective_mode or st.requested_mode
        if st.capture_s is None or st.graph_gib is None or mode is None:
            continue
        sizes = st.capture_sizes
        if not sizes:
            args = st.non_default_args or {}
            seqs = args.get("max_num_seqs")
            sizes = default_capture_sizes(seqs if isinstance(seqs, int) else max_num_seqs, st.max_num_batched_tokens)
        starts.append((sizes, mode, st.capture_s, st.graph_gib, st.estimated_graph_gib))
    return starts


def _fit_gib(rows: Sequence[tuple[list[int], str, float]], *,
             base: bool = True) -> tuple[bool, bool, float, float, float]:
    """``(identified, largest size identified, base, per graph, per token of the largest size)`` from
    ``(sizes, mode, gib)``."""
    n = np.array([graphs_per_size(m) * len(s) for s, m, _ in rows], float)
    x = np.column_stack([n, [max(s) for s, _, _ in rows]])
    y = np.array([g for _, _, g in rows], float)
    ident = bool(np.linalg.matrix_rank(x) >= 2 and len({len(s) for s, _, _ in rows}) > 1)
    if ident and base and len({max(s) for s, _, _ in rows}) == 1:
        # One largest size: its term and a base are one number. Kept as a base, a list ending lower is not
        # credited a smaller pool nobody measured (through the origin, the H200 8B's lists to 512 predicted
        # 1.55 GiB for one to 2048 that took 0.87: bench/capture_costs.py).
        a, c = _nonneg_lstsq(np.column_stack([n, np.ones(len(rows))]), y)
        return ident, False, c, a, 0.0
    a, b = _nonneg_lstsq(x, y) if ident else (float(y @ n / (n @ n)), 0.0)
    xc = np.column_stack([np.ones(len(rows)), x])
    if base and ident and len(rows) >= GIB_BASE_MIN_STARTS and np.linalg.matrix_rank(xc) >= 3:
        c, a, b = (float(v) for v in _nnls(xc, y))
        return ident, True, c, a, b
    return ident, ident, 0.0, a, b


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a few columns, exactly: the best of the least-squares fits on every
    subset of columns whose coefficients are all >= 0 (the optimum is one of them). numpy only, so that
    `launch` predicting a capture list imports no scipy."""
    best, coef = np.inf, np.zeros(x.shape[1])
    for mask in range(1, 2 ** x.shape[1]):
        cols = [j for j in range(x.shape[1]) if mask >> j & 1]
        sol, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (sol < 0).any():
            continue
        err = float(np.sum((y - x[:, cols] @ sol) ** 2))
        if err < best:
            best, coef = err, np.zeros(x.shape[1])
            coef[cols] = sol
    return coef


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    if coef[0] >= 0 and coef[1] >= 0:
        return float(coef[0]), float(coef[1])
    # A negative term has no physical meaning: keep the better of the one-term fits.
    fits = []
    for j in (0, 1):
        c = float(y @ x[:, j] / (x[:, j] @ x[:, j]))
        fits.append((float(np.sum((y - c * x[:, j]) ** 2)), j, max(c, 0.0)))
    _, j, c = min(fits)
    return (c, 0.0) if j == 0 else (0.0, c)


def kv_bytes_per_token(config: Mapping[str, Any], dtype_bytes: int = 2) -> float | None:
    """K and V of one token over every layer, from a Hugging Face config.json (``None`` if it lacks a shape).

    ``2 * layers * kv_heads * head_dim * dtype_bytes``: 32 KiB for Llama-3.2-1B, 128 KiB for Llama-3.1-8B
    in bf16, which is what the H200 logs' KV cache GiB / tokens gives.
    """
    cfg = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    assert isinstance(cfg, Mapping)
    layers, heads, hidden = cfg.get("num_hidden_layers"), cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
        return None
    assert isinstance(layers, int) and isinstance(heads, int) and isinstance(hidden, int)
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int):
        return None
    return float(2 * layers * kv_heads * head_dim * dtype_bytes)


def measured_kv_bytes_per_token(rows: Iterable[Mapping[str, Any]],
                                model_config_hash: str | None = None) -> float | None:
    """KV cache bytes per token as the engines logged it (KV cache GiB / tokens, the median over starts of
    the shape), for a dataset without the model's config.json; it also counts a quantized KV cache right.
    ``None`` when no row has both."""
    got = sorted(float(r["kv_cache_gib"]) * GIB / float(r["kv_cache_tokens"]) for r in rows
                 if (model_config_hash is None or r.get("fp_model_config_hash") == model_config_hash)
                 and isinstance(r.get("kv_cache_gib"), int | float) and isinstance(r.get("kv_cache_tokens"), int)
                 and r["kv_cache_gib"] > 0 and r["kv_cache_tokens"] > 0)
    return got[len(got) // 2] if got else None


def costs_from_dataset(*paths: Any, model_config_hash: str | None = None,
                       num_params_b: float | None = None) -> CaptureCosts:
    """:class:`CaptureCosts` from the engine starts in profile datasets (a model's sources), for one shape.

    Rows of the shape with ``model_config_hash`` when given and present; else of the shape nearest in
    parameters; else all rows. Each engine start counts once (its cells share its start-up log); race
    starts do not count at all, since engines started side by side measure their neighbours' memory.
    Cached per file version: the service answers many requests from one model folder.
    """
    versions = tuple((str(p), os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in paths)
    return _costs_cached(versions, model_config_hash, num_params_b)


@functools.lru_cache(maxsize=32)
def _costs_cached(versions: tuple[tuple[str, int, int], ...], model_config_hash: str | None,
                  num_params_b: float | None) -> CaptureCosts:
    from graphmode.core.dataset import ProfileStore

    rows: list[dict[str, Any]] = []
    for path, _mtime_ns, _size in versions:
        with ProfileStore(path, readonly=True) as store:
            rows += [r for r in store.rows(status="ok") if not r.get("race_id")]
    if not rows:
        return CaptureCosts()
    shapes = {r.get("fp_model_config_hash") for r in rows}
    pick: Any = None
    if model_config_hash in shapes:
        pick = model_config_hash
    elif num_params_b is not None:
        sized = [(abs((r.get("fp_num_params_b") or 0) - num_params_b), r.get("fp_model_config_hash")) for r in rows
                 if r.get("fp_num_params_b") is not None]
        pick = min(sized)[1] if sized else None
    if pick is not None:
        rows = [r for r in rows if r.get("fp_model_config_hash") == pick]
    starts = start_tuples(lone_starts(rows))
    return CaptureCosts.fit(starts).with_loo_error(starts)


def lone_starts(rows: Iterable[Mapping[str, Any]]) -> list[StartupInfo]:
    """One start-up record per engine start among dataset rows outside races (a start's cells share it)."""
    seen: set[tuple[Any, ...]] = set()
    starts: list[StartupInfo] = []
    for r in rows:
        if r.get("race_id"):
            continue
        key = (r.get("run_id"), r.get("mode"), r.get("repeat"), r.get("startup_s"))
        if key in seen:
            continue
        seen.add(key)
        starts.append(StartupInfo(
            capture_s=r.get("capture_s"), graph_gib=r.get("graph_gib"), effective_mode=r.get("effective_mode"),
            estimated_graph_gib=r.get("estimated_graph_gib"), kv_cache_tokens=r.get("kv_cache_tokens"),
            requested_mode=r.get("mode"), max_num_batched_tokens=r.get("max_num_batched_tokens"),
            capture_sizes=_json_list(r.get("capture_sizes")), non_default_args=_json_dict(r.get("non_default_args")),
        ))
    return starts


def _json_list(raw: Any) -> list[int] | None:
    import json

    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return [int(v) for v in value] if isinstance(value, list) and all(isinstance(v, int) for v in value) else None


def _json_dict(raw: Any) -> dict[str, Any] | None:
    import json

    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
