#!/usr/bin/env bash
# A primary killed under traffic, measured: runs crates/counters/tests/redis_failover.rs RUNS times
# (default 5; each starts its own Redis Cluster and its own primary, replica and three sentinels on
# loopback ports) and prints, per topology, how long after the kill the syncs failed and when the
# counters were exact again. Needs redis-server and redis-cli.
#
# Usage: bench/failover.sh [RUNS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-5}
cargo test -q -p recovea-counters --test redis_failover --no-run
lines=$(for _ in $(seq "$runs"); do
  cargo test -q -p recovea-counters --test redis_failover -- --nocapture --test-threads 1 2>/dev/null | grep -o 'failover:.*'
done)
echo "$lines"
echo
python3 - "$lines" <<'PY'
import re, statistics, sys
seconds = lambda text: float(text[:-2]) / 1000 if text.endswith("ms") else float(text[:-1])
by = {}
for line in sys.argv[1].splitlines():
    m = re.match(r"failover: (\w+), syncs failed from Some\(([\d.]+m?s)\) to Some\(([\d.]+m?s)\).*exact ([\d.]+m?s)", line)
    if m:
        by.setdefault(m.group(1), []).append((seconds(m.group(3)), seconds(m.group(4))))
print("topology   runs  syncs failing until (median / max)  counters exact after (median / max)")
for topology, runs in sorted(by.items()):
    failing, exact = [r[0] for r in runs], [r[1] for r in runs]
    print(f"{topology:9} {len(runs):5}  {statistics.median(failing):8.2f} s / {max(failing):5.2f} s"
          f"            {statistics.median(exact):8.2f} s / {max(exact):5.2f} s")
PY
