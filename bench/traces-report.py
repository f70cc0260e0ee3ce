"""The table of BENCH_ONLY=traces: the request path with traces off against the build before them,
and on against off, from the `traces` records of bench/out/results.jsonl."""

import json
import statistics
import sys

TARGETS = ("base", "off", "on")

rows = [json.loads(line) for line in open(sys.argv[1])]
rev = next((r["rev"] for r in rows if r["kind"] == "traces_base"), "?")
dropped = next((r["spans"] for r in rows if r["kind"] == "traces_dropped"), "?")
runs = {}
for r in rows:
    if r["kind"] == "traces":
        w = r["wrk"]
        runs.setdefault((r["mode"], r["conc"], r["target"]), []).append(
            (w["requests"] / (w["duration_us"] / 1e6), w["p50_us"], w["p99_us"])
        )


def med(key, i):
    return statistics.median(v[i] for v in runs[key])


print(
    f"# Traces on the request path\n\nbase = the build before traces ({rev}); off = this build "
    "without --otlp-endpoint; on = this build exporting every request's spans to a local collector "
    "(nginx answering 200). Medians of the rounds; a ratio below 1 is fewer requests/s.\n"
)
print("| mode | conc | base req/s | off req/s | on req/s | off/base | on/off | p50 µs base/off/on | p99 µs base/off/on |")
print("|---|---|---|---|---|---|---|---|---|")
for mode in ("chat", "stream"):
    for conc in (1, 32):
        keys = {t: (mode, conc, t) for t in TARGETS}
        if not all(k in runs for k in keys.values()):
            continue
        rps = {t: med(keys[t], 0) for t in TARGETS}
        p50 = "/".join(f"{med(keys[t], 1):.0f}" for t in TARGETS)
        p99 = "/".join(f"{med(keys[t], 2):.0f}" for t in TARGETS)
        print(
            f"| {mode} | {conc} | {rps['base']:.0f} | {rps['off']:.0f} | {rps['on']:.0f} | "
            f"{rps['off'] / rps['base']:.3f} | {rps['on'] / rps['off']:.3f} | {p50} | {p99} |"
        )
print(f"\nSpans dropped by the traced serve (queue full): {dropped}.")
