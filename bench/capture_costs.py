#!/usr/bin/env python3
"""How well the capture-cost fit predicts each measured engine start it did not see.

For each dataset (one shape's lone starts of different capture lists, e.g. models/profiles/cap-h200-*.sqlite),
every start is left out in turn and predicted from the others: graph GiB by the shipped fit (a base term
once four starts show it) and through the origin (the fit before 2026-12-04), capture seconds, and the KV
cache tokens it gained over the default list's start, from the GiB vLLM reserved for the graphs (its logged
estimate) and from their actual GiB. A start left with fewer than two other lists is predicted in-sample,
and one whose largest size no other list reaches is an extrapolation; both are marked. docs/capture-sizes.md quotes
these tables ("Graph GiB has a base", "KV cache tokens gained").

    .venv/bin/python bench/capture_costs.py models/profiles/cap-h200-llama-3.1-8b.sqlite [more.sqlite ...]
        [--pool]   (one table over the datasets' starts, e.g. the 8B's and its long case's)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from graphmode.core.dataset import ProfileStore
from graphmode.core.records import StartupInfo
from graphmode.selector.capture_costs import (
    GIB,
    CaptureCosts,
    default_capture_sizes,
    lone_starts,
    measured_kv_bytes_per_token,
)


def _row(st: StartupInfo) -> tuple[list[int], str, float, float, float | None]:
    assert st.capture_sizes and st.capture_s is not None and st.graph_gib is not None
    mode = st.effective_mode or st.requested_mode or "FULL_AND_PIECEWISE"
    return (st.capture_sizes, mode, st.capture_s, st.graph_gib, st.estimated_graph_gib)


def table(paths: list[Path]) -> list[str]:
    rows: list[dict[str, object]] = []
    for path in paths:
        with ProfileStore(path, readonly=True) as store:
            rows += store.rows(status="ok")
    starts = [s for s in lone_starts(rows) if s.capture_s is not None and s.graph_gib is not None]
    for s in starts:
        if not s.capture_sizes:  # vLLM's default list, as costs_from_dataset takes it
            s.capture_sizes = default_capture_sizes(256, s.max_num_batched_tokens)
    bpt = measured_kv_bytes_per_token(rows)
    default = next((s for s in starts if s.capture_sizes == default_capture_sizes(256, s.max_num_batched_tokens)),
                   None)
    names = " + ".join(p.name for p in paths)
    out = [f"{names}: {len(starts)} lone starts, KV bytes per token {bpt or 0:,.0f} (engines' logs)", "",
           "| sizes | largest | capture s | predicted | graph GiB | predicted | through origin | reserved GiB "
           "| KV tokens gained | from reserved | from actual |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, st in enumerate(starts):
        sizes, mode, secs, gib, reserved = _row(st)
        others = [_row(s) for j, s in enumerate(starts) if j != i]
        held_out = len({len(o[0]) for o in others}) >= 2
        fit_on = others if held_out else [_row(s) for s in starts]
        # above every other list's largest size the GiB terms are extrapolated (as the answer does once fit)
        mark = " (in)" if not held_out else "" if any(max(o[0]) >= max(sizes) for o in others) else " (ex)"
        full, origin = CaptureCosts.fit(fit_on), CaptureCosts.fit(fit_on, gib_base=False)
        p_s, p_g = full.predict(sizes, mode)
        known = full.knows_gib(sizes)  # what the answer does: no GiB where the fit cannot say
        g_txt = f"{p_g:.2f}{mark}" if known else "not predicted"
        kv = r_kv = a_kv = "-"
        if default is not None and bpt and st.kv_cache_tokens is not None and default.kv_cache_tokens is not None:
            kv = f"{st.kv_cache_tokens - default.kv_cache_tokens:+,}"
            d_sizes = default.capture_sizes or []
            r_d, r_s = full.predict_reserved(d_sizes, mode), full.predict_reserved(sizes, mode)
            if r_d is not None and r_s is not None and known:
                r_kv = f"{(r_d - r_s) * GIB / bpt:+,.0f}{mark}"
            if known:
                a_kv = f"{(full.predict(d_sizes, mode)[1] - p_g) * GIB / bpt:+,.0f}{mark}"
        out.append(f"| {len(sizes)} | {max(sizes)} | {secs:g} | {p_s:.1f}{mark} | {gib:.2f} | {g_txt} | "
                   f"{origin.predict(sizes, mode)[1]:.2f}{mark} | "
                   f"{'-' if reserved is None else f'{reserved:.2f}'} | {kv} | {r_kv} | {a_kv} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("datasets", nargs="+", type=Path)
    ap.add_argument("--pool", action="store_true", help="the datasets hold one shape: one table over all their starts")
    a = ap.parse_args(argv)
    for path in a.datasets:
        if not path.is_file():
            print(f"no dataset at {path}", file=sys.stderr)
            return 2
    for group in [a.datasets] if a.pool else [[p] for p in a.datasets]:
        print("\n".join(table(group)) + "\n")
    print("predicted: each start left out and predicted from the others; '(in)': fit on every start, itself "
          "included (too few other lists remain); '(ex)': its largest size is above every other list's. KV tokens "
          "gained: over the default list's lone start, measured and predicted.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
