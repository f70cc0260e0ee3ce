#!/usr/bin/env python3
"""Turns what `bench/streams` recorded in bench/out-streams/ into a Markdown report (stdout).

Added latencies are a hop's percentile minus the direct run's in the same phase; the three targets
of a phase run one after the other on the same machine, with the mock and the client beside them.
"""

import statistics
import sys
from pathlib import Path

from bench_output import foreign_cores_of, load

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out-streams")
rows, machine, cpu = load(OUT)
foreign_cores = foreign_cores_of(cpu)


def ms(us):
    return f"{us / 1000:.2f}"


def added(value, base):
    if base is None:
        return "–"
    d = value - base
    return f"{'+' if d >= 0 else '−'}{abs(d) / 1000:.2f}"


out = []
p = out.append
p(f"# recovea streams benchmark: {machine.get('mode')} run of {machine.get('date')}")
p("")
p(f"- machine: {machine.get('nproc')} cores ({machine.get('cpu')}), {machine.get('mem')}, "
  f"Linux {machine.get('kernel')}; descriptors a process may open: {machine.get('nofile')}")
p(f"- source: commit {machine.get('commit')} ({machine.get('dirty')} modified tracked files), "
  f"{machine.get('rustc')}; nginx {machine.get('nginx')}")
p(f"- load average before / after: {machine.get('load_before')} / {machine.get('load_after')}")
runs = [r for r in rows if r["kind"] == "streams"]
busy = [v for v in (foreign_cores(r["t0"], r["t1"]) for r in runs) if v is not None]
if busy:
    p(f"- other processes' CPU during the runs: {statistics.mean(busy):.2f} cores on average, "
      f"{max(busy):.2f} at most (the benchmark's own processes excluded)")
p("")
p("Every stream is a streaming chat request on an HTTP/1.1 connection of its own (usage asked, so "
  "that all three targets send the same events); *events* count SSE events (blank-line ended) as the "
  "client receives them. TTFB is the time from sending the request to its first event. Gaps are "
  "the times between consecutive events of a stream. The hop's CPU per event and the cores are "
  "measured over the steady window (every stream open, none ended; *steady* gaps are those that "
  "arrive in it); RSS per stream is the hop's RSS at the peak of open streams less its RSS before "
  "the first stream, divided by the streams open then. nginx's figures are its workers' summed. "
  "*direct* reaches the mock over HTTP/1.1 (a connection a stream, as nginx does); *direct-h2* over "
  "HTTP/2, 100 streams a connection (as the gateway does): *added* is against *direct*, and in "
  "brackets against *direct-h2*. *Other procs' cores*: CPU used meanwhile by processes outside the "
  "benchmark (other users of the machine; also kernel threads).")
p("")

phases = []
for r in runs:
    if r["phase"] not in phases:
        phases.append(r["phase"])
for phase in phases:
    prs = [r for r in runs if r["phase"] == phase]
    first = prs[0]
    pace = first["pace_ms"]
    p(f"## {phase}: {first['n']:,} streams of {first['pieces']} pieces every {pace} ms "
      f"({1000 / pace:.0f} events/s each, {first['pieces'] * pace / 1000:.0f} s), opened "
      f"{first['rate']}/s")
    p("")
    direct = next((r for r in prs if r["target"] == "direct"), None)
    base = direct["r"] if direct else None
    direct_h2 = next((r for r in prs if r["target"] == "direct-h2"), None)
    base_h2 = ((direct_h2["r"].get("steady") or {}).get("gap_us")) if direct_h2 else None
    p("| target | completed | failed | peak open | TTFB p50 / p99 ms | added TTFB p50 / p99 | "
      "gap p50 / p99 / p99.9 / max ms (steady) | added gap p99 (steady; vs direct-h2) | gap p99 / max ms (all) | "
      "added gap p99 (all) | RSS idle → peak MiB | KiB per stream | CPU µs per event | hop cores | "
      "mock cores | client cores | other procs' cores |")
    p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
      "---: | ---: | ---: | ---: |")
    for r in prs:
        x = r["r"]
        st = x.get("steady") or {}
        g = st.get("gap_us") or {}
        bst = (base.get("steady") or {}).get("gap_us") if base else None
        is_base = r["target"].startswith("direct")
        fc = foreign_cores(r["t0"], r["t1"])
        row = [
            r["target"],
            f"{x['completed']:,}",
            f"{x['failed']:,}" + (f" {x['errors']}" if x["failed"] else ""),
            f"{x['peak_open']:,}",
            f"{ms(x['ttfb_us']['p50'])} / {ms(x['ttfb_us']['p99'])}",
            "–" if is_base or not base else
            f"{added(x['ttfb_us']['p50'], base['ttfb_us']['p50'])} / "
            f"{added(x['ttfb_us']['p99'], base['ttfb_us']['p99'])}",
            f"{ms(g['p50'])} / {ms(g['p99'])} / {ms(g['p999'])} / {ms(g['max'])}" if g else "n/a",
            "–" if is_base or not bst or not g else added(g["p99"], bst["p99"])
            + (f" ({added(g['p99'], base_h2['p99'])})" if base_h2 else ""),
            f"{ms(x['gap_us']['p99'])} / {ms(x['gap_us']['max'])}",
            "–" if is_base or not base else added(x["gap_us"]["p99"], base["gap_us"]["p99"]),
            "–" if is_base else
            f"{x['rss']['idle_kib'] / 1024:.1f} → {x['rss']['peak_kib'] / 1024:.1f}",
            "–" if is_base else f"{x['rss']['per_stream_kib']:.1f}",
            "–" if is_base or not st else f"{st['proxy_cpu_us_per_event']:.1f}",
            "–" if is_base or not st else f"{st['proxy_cores']:.2f}",
            f"{st['mock_cores']:.2f}" if st else "n/a",
            f"{st['client_cores']:.2f}" if st else "n/a",
            "n/a" if fc is None else f"{fc:.2f}",
        ]
        p("| " + " | ".join(row) + " |")
    p("")
    for r in prs:
        x = r["r"]
        st = x.get("steady")
        if st:
            p(f"- {r['target']}: steady window {st['from_s']:.1f}–{st['to_s']:.1f} s "
              f"({st['seconds']:.1f} s, {st['events']:,} events, {st['events_per_s']:,.0f}/s); "
              f"ramp {x['ramp_s']:.1f} s, run {x['total_s']:.1f} s; events {x['events']:,}; "
              f"head p50 {ms(x['head_us']['p50'])} ms; mock {st['mock_cpu_us_per_event']:.1f} µs and "
              f"client {st['client_cpu_us_per_event']:.1f} µs of CPU per event")
        else:
            p(f"- {r['target']}: no steady window (streams ended before all were open); "
              f"ramp {x['ramp_s']:.1f} s, run {x['total_s']:.1f} s")
        if x["error_samples"]:
            p(f"  - errors: {'; '.join(x['error_samples'][:3])}")
        if "gateway_metrics" in r:
            m = r["gateway_metrics"]
            p(f"  - gateway: opened {m['h2_connections']} HTTP/2 and {m['h1_connections']} HTTP/1.1 "
              f"connections to the mock; receipts delivered to its ledger {m['receipts_delivered']}, "
              f"pending at the end {m['receipts_pending']}")
    p("")

print("\n".join(out))
