#!/usr/bin/env python3
"""Turns what `bench/realtime` recorded in bench/out-realtime/ into a Markdown report (stdout).

Added latencies are a hop's percentile minus the direct run's in the same phase; the three targets
of a phase run one after the other on the same machine, with the mock and the client beside them.
The issue's targets: 1,000 concurrent sessions through one node, the node's added p99 a frame
within 1 ms of nginx's, at most 64 KiB of node memory per open session.
"""

import statistics
import sys
from pathlib import Path

from bench_output import foreign_cores_of, load

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out-realtime")
rows, machine, cpu = load(OUT)
foreign_cores = foreign_cores_of(cpu)

# The targets, for the verdict lines.
ADDED_P99_OVER_NGINX_US = 1000
KIB_PER_SESSION = 64


def ms(us):
    return f"{us / 1000:.2f}"


def added(value, base):
    if base is None:
        return "–"
    d = value - base
    return f"{'+' if d >= 0 else '−'}{abs(d) / 1000:.2f}"


out = []
p = out.append
p(f"# recovea Realtime benchmark: {machine.get('mode')} run of {machine.get('date')}")
p("")
p(f"- machine: {machine.get('nproc')} cores ({machine.get('cpu')}), {machine.get('mem')}, "
  f"Linux {machine.get('kernel')}; descriptors a process may open: {machine.get('nofile')}")
p(f"- source: commit {machine.get('commit')} ({machine.get('dirty')} modified tracked files), "
  f"{machine.get('rustc')}; nginx {machine.get('nginx')}")
p(f"- load average before / after: {machine.get('load_before')} / {machine.get('load_after')}")
runs = [r for r in rows if r["kind"] == "realtime"]
busy = [v for v in (foreign_cores(r["t0"], r["t1"]) for r in runs) if v is not None]
if busy:
    p(f"- other processes' CPU during the runs: {statistics.mean(busy):.2f} cores on average, "
      f"{max(busy):.2f} at most (the benchmark's own processes excluded)")
p("")
p("Every session is a WebSocket on a plain HTTP/1.1 connection of its own. Once all are open, each "
  "sends a `conversation.item.create` every period; a *round trip* is the time from its send to "
  "the arrival of `conversation.item.added` (*item*), or, every K-th round, from a "
  "`response.create` to its `response.done` (*response*, a whole response of some dozen events). "
  "*Added* is the hop's percentile less *direct*'s; *gw − nginx* is the gateway's added less "
  "nginx's. RSS per session is the hop's RSS with every session open, before the traffic, less its "
  "RSS before the first session, divided by the sessions open (*max*: the same at the most RSS "
  "reached while all were open, the traffic included). CPU per frame is the hop's CPU time over "
  "the steady window (every session sending) divided by the WebSocket messages the client sent "
  "and received in it (each one relayed once by the hop). nginx's figures are its workers' summed. "
  "*Other procs' cores*: CPU used meanwhile by processes outside the benchmark.")
p("")

phases = []
for r in runs:
    if r["phase"] not in phases:
        phases.append(r["phase"])
verdicts = []
for phase in phases:
    prs = [r for r in runs if r["phase"] == phase]
    first = prs[0]
    period = first["period_ms"]
    every = first["response_every"]
    rps = first["n"] * 1000 / period
    p(f"## {phase}: {first['n']:,} sessions, an event every {period} ms each ({rps:,.0f} round trips "
      f"a second), {first['seconds']} s, opened {first['rate']}/s"
      + (f", every {every}th round a response" if every else ""))
    p("")
    direct = next((r for r in prs if r["target"] == "direct"), None)
    base = direct["r"] if direct else None
    nginx = next((r for r in prs if r["target"] == "nginx"), None)
    p("| target | opened | failed | peak open | item p50 / p90 / p99 / p99.9 / max ms | added item "
      "p50 / p99 / p99.9 | gw − nginx p99 | response p50 / p99 ms | added response p99 | open p50 / "
      "p99 ms | RSS idle → open (max) MiB | KiB per session (max) | CPU µs per frame | hop cores | "
      "mock cores | client cores | other procs' cores |")
    p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
      "---: | ---: | ---: | ---: |")
    for r in prs:
        x = r["r"]
        st = x.get("steady") or {}
        it, rs = x["item_us"], x["response_us"]
        is_base = r["target"] == "direct"
        fc = foreign_cores(r["t0"], r["t1"])
        gw_vs_nginx = "–"
        if r["target"] == "gateway" and nginx and base:
            gw_vs_nginx = added(it["p99"] - base["item_us"]["p99"],
                                nginx["r"]["item_us"]["p99"] - base["item_us"]["p99"])
        rss = x["rss"]
        row = [
            r["target"],
            f"{x['opened']:,}",
            f"{x['failed']:,}" + (f" {x['errors']}" if x["failed"] else ""),
            f"{x['peak_open']:,}",
            f"{ms(it['p50'])} / {ms(it['p90'])} / {ms(it['p99'])} / {ms(it['p999'])} / {ms(it['max'])}",
            "–" if is_base or not base else
            f"{added(it['p50'], base['item_us']['p50'])} / {added(it['p99'], base['item_us']['p99'])} / "
            f"{added(it['p999'], base['item_us']['p999'])}",
            gw_vs_nginx,
            f"{ms(rs['p50'])} / {ms(rs['p99'])}" if rs["n"] else "n/a",
            "–" if is_base or not base or not rs["n"] else added(rs["p99"], base["response_us"]["p99"]),
            f"{ms(x['open_us']['p50'])} / {ms(x['open_us']['p99'])}",
            "–" if is_base else
            f"{rss['idle_kib'] / 1024:.1f} → {rss['peak_kib'] / 1024:.1f} ({rss['open_max_kib'] / 1024:.1f})",
            "–" if is_base else f"{rss['per_session_kib']:.1f} ({rss['per_session_max_kib']:.1f})",
            "–" if is_base or not st else f"{st['proxy_cpu_us_per_frame']:.2f}",
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
        line = (f"- {r['target']}: ramp {x['ramp_s']:.1f} s, run {x['total_s']:.1f} s; "
                f"{x['item_us']['n']:,} item and {x['response_us']['n']:,} response round trips; "
                f"frames sent {x['frames_sent']:,}, received {x['frames_received']:,}; "
                f"rounds sent over 10 ms late {x['late_rounds']:,} (worst {ms(x['late_max_us'])} ms)")
        if st:
            line += (f"; steady window {st['from_s']:.1f}–{st['to_s']:.1f} s ({st['frames']:,} frames, "
                     f"{st['frames_per_s']:,.0f}/s; item p99 there {ms(st['item_us']['p99'])} ms); mock "
                     f"{st['mock_cpu_us_per_frame']:.1f} µs and client {st['client_cpu_us_per_frame']:.1f} µs "
                     f"of CPU per frame")
        else:
            line += "; no steady window"
        p(line)
        if r["target"] != "direct":
            p(f"  - RSS: {x['rss']['idle_kib']:,} KiB before, {x['rss']['peak_kib']:,} KiB with "
              f"{x['rss']['peak_open']:,} open at {x['rss']['peak_at_s']:.1f} s, at most "
              f"{x['rss']['max_kib']:,} KiB, {x['rss']['end_kib']:,} KiB at the end")
        if x["error_samples"]:
            p(f"  - errors: {'; '.join(x['error_samples'][:3])}")
        if "gateway_metrics" in r:
            m = r["gateway_metrics"]
            p(f"  - gateway: Realtime sessions open after the run {m['realtime_sessions']}, cut "
              f"{m['realtime_cuts']}; receipts delivered to its ledger {m['receipts_delivered']}, "
              f"pending {m['receipts_pending']}")
    # The per-second item p99, to tell a steady hop from one that stalls now and then, beside the
    # CPU other processes took in that second (the run's epoch is within milliseconds of t0).
    p("")
    p("Item round trips by second of the traffic (the second they ended in, from the common start): "
      "p50 / p99 / most, ms; and the cores other processes used in that second.")
    p("")
    seconds = {}
    for r in prs:
        x = r["r"]
        start = x.get("start_s")
        if start is None:
            start = (x.get("steady") or {}).get("from_s", 0) - r["period_ms"] / 1000
        for second, n, p50, p99, most in x.get("timeline") or []:
            rel = second - int(start)
            fc = foreign_cores(r["t0"] + second * 1000, r["t0"] + (second + 1) * 1000)
            seconds.setdefault(rel, {})[r["target"]] = (p50, p99, most, fc)
    targets = [r["target"] for r in prs]
    p("| second | " + " | ".join(f"{t} | others" for t in targets) + " |")
    p("| ---: | " + " | ".join("---: | ---:" for _ in targets) + " |")
    for rel in sorted(seconds):
        cells = []
        for t in targets:
            v = seconds[rel].get(t)
            if v is None:
                cells += ["", ""]
                continue
            p50, p99, most, fc = v
            cells += [f"{ms(p50)} / {ms(p99)} / {ms(most)}", "n/a" if fc is None else f"{fc:.2f}"]
        p(f"| {rel} | " + " | ".join(cells) + " |")
    p("")
    gw = next((r for r in prs if r["target"] == "gateway"), None)
    if gw and nginx and base:
        g, n = gw["r"], nginx["r"]
        gw_added = g["item_us"]["p99"] - base["item_us"]["p99"]
        ng_added = n["item_us"]["p99"] - base["item_us"]["p99"]
        latency_ok = gw_added - ng_added <= ADDED_P99_OVER_NGINX_US
        memory_ok = g["rss"]["per_session_kib"] <= KIB_PER_SESSION
        held_ok = g["peak_open"] >= first["n"] and g["failed"] == 0
        verdicts.append(
            f"- {phase}: {g['peak_open']:,} of {first['n']:,} sessions open at once through the "
            f"gateway, {g['failed']} failed: **{'holds' if held_ok else 'fails'}**; added item p99 "
            f"{added(gw_added, 0)} ms against nginx's {added(ng_added, 0)} ms, a difference of "
            f"{added(gw_added - ng_added, 0)} ms (target ≤ +1.00): "
            f"**{'holds' if latency_ok else 'fails'}**; RSS {g['rss']['per_session_kib']:.1f} KiB per "
            f"open session ({g['rss']['per_session_max_kib']:.1f} at the most during the traffic; "
            f"nginx {n['rss']['per_session_kib']:.1f}; target ≤ {KIB_PER_SESSION}): "
            f"**{'holds' if memory_ok else 'fails'}**")
if verdicts:
    p("## The issue's targets")
    p("")
    out.extend(verdicts)
    p("")

print("\n".join(out))
