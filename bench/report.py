#!/usr/bin/env python3
"""Turns what `bench/run` recorded in bench/out/ into a Markdown report (printed on stdout).

Every ratio compares figures measured side by side in the same run; absolute numbers are there for
context only (they depend on the machine and on whatever else it was doing, which the report says).
"""

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from bench_output import foreign_cores_of, load

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/out")
rows, machine, cpu = load(OUT)
foreign_cores = foreign_cores_of(cpu)


def busy_note(records):
    values = [foreign_cores(r["t0"], r["t1"]) for r in records if "t0" in r]
    values = [v for v in values if v is not None]
    if not values:
        return "unknown"
    return f"{statistics.mean(values):.2f} cores on average, {max(values):.2f} at most"


def fmt_us(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def mean(xs):
    return statistics.mean(xs) if xs else float("nan")


def ratio_str(values):
    values = [v for v in values if v == v]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{mean(values):.2f}x ({min(values):.2f}–{max(values):.2f})"


out = []
p = out.append

p(f"# recovea benchmarks: {machine.get('mode')} run of {machine.get('date')}")
p("")
p(f"- machine: {machine.get('nproc')} cores ({machine.get('cpu')}), {machine.get('mem')}, "
  f"Linux {machine.get('kernel')}")
p(f"- source: commit {machine.get('commit')} ({machine.get('dirty')} modified tracked files), "
  f"{machine.get('rustc')}; wrk {machine.get('wrk')}, nginx {machine.get('nginx')}")
p(f"- load average before / after: {machine.get('load_before')} / {machine.get('load_after')}")
loads = [r for r in rows if r["kind"] in ("load", "serial", "ledger", "ttfb", "perf", "profile", "rebuild", "ingest")]
p(f"- other processes' CPU during the measurements: {busy_note(loads)} "
  "(the benchmark's own processes excluded; above ~0.1 the machine was busy)")
p("")

# ---------------------------------------------------------------------------------------------
# Load: direct, nginx, gateway

by = defaultdict(list)
for r in rows:
    if r["kind"] in ("load", "serial"):
        by[(r["mode"], r["conc"], r["target"], r.get("round", 1))].append(r)
modes = ["chat", "stream"]
concs = sorted({r["conc"] for r in rows if r["kind"] in ("load", "serial")})
rounds = sorted({r.get("round", 1) for r in rows if r["kind"] == "load"})


def stat(mode, conc, target, rnd, field):
    recs = by.get((mode, conc, target, rnd), [])
    if not recs:
        return float("nan")
    w = recs[0]["wrk"]
    if field == "rps":
        return w["requests"] / (w["duration_us"] / 1e6)
    return float(w[field])


errors = sum(
    r["wrk"]["status_errors"] + r["wrk"]["connect_errors"] + r["wrk"]["read_errors"]
    + r["wrk"]["write_errors"] + r["wrk"]["timeouts"]
    for r in rows if "wrk" in r and r["kind"] != "warmup"
)
requests = sum(r["wrk"]["requests"] for r in rows if "wrk" in r and r["kind"] != "warmup")

summary = {}
targets = [t for t in ("direct", "nginx", "gateway", "node")
           if any(r.get("target") == t for r in rows if r["kind"] in ("load", "serial"))]
hops = [t for t in ("gateway", "node") if t in targets]
HOP_NAMES = {"gateway": "`recovea serve`", "node": "`recovea node`"}
node_rec = next((r for r in rows if r["kind"] == "node"), None)
node_skipped = next((r for r in rows if r["kind"] == "node_skipped"), None)
# Absent when only some sections ran (BENCH_ONLY).
if concs:
    p("## Proxying: gateway vs an nginx hop vs the mock directly")
    p("")
    p(f"wrk, {len(rounds)} interleaved round(s); figures are means over rounds, ratios are computed per "
      "round and given as mean (min–max). *Added* latency is the hop's percentile minus the direct "
      "call's at the same concurrency. At concurrency 1 latency is the service time; at 32 and 256 all "
      "processes share 2 cores and latency is mostly queueing (Little's law).")
    p("")
    p(f"Requests measured: {requests}; non-2xx answers and socket errors: {errors}.")
    p("")
    if node_rec:
        p("*gateway* is `recovea serve` (its SQLite ledger in the process); *node* is `recovea node` fed "
          "by a `recovea control` on PostgreSQL, its receipts shipped there (the control plane and "
          "PostgreSQL run on the same two cores, outside the node's CPU figures; after each node run "
          "the script waits up to 10 s for the node's spool to empty), counters "
          f"{'in Redis' if node_rec.get('redis') else 'in its process (no Redis)'}; both with one key "
          "and an armed cap, metering on.")
        p("")
    if node_skipped:
        p(f"`recovea node` not measured: PostgreSQL could not be reached ({node_skipped['reason']}).")
        p("")
    for mode in modes:
        p(f"### {'Non-streaming chat' if mode == 'chat' else 'SSE streams'}")
        p("")
        p("| conc | target | RPS | p50 | p99 | added p50 | added p99 |")
        p("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
        for conc in concs:
            for target in targets:
                rps = mean([stat(mode, conc, target, rn, "rps") for rn in rounds])
                p50 = mean([stat(mode, conc, target, rn, "p50_us") for rn in rounds])
                p99 = mean([stat(mode, conc, target, rn, "p99_us") for rn in rounds])
                if target == "direct":
                    added = ("–", "–")
                else:
                    a50 = mean([stat(mode, conc, target, rn, "p50_us") - stat(mode, conc, "direct", rn, "p50_us") for rn in rounds])
                    a99 = mean([stat(mode, conc, target, rn, "p99_us") - stat(mode, conc, "direct", rn, "p99_us") for rn in rounds])
                    added = (fmt_us(a50), fmt_us(a99))
                p(f"| {conc} | {target} | {rps:,.0f} | {fmt_us(p50)} | {fmt_us(p99)} | {added[0]} | {added[1]} |")
        p("")
        p("| conc | hop | RPS hop/nginx | p50 hop/nginx | p99 hop/nginx | added p50 hop/nginx | added p99 hop/nginx | direct RPS / hop RPS |")
        p("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for conc in concs:
            for hop in hops:
                rr, r50, r99, ra50, ra99, dg = [], [], [], [], [], []
                for rn in rounds:
                    g = {f: stat(mode, conc, hop, rn, f) for f in ("rps", "p50_us", "p99_us")}
                    n = {f: stat(mode, conc, "nginx", rn, f) for f in ("rps", "p50_us", "p99_us")}
                    d = {f: stat(mode, conc, "direct", rn, f) for f in ("rps", "p50_us", "p99_us")}
                    rr.append(g["rps"] / n["rps"])
                    r50.append(g["p50_us"] / n["p50_us"])
                    r99.append(g["p99_us"] / n["p99_us"])
                    na50, na99 = n["p50_us"] - d["p50_us"], n["p99_us"] - d["p99_us"]
                    ra50.append((g["p50_us"] - d["p50_us"]) / na50 if na50 > 0 else float("nan"))
                    ra99.append((g["p99_us"] - d["p99_us"]) / na99 if na99 > 0 else float("nan"))
                    dg.append(d["rps"] / g["rps"])
                summary[(mode, conc, hop)] = {"rps": rr, "added_p50": ra50, "direct_over_hop": dg}
                p(f"| {conc} | {hop} | {ratio_str(rr)} | {ratio_str(r50)} | {ratio_str(r99)} | {ratio_str(ra50)} | {ratio_str(ra99)} | {ratio_str(dg)} |")
        p("")

ttfb = [r for r in rows if r["kind"] == "ttfb"]
if ttfb:
    p("### SSE streams: time to first byte (recovea-bench load)")
    p("")
    p("Closed loop, keep-alive, same concurrency; *head* is the first byte of the response, "
      "*first chunk* the first body bytes (the first event), *end* the whole stream.")
    p("")
    p("| conc | target | RPS | head p50 | head p99 | first chunk p50 | first chunk p99 | end p50 | end p99 | errors |")
    p("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in ttfb:
        l = r["load"]
        p(f"| {r['conc']} | {r['target']} | {l['rps']:,.0f} | {fmt_us(l['ttfb_p50_us'])} | {fmt_us(l['ttfb_p99_us'])} | "
          f"{fmt_us(l['first_chunk_p50_us'])} | {fmt_us(l['first_chunk_p99_us'])} | {fmt_us(l['p50_us'])} | "
          f"{fmt_us(l['p99_us'])} | {l['errors'] + l['bad_status']} |")
    p("")
    p("| conc | hop | first chunk p50 hop/nginx | first chunk p99 hop/nginx | added first chunk p50 hop/nginx |")
    p("| ---: | --- | ---: | ---: | ---: |")
    for conc in sorted({r["conc"] for r in ttfb}):
        t = {r["target"]: r["load"] for r in ttfb if r["conc"] == conc}
        for hop in ("gateway", "node"):
            if {"direct", "nginx", hop} <= t.keys():
                g, n, d = t[hop], t["nginx"], t["direct"]
                na = n["first_chunk_p50_us"] - d["first_chunk_p50_us"]
                added = (g["first_chunk_p50_us"] - d["first_chunk_p50_us"]) / na if na > 0 else float("nan")
                p(f"| {conc} | {hop} | {g['first_chunk_p50_us'] / max(n['first_chunk_p50_us'], 1):.2f}x | "
                  f"{g['first_chunk_p99_us'] / max(n['first_chunk_p99_us'], 1):.2f}x | {added:.2f}x |")
    p("")

# ---------------------------------------------------------------------------------------------
# perf

perfstat = [r for r in rows if r["kind"] == "perfstat"]
perfruns = [r for r in rows if r["kind"] == "perf"]
if perfstat:
    p("## CPU time per request (perf stat, concurrency 32)")
    p("")
    p("task-clock of the proxy's processes (nginx: its workers) and, over the same run, of the mock. "
      "*gateway* is `recovea serve` (its SQLite ledger's inserts in the process); *node* is "
      "`recovea node` (its receipts appended to its spool and shipped to the control plane, whose "
      "CPU and PostgreSQL's are not counted). *Ledger down*: serve with SQLite write-locked, so "
      "that it does no ledger work: the request path alone (measured on the fresh serve of the "
      "metering section).")
    p("")
    with_ins = any(x["proxy"].get("instructions") for x in perfstat)
    with_sys = any(x["proxy"].get("sys_enter") for x in perfstat)
    head = "| mode | proxy | requests | proxy CPU / request | mock CPU / request | context switches / request |"
    line = "| --- | --- | ---: | ---: | ---: | ---: |"
    if with_sys:
        head += " system calls / request |"
        line += " ---: |"
    if with_ins:
        head += " instructions / request |"
        line += " ---: |"
    cpu_pr = {}
    per_call = {}
    runs = list(zip(perfstat, perfruns))
    for pinned in (False, True):
        group = [(s_, w) for s_, w in runs if s_.get("pinned", False) == pinned]
        if not group:
            continue
        if pinned:
            p("With the proxy on a core of its own (`taskset`: its threads on core 0; wrk, the mock, the "
              "control plane, PostgreSQL and Redis on the others), as a gateway is deployed: the same "
              "runs without the preemptions by wrk and the mock that two shared cores add to the "
              "proxy's CPU.")
            p("")
        p(head)
        p(line)
        # A proxy's interleaved rounds, pooled for the table; each round's µs a request kept for
        # the ratio to nginx's in the same round.
        pooled, by_round = {}, {}
        for s_, w in group:
            key = (s_["mode"], s_["label"])
            total = pooled.setdefault(key, {"requests": 0, "mock": 0.0, "proxy": {}})
            n = w["wrk"]["requests"] or 1
            total["requests"] += n
            total["mock"] += s_["mock"].get("task-clock", 0)
            for event, value in s_["proxy"].items():
                total["proxy"][event] = total["proxy"].get(event, 0) + value
            by_round.setdefault(key, {})[s_.get("round", 1)] = s_["proxy"].get("task-clock", 0) * 1000 / n
        for (mode, label), total in pooled.items():
            n, pr = total["requests"], total["proxy"]
            pc = pr.get("task-clock", 0) * 1000 / n
            mc = total["mock"] * 1000 / n
            cpu_pr[(mode, label, pinned)] = pc
            extra = ""
            if with_sys:
                extra += f" {pr.get('sys_enter', 0) / n:.1f} |"
            if with_ins:
                extra += f" {pr.get('instructions', 0) / n:,.0f} |"
            p(f"| {mode} | {label} | {n:,} | {pc:.1f} µs | {mc:.1f} µs | {pr.get('context-switches', 0) / n:.2f} |{extra}")
            if not pinned:
                per_call[(mode, label)] = {k[len("sys_enter_"):]: v / n for k, v in pr.items() if k.startswith("sys_enter_")}
        p("")
        for (mode, label), rounds in by_round.items():
            nginx = by_round.get((mode, "nginx"))
            if label == "nginx" or not nginx:
                continue
            ratios = [us / nginx[r] for r, us in rounds.items() if nginx.get(r)]
            if not ratios:  # measured once, apart from the rounds: against nginx's pooled figure
                ratios = [cpu_pr[(mode, label, pinned)] / cpu_pr[(mode, "nginx", pinned)]]
            ratio = sum(ratios) / len(ratios)
            where = ", on a core of its own" if pinned else ""
            spread = f" (the mean of {len(ratios)} rounds' ratios, {min(ratios):.2f}x–{max(ratios):.2f}x)" if len(ratios) > 1 else ""
            p(f"- {mode}, {label}{where}: **{ratio:.2f}x** nginx's CPU time per request{spread}.")
            summary.setdefault("cpu_pinned" if pinned else "cpu", {})[(mode, label)] = ratio
        p("")
    if any(per_call.values()):
        cols = [k for k in per_call if per_call[k]]
        calls = sorted({c for k in cols for c in per_call[k]}, key=lambda c: -max(per_call[k].get(c, 0) for k in cols))
        p("System calls per request, by kind (perf stat on syscalls:sys_enter_*):")
        p("")
        p("| call | " + " | ".join(f"{m}, {l}" for m, l in cols) + " |")
        p("| --- | " + " | ".join("---:" for _ in cols) + " |")
        for c in calls:
            if max(per_call[k].get(c, 0) for k in cols) >= 0.01:
                p(f"| {c} | " + " | ".join(f"{per_call[k].get(c, 0):.2f}" for k in cols) + " |")
        p("")
profiles = (("gateway-as-served", "the gateway as served (metering on), chat at concurrency 32"),
            ("node-as-served", "`recovea node` as deployed (metering on: its spool, shipped to the "
             "control plane), chat at concurrency 32"),
            ("gateway-ledger-down", "the request path alone (ledger down), chat at concurrency 32"),
            ("drain-alerts-off", "serve draining a backlog into SQLite (no load, cap alerts off)"),
            ("ingest-alerts-on", "`recovea control` ingesting receipts into PostgreSQL, cap alerts on"),
            ("ingest-alerts-off", "`recovea control` ingesting receipts into PostgreSQL, cap alerts off"))
for name, title in profiles:
    parts = [(OUT / f"perf-{name}-buckets.txt", "by activity (kernel stacks are whole; user stacks end at the sampled function)"),
             (OUT / f"perf-{name}-dso.txt", "by binary"),
             (OUT / f"perf-{name}.txt", "by symbol, self time ≥ 0.5 %")]
    if not any(f.exists() and f.read_text().strip() for f, _ in parts):
        continue
    p(f"### perf record: {title}")
    p("")
    for f, what in parts:
        if f.exists() and f.read_text().strip():
            p(f"{what}:")
            p("")
            p("```")
            p(f.read_text().rstrip())
            p("```")
            p("")

# ---------------------------------------------------------------------------------------------
# Metering

main_backlog = next((r for r in rows if r["kind"] == "main_backlog"), None)
ledger = {r["phase"]: r for r in rows if r["kind"] == "ledger"}
receipts = {r["phase"]: r["samples"] for r in rows if r["kind"] == "receipts"}
if ledger or main_backlog:
    p("## Metering: receipts into the ledger")
    p("")
    p("`serve` is the control plane and a node in one process: receipts go to its spool "
      "(`DATA_DIR/spool`) and from there, in batches of 512, into its SQLite ledger. *Down* holds "
      "SQLite's write lock from another connection (`BEGIN IMMEDIATE`), so every delivery fails and "
      "receipts wait in the spool. These runs use a fresh `serve` (empty ledger).")
    p("")
if main_backlog:
    p(f"After the proxying runs above (and all their requests), the first `serve` had delivered "
      f"{main_backlog['delivered']:,} receipts to its ledger and had **{main_backlog['pending']:,} "
      f"pending** in its spool; its RSS was {main_backlog['rss_kib'] / 1024:.0f} MiB.")
    p("")
if ledger:
    p("| ledger | pending at start | RPS | p50 | p99 | receipts delivered / s during the run | most pending |")
    p("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for phase in ("up", "down", "up-again"):
        if phase not in ledger:
            continue
        w = ledger[phase]["wrk"]
        s_ = receipts.get(phase, [])
        rate = (s_[-1][2] - s_[0][2]) / ((s_[-1][0] - s_[0][0]) / 1000) if len(s_) > 1 and s_[-1][0] > s_[0][0] else float("nan")
        most = max((x[1] for x in s_), default=0)
        p(f"| {phase} | {ledger[phase].get('pending_before', 0):,} | {w['requests'] / (w['duration_us'] / 1e6):,.0f} | {fmt_us(w['p50_us'])} | {fmt_us(w['p99_us'])} | {rate:,.0f} | {most:,} |")
    p("")
    ups = [ledger[k]["wrk"]["p99_us"] for k in ("up", "up-again") if k in ledger]
    if "down" in ledger and ups:
        summary["ledger"] = ledger["down"]["wrk"]["p99_us"] / mean(ups)
        up50 = mean([ledger[k]["wrk"]["p50_us"] for k in ("up", "up-again") if k in ledger])
        p(f"p99 with the ledger down / with it up (mean of both up runs): **{summary['ledger']:.2f}x**; "
          f"p50: {ledger['down']['wrk']['p50_us'] / up50:.2f}x.")
        p("")
    for drain in (r for r in rows if r["kind"] == "drain"):
        s_ = drain["samples"]
        if len(s_) < 2:
            continue
        # From the first sample that shows delivery moving to the last one.
        start = next((i for i in range(1, len(s_)) if s_[i][2] > s_[i - 1][2]), None)
        if start is None:
            p(f"- Drain, {drain['label']}: nothing delivered in {(s_[-1][0] - s_[0][0]) / 1000:.1f} s.")
            continue
        end = next((i for i in range(start, len(s_)) if s_[i][1] == 0), len(s_) - 1)
        a_, b_ = s_[start - 1], s_[end]
        secs = (b_[0] - a_[0]) / 1000
        rate = (b_[2] - a_[2]) / secs if secs > 0 else float("nan")
        if "alerts" in drain["label"] and "after the up run" not in drain["label"]:
            summary.setdefault("drains", []).append((drain["label"], rate))
        left = "the spool emptied" if s_[end][1] == 0 else f"{s_[end][1]:,} still pending when the window closed"
        p(f"- Drain, no load, {drain['label']}: {b_[2] - a_[2]:,} receipts in {secs:.1f} s = "
          f"**{rate:,.0f} receipts/s**, into a ledger that held {drain['rows_before']:,} receipts; {left}.")
    rows_rec = next((r for r in rows if r["kind"] == "ledger_rows"), None)
    if rows_rec:
        p(f"- At the end: {rows_rec['rows']:,} receipts in the ledger, {rows_rec['delivered']:,} delivered, "
          f"{rows_rec['pending']:,} pending.")
    p("")

ingest = [r for r in rows if r["kind"] == "ingest"]
ingest_skipped = next((r for r in rows if r["kind"] == "ingest_skipped"), None)
if ingest or ingest_skipped:
    p("## Metering: receipts into PostgreSQL through the control plane")
    p("")
if ingest_skipped:
    p(f"Not measured: PostgreSQL could not be reached ({ingest_skipped['reason']}).")
    p("")
if ingest:
    r0 = ingest[0]["r"]
    p(f"`recovea control` on a PostgreSQL database made for the run; `recovea-bench ingest` posts "
      f"synthetic receipts to `POST /ingest/v1/receipts` as nodes ship their spools: batches of "
      f"{r0['batch']} from {r0['concurrency']} concurrent keep-alive senders, as fast as the control "
      f"plane answers, spread over {r0['orgs']} organizations. Each batch is one multi-row INSERT "
      f"(one transaction); with cap alerts on, each organization has an armed monthly cap with alert "
      f"thresholds (never reached), which ingest evaluates after every batch for the batch's "
      f"organizations (their caps read from the store, each window's spend from its running total "
      f"or the ledger). *Off* deletes the caps and sends as many receipts again into the same "
      f"organizations (its ledger starts larger). CPU: time used during the run by the control "
      f"plane, by PostgreSQL (the backends of the run's database, the WAL writer, checkpointer and "
      f"background writer) and by the sender, per receipt (from /proc, in 10 ms ticks).")
    p("")
    p("| cap alerts | receipts | ledger rows before | time | receipts/s | batch p50 | batch p99 | "
      "CPU per receipt: control plane | PostgreSQL | sender | other processes' CPU |")
    p("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    missing = []
    for rec in ingest:
        r = rec["r"]
        n = r["receipts"] or 1
        c = r.get("cpu_seconds", {})
        fc = foreign_cores(rec["t0"], rec["t1"])
        cpu_of = lambda name: f"{c[name] * 1e6 / n:.1f} µs" if name in c else "–"
        p(f"| {rec['alerts']} ({r['caps']} caps) | {r['receipts']:,} | {r.get('rows_before', 0):,} | "
          f"{r['seconds']:.1f} s | **{r['receipts_per_second']:,.0f}** | {r['p50_ms']:.1f} ms | "
          f"{r['p99_ms']:.1f} ms | {cpu_of('control')} | {cpu_of('postgres')} | {cpu_of('tool')} | "
          f"{'unknown' if fc is None else f'{fc:.2f} cores'} |")
        summary.setdefault("ingest", []).append((rec["alerts"], r["receipts_per_second"]))
        landed = r["rows_after"] - r["rows_before"] if "rows_after" in r else r["receipts"]
        if landed != r["receipts"] or r.get("ingested_metric_delta", r["receipts"]) != r["receipts"]:
            missing.append(f"- **Alerts {rec['alerts']}: {r['receipts']:,} receipts sent, {landed:,} new rows "
                           f"in the ledger, {r.get('ingested_metric_delta', 0):,} counted as ingested.**")
    p("")
    if missing:
        p("\n".join(missing))
        p("")
    last = ingest[-1]["r"]
    if "table_bytes_after" in last:
        p(f"At the end the receipts table held {last['rows_after']:,} rows in "
          f"{last['table_bytes_after'] / 1048576:,.0f} MiB with its indexes "
          f"({last['table_bytes_after'] / max(last['rows_after'], 1):,.0f} bytes a receipt; "
          f"{last['body_bytes_per_receipt']:.0f} bytes of JSON each on the wire).")
        p("")

# ---------------------------------------------------------------------------------------------
# Memory and scale

serve_keys = [r for r in rows if r["kind"] == "serve_keys"]
snaps = [r for r in rows if r["kind"] == "snapshot"]
if serve_keys or snaps:
    p("## Memory and snapshot scale")
    p("")
if serve_keys:
    p("A real `serve` whose SQLite store holds N keys (inserted with sqlite3 while it was stopped, in "
      "organizations of 10 keys without credentials or caps), started and loaded into its snapshot. "
      "*Publish*: one key created through the admin API, which rebuilds the whole snapshot from the "
      "store and swaps it in (mean of 3).")
    p("")
    p("| keys | RSS idle, empty store | start (load + build + publish) | RSS after start | peak (VmHWM) | publish one change | RSS after 3 publishes | peak after 3 publishes |")
    p("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in serve_keys:
        pub = r["publish"]["seconds"] / max(r["publish"]["created"], 1)
        mb = lambda k: f"{k / 1024:.0f} MiB"
        if r["keys"] == 1_000_000:
            summary["rss_1m"] = r["rss_kib"] / 1024
            summary["rss_1m_after"] = r["rss_after_publish_kib"] / 1024
            summary["publish_1m"] = pub
        p(f"| {r['keys']:,} | {mb(r['baseline_kib'])} | {r['start_ms'] / 1000:.1f} s | {mb(r['rss_kib'])} | {mb(r['hwm_kib'])} | "
          f"{pub * 1000:,.0f} ms | {mb(r['rss_after_publish_kib'])} | {mb(r['hwm_after_publish_kib'])} |")
    p("")
rebuild = {r["phase"]: r for r in rows if r["kind"] == "rebuild"}
if {"quiet", "publishing"} <= rebuild.keys():
    q, b = rebuild["quiet"]["wrk"], rebuild["publishing"]["wrk"]
    summary["rebuild_p99"] = b["p99_us"] / q["p99_us"]
    p(f"The request path while the snapshot of {rebuild['quiet']['keys']:,} keys is rebuilt: chat at "
      f"concurrency 32 for the same time, quiet, then with a key created through the admin API every "
      f"2 s ({rebuild['publishing'].get('publishes', 0)} rebuilds and swaps):")
    p("")
    p("| | RPS | p50 | p99 | max |")
    p("| --- | ---: | ---: | ---: | ---: |")
    for name, w in (("quiet", q), ("publishing", b)):
        p(f"| {name} | {w['requests'] / (w['duration_us'] / 1e6):,.0f} | {fmt_us(w['p50_us'])} | {fmt_us(w['p99_us'])} | {fmt_us(w['max_us'])} |")
    p("")
    p(f"p99 while publishing / quiet: **{b['p99_us'] / q['p99_us']:.2f}x**; max: {b['max_us'] / max(q['max_us'], 1):.2f}x.")
    p("")
if snaps:
    p("Snapshots built alone (`recovea-bench snapshot`, what the control plane does after reading "
      "the store: parse ids, add orgs and keys, build; here every organization has one provider "
      "credential and one armed cap): *snapshot* is the RSS it adds; *rebuild peak* is the most the "
      "process held on top of its input while the next snapshot was built beside the live one; "
      "*drop old* is freeing the replaced snapshot, which the gateway does in whichever thread "
      "swaps or releases it last.")
    p("")
    p("| keys | shape | snapshot | bytes/key | rebuild peak | build | swap | drop old |")
    p("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in snaps:
        s_ = r["s"]
        if s_["keys"] == 1_000_000 and r["shape"] == "10 keys per org":
            summary["build_1m"] = s_
        p(f"| {s_['keys']:,} | {r['shape']} ({s_['orgs']:,} orgs) | {s_['snapshot_mib']:.1f} MiB | {s_['bytes_per_key']:.0f} | "
          f"{s_['peak_during_rebuild_mib']:.0f} MiB | {s_['build_ms']:.0f} ms | {s_['swap_us']:.1f} µs | {s_['drop_old_ms']:.0f} ms |")
    p("")

divan = OUT / "divan.txt"
if divan.exists():
    text = divan.read_text()
    table = [l for l in text.splitlines() if re.match(r"^(admission|[├╰│]|Timer|admission benchmarks)", l)]
    p("## Admission micro-benchmark (divan, crates/core/benches/admission.rs)")
    p("")
    p("```")
    p("\n".join(table) if table else text.strip()[-3000:])
    p("```")
    p("")
    for l in table:
        m = re.match(r"^[├╰]─ (\S+)\s+\S+ \S+\s+│\s+\S+ \S+\s+│\s+([\d.]+) (ns|µs|ms|s)", l)
        if m:
            factor = {"ns": 1e-3, "µs": 1, "ms": 1e3, "s": 1e6}[m.group(3)]
            summary.setdefault("divan", {})[m.group(1)] = float(m.group(2)) * factor

# ---------------------------------------------------------------------------------------------
# Targets

p("## Targets (issue #6, restated)")
p("")
p("| target | measured | met |")
p("| --- | --- | --- |")


def row(name, value, ok):
    p(f"| {name} | {value} | {'yes' if ok else '**no**'} |")


def reported(name, value):
    p(f"| {name} | {value} | reported, not targeted |")


for mode in modes:
    for label in ("node", "gateway"):
        v = summary.get("cpu", {}).get((mode, label))
        if v is None:
            continue
        if label == "node":
            row(f"CPU a request in `recovea node` ≤ 1.6x an nginx hop's ({mode}, metering on, concurrency 32)",
                f"{v:.2f}x", v <= 1.6)
            pinned = summary.get("cpu_pinned", {}).get((mode, label))
            if pinned is not None:
                reported(f"the same, each proxy on a core of its own ({mode})", f"{pinned:.2f}x")
        else:
            reported(f"CPU a request in `recovea serve` / an nginx hop's ({mode}, concurrency 32)", f"{v:.2f}x")
for mode in modes:
    for conc in concs:
        for hop in hops:
            if conc == 1 or (mode, conc, hop) not in summary:
                continue
            v = mean(summary[(mode, conc, hop)]["rps"])
            reported(f"{mode} RPS {hop} / nginx, concurrency {conc}", f"{v:.2f}x")
for mode in modes:
    for conc in concs:
        for hop in hops:
            if (mode, conc, hop) not in summary:
                continue
            vals = [x for x in summary[(mode, conc, hop)]["added_p50"] if x == x]
            if vals:
                reported(f"{mode} added p50 {hop} / nginx's, concurrency {conc}", f"{mean(vals):.2f}x")
for mode in modes:
    for conc in concs:
        for hop in hops:
            if conc != 1 and (mode, conc, hop) in summary:
                v = mean(summary[(mode, conc, hop)]["direct_over_hop"])
                row(f"mock never the bottleneck ({mode}, concurrency {conc}): direct RPS / {hop} RPS",
                    f"{v:.2f}x", v > 1.5)
if "ledger" in summary:
    row("p99 with the ledger down ≤ 1.05x with it up", f"{summary['ledger']:.2f}x", summary["ledger"] <= 1.05)
dv = summary.get("divan", {})
for name in ("admit_known_key", "admit_and_check_caps"):
    if name in dv:
        row(f"admission < 1 µs at {'1M' if machine.get('mode') == 'full' else 'smoke-size'} keys ({name}, median)", f"{dv[name]:.2f} µs", dv[name] < 1)
if "rss_1m" in summary:
    row("RSS < 300 MB at 1M keys (serve, after start)", f"{summary['rss_1m'] * 1.048576:.0f} MB", summary["rss_1m"] * 1.048576 < 300)
    row("RSS < 300 MB at 1M keys (serve, after 3 publishes)", f"{summary['rss_1m_after'] * 1.048576:.0f} MB", summary["rss_1m_after"] * 1.048576 < 300)
for label, rate in summary.get("drains", []):
    row(f"≥ 20k receipts/s into the ledger (serve's SQLite, {label})", f"{rate:,.0f}/s", rate >= 20000)
for label, rate in summary.get("ingest", []):
    row(f"≥ 20k receipts/s into PostgreSQL through the control plane (cap alerts {label})", f"{rate:,.0f}/s",
        rate >= 20000)
p("")
print("\n".join(out))
