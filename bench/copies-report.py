#!/usr/bin/env python3
"""bench/copies-report.py BINARY COUNTS MAPS REQUESTS: what bench/copies.c counted in one process
(COUNTS, with MAPS a copy of its /proc/PID/maps), as bytes and calls of memcpy and memmove a request
by the function that made them, most bytes first. Symbols come from `nm` of BINARY; a copy made in
a shared library is named by the library."""
import bisect
import collections
import os
import subprocess
import sys

binary, counts, maps, requests = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
real = os.path.realpath(binary)
load_base, regions = None, []
for line in open(maps):
    fields = line.split()
    if len(fields) < 6:
        continue
    start, end = (int(x, 16) for x in fields[0].split("-"))
    regions.append((start, end, fields[5]))
    if os.path.realpath(fields[5]) == real and int(fields[2], 16) == 0 and load_base is None:
        load_base = start
if load_base is None:
    sys.exit(f"{binary} is not mapped in {maps}")
symbols = []
for line in subprocess.run(["nm", "-C", "--defined-only", binary], capture_output=True, text=True).stdout.splitlines():
    parts = line.split(" ", 2)
    if len(parts) == 3 and parts[1] in "tTwW":
        symbols.append((int(parts[0], 16), parts[2]))
symbols.sort()
starts = [address for address, _ in symbols]

by_function = collections.defaultdict(lambda: [0, 0])
for line in open(counts):
    site, copied, calls = (int(x, 16) if i == 0 else int(x) for i, x in enumerate(line.split()))
    path = next((p for start, end, p in regions if start <= site < end), "?")
    if os.path.realpath(path) == real:
        index = bisect.bisect_right(starts, site - load_base) - 1
        name = symbols[index][1] if index >= 0 else "?"
    else:
        name = os.path.basename(path)
    by_function[name][0] += copied
    by_function[name][1] += calls

total_bytes = sum(v[0] for v in by_function.values())
total_calls = sum(v[1] for v in by_function.values())
print(f"{total_bytes / requests:.0f} bytes copied a request in {total_calls / requests:.1f} calls "
      f"(memcpy and memmove, {requests} requests)")
print("bytes/request  calls/request  bytes/call  function")
for name, (copied, calls) in sorted(by_function.items(), key=lambda kv: -kv[1][0])[:30]:
    print(f"{copied / requests:13.0f} {calls / requests:14.2f} {copied / max(calls, 1):11.0f}  {name[:110]}")
