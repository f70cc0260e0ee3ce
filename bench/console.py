#!/usr/bin/env python3
"""How fast the console's pages answer with a large ledger (issue 17: within 200 ms at 1M receipts).

Starts `recovea control` on a PostgreSQL database made for the run (dropped at the end), creates an
organization with two keys and three caps through the admin API, ingests RECEIPTS synthetic receipts
(default 1,000,000, over the last 30 days, four models, one in twenty estimated) through the node
endpoint `/ingest/v1/receipts`, signs in to the console, then loads each page ROUNDS times one after
another and prints the median, 95th percentile and worst time of each, against the 200 ms target.

    cargo build --release --bin recovea
    .venv/bin/python bench/console.py [--receipts N] [--rounds N] [--bin PATH] [--pg URL]

Not a test: nothing here fails on a slow figure. Times are wall-clock at the client over loopback,
one request at a time, after one warm-up load of each page.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
ADMIN_TOKEN = "console-bench-admin-token-0123456789"
NODE_TOKEN = "console-bench-node-token-0123456789"
TARGET_MS = 200.0
MODELS = [("gpt-4o-mini", 150, 600), ("gpt-4o", 2500, 10000), ("claude-sonnet-4-6", 3000, 15000),
          ("claude-haiku-4-5", 1000, 5000)]  # (model, input, output): nano-dollars a token ($ per MTok x 1000)
BATCH = 20_000


def say(text: str) -> None:
    print(f"[{datetime.now(timezone.utc):%H:%M:%S}] {text}", flush=True)


def rfc3339(ms: int) -> str:
    at = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def usd(nanos: int) -> str:
    whole, frac = divmod(nanos, 1_000_000_000)
    text = f"{whole}.{frac:09d}".rstrip("0")
    head, _, tail = text.partition(".")
    return f"{head}.{tail.ljust(2, '0')}"


def receipts(org: str, keys: list[str], count: int, start: int):
    """`count` receipts spread evenly over the 30 days before now, in batches."""
    now_ms = int(time.time() * 1000)
    span = 30 * 86_400_000
    rng = random.Random(17)
    batch = []
    for i in range(count):
        started = now_ms - span + (span * i) // max(count, 1)
        model, price_in, price_out = MODELS[i % len(MODELS)]
        tin, tout = rng.randint(10, 2000), rng.randint(5, 800)
        cost = (tin * price_in + tout * price_out)  # nano-dollars: prices above are nano-dollars a token
        rid = f"{start + i:012d}{secrets.token_hex(4)}"
        batch.append({
            "id": f"rcpt_{rid}", "request_id": f"req_{rid}", "org_id": org, "key_id": keys[i % len(keys)],
            "provider": "anthropic" if model.startswith("claude") else "openai", "model": model,
            "endpoint": "/v1/messages" if model.startswith("claude") else "/v1/chat/completions",
            "status": 200, "stream": i % 3 == 0, "input_tokens": tin, "output_tokens": tout,
            "cached_input_tokens": 0, "cache_write_input_tokens": 0, "reasoning_tokens": 0,
            "cost_usd": usd(cost), "usage_source": "estimated" if i % 20 == 0 else "provider",
            "priced": True, "price_revision": 0, "priced_as": model,
            "started_at": rfc3339(started), "finished_at": rfc3339(started + 350), "node_id": "node_bench",
        })
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--receipts", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bin", default=os.environ.get("RECOVEA_BIN", str(REPO / "target/release/recovea")))
    ap.add_argument("--pg", default=os.environ.get("PG_SERVER", "postgres://postgres@127.0.0.1:5432"))
    args = ap.parse_args()

    db = f"recovea_console_bench_{int(time.time())}_{os.getpid()}"
    subprocess.run(["psql", f"{args.pg}/postgres", "-qc", f"CREATE DATABASE {db}"], check=True)
    workdir = Path(tempfile.mkdtemp(prefix="console-bench-"))
    log = open(workdir / "control.log", "w+b")
    proc = subprocess.Popen(
        [args.bin, "control", "--database-url", f"{args.pg}/{db}", "--master-key", secrets.token_hex(32),
         "--node-token", NODE_TOKEN, "--admin-token", ADMIN_TOKEN, "--admin-listen", "127.0.0.1:0",
         "--data-dir", str(workdir / "data")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        base = None
        deadline = time.monotonic() + 60
        while base is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                print(log.read().decode(errors="replace"), file=sys.stderr)
                return 1
            log.seek(0)
            if m := re.search(rb"recovea admin:\s+(http://\S+)/admin/v1", log.read()):
                base = m.group(1).decode()
            time.sleep(0.1)
        say(f"recovea control ({args.bin}) on {args.pg}/{db} at {base}")
        api = httpx.Client(base_url=f"{base}/admin/v1", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                           timeout=120)
        org = api.post("/orgs", json={"name": "Bench Org"}).json()["id"]
        keys = [api.post(f"/orgs/{org}/keys", json={"name": f"key {i}"}).json()["id"] for i in range(2)]
        for window, limit, hard in (("month", "100000.00", True), ("day", "5000.00", False), ("week", "20000", True)):
            r = api.post(f"/orgs/{org}/caps", json={"scope": "organization", "window": window,
                                                    "limit_usd": limit, "hard_stop": hard})
            assert r.status_code == 201, r.text
        ingest = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {NODE_TOKEN}"}, timeout=600)
        t0, sent = time.monotonic(), 0
        for batch in receipts(org, keys, args.receipts, 0):
            r = ingest.post("/ingest/v1/receipts", content=json.dumps({"receipts": batch}),
                            headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
            sent += len(batch)
            if sent % 200_000 == 0 or sent == args.receipts:
                say(f"ingested {sent:,} receipts ({sent / (time.monotonic() - t0):,.0f}/s)")
        subprocess.run(["psql", f"{args.pg}/{db}", "-qc", "VACUUM ANALYZE receipts"], check=True)

        console = httpx.Client(base_url=base, timeout=120)
        r = console.post("/sign-in", data={"token": ADMIN_TOKEN})
        assert r.status_code == 303, r.status_code
        first = console.get(f"/orgs/{org}/receipts").text
        cursor = re.search(r'id="next-page" href="([^"]+)"', first)
        detail = re.search(r'href="(/orgs/[^"]+/receipts/rcpt_[^"]+)"', first)
        pages = [
            ("organizations /", "/"),
            ("organization /orgs/{org}", f"/orgs/{org}"),
            ("receipts, first page", f"/orgs/{org}/receipts"),
            ("receipts, a later page", cursor.group(1).replace("&amp;", "&") if cursor else f"/orgs/{org}/receipts"),
            ("receipts of one key, last day", f"/orgs/{org}/receipts?key_id={keys[0]}&from="
             + (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")),
            ("one receipt", detail.group(1).replace("&amp;", "&") if detail else "/"),
            ("nodes", "/nodes"),
            ("prices", "/prices"),
        ]
        say(f"{args.receipts:,} receipts in the ledger; {args.rounds} loads of each page, one at a time")
        print(f"\n| page | median ms | p95 ms | worst ms | within {TARGET_MS:.0f} ms (p95) |")
        print("| --- | ---: | ---: | ---: | --- |")
        for name, path in pages:
            r = console.get(path)
            assert r.status_code == 200, (path, r.status_code, r.text[:200])
            times = []
            for _ in range(args.rounds):
                t = time.perf_counter()
                r = console.get(path)
                times.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200
            times.sort()
            p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
            print(f"| {name} | {statistics.median(times):.1f} | {p95:.1f} | {times[-1]:.1f} | "
                  f"{'yes' if p95 <= TARGET_MS else 'NO'} |")
        return 0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        subprocess.run(["psql", f"{args.pg}/postgres", "-qc", f"DROP DATABASE IF EXISTS {db}"], check=False)


if __name__ == "__main__":
    sys.exit(main())
