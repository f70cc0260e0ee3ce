#!/usr/bin/env python3
"""Overshoot of an armed cap with two nodes racing at it.

One `recovea control` (on SQLite) feeds two `recovea node` processes that share one Redis
(`--redis-url`): two gateway nodes behind a load balancer, each with its own spool and counters. Many clients on each node send requests of a known cost
until the cap refuses them; the ledger then says how far past the limit the spend went.

Usage: bench/overshoot.py [--clients-per-node 32] [--limit 0.05] [--seconds 20] [--latency-ms 0] [--runs 1]
Needs the venv of scripts/test-sdk (httpx) and target/{release,debug}/recovea[-mock-provider]
(RECOVEA_PROFILE=debug picks the debug build even where a release build exists; RECOVEA_BIN_DIR
names a directory holding other builds of both).
"""

import argparse
import concurrent.futures
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "overshoot-admin-token"
# 1000 input and 1000 output tokens of gpt-4o-mini: $0.00015 + $0.0006.
USAGE = {"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000}
COST = Decimal("0.00075")
# About 1000 tokens of text, so that the reservation's input estimate is close to the real input.
PROMPT = "word " * 800


def binary(name: str) -> str:
    if "RECOVEA_BIN_DIR" in os.environ:  # another build, e.g. the commit before a change
        return str(Path(os.environ["RECOVEA_BIN_DIR"]) / name)
    profiles = [os.environ["RECOVEA_PROFILE"]] if "RECOVEA_PROFILE" in os.environ else ["release", "debug"]
    for profile in profiles:
        path = ROOT / "target" / profile / name
        if path.exists():
            return str(path)
    sys.exit(f"build first: cargo build --release --bins ({name} not found)")


def read_banner(proc: subprocess.Popen, pattern: str, last: str | None = None) -> dict[str, str]:
    found: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if not line:
            sys.exit("a process exited before it was ready")
        for key, regex in (("url", pattern), ("admin", r"recovea admin:\s+(http://\S+)/admin/v1")):
            if m := re.match(regex, line.strip()):
                found[key] = m.group(1)
        if last is None or line.startswith(last):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return found
    sys.exit("no banner within 30 s")


def race(admin: httpx.Client, nodes: list[dict[str, str]], limit: Decimal, opts: argparse.Namespace) -> Decimal:
    """One race: a new organization with an armed cap, both nodes' clients at it until refused;
    returns how far past the limit the ledger's spend went, in requests."""
    org = admin.post("/orgs", json={"name": "overshoot"}).json()["id"]
    admin.put(f"/orgs/{org}/providers/openai", json={"kind": "openai", "api_key": "sk-bench-0123456789"})
    secret = admin.post(f"/orgs/{org}/keys", json={"name": "k"}).json()["secret"]
    admin.post(f"/orgs/{org}/caps", json={"scope": "organization", "window": "month",
                                          "limit_usd": str(limit), "hard_stop": True, "alert_at": []})
    body = {"model": "gpt-4o-mini", "max_tokens": 1000, "messages": [{"role": "user", "content": PROMPT}]}
    headers = {"Authorization": f"Bearer {secret}"}
    for node in nodes:  # both nodes serve the key and the cap (the other learns of them by polling)
        deadline = time.monotonic() + 10
        while httpx.post(f"{node['url']}/v1/chat/completions", json=body, headers=headers).status_code != 200:
            assert time.monotonic() < deadline, "a node never admitted the key"
            time.sleep(0.05)

    admitted = {n["url"]: 0 for n in nodes}
    lock = threading.Lock()
    stop_at = time.monotonic() + opts.seconds

    def client(url: str) -> None:
        refused_in_a_row = 0
        with httpx.Client(timeout=30) as http:
            while time.monotonic() < stop_at and refused_in_a_row < 20:
                status = http.post(f"{url}/v1/chat/completions", json=body, headers=headers).status_code
                if status == 200:
                    refused_in_a_row = 0
                    with lock:
                        admitted[url] += 1
                elif status == 402:
                    refused_in_a_row += 1
                else:
                    sys.exit(f"unexpected {status}")

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(opts.clients_per_node * 2) as pool:
        for node in nodes:
            for _ in range(opts.clients_per_node):
                pool.submit(client, node["url"])
    elapsed = time.monotonic() - started

    # Every receipt in the ledger: both spools empty.
    deadline = time.monotonic() + 30
    for node in nodes:
        while True:
            metrics = httpx.get(f"{node['url']}/metrics").text
            pending = re.search(r"^recovea_receipts_pending (\d+)", metrics, re.M)
            if pending and pending.group(1) == "0":
                break
            assert time.monotonic() < deadline, "receipts still pending"
            time.sleep(0.1)
    spend = Decimal(admin.get(f"/orgs/{org}/spend").json()["spend"][0]["spend_usd"])
    over = spend - limit
    print(f"limit ${limit}, {opts.clients_per_node} clients on each of 2 nodes, provider latency "
          f"{opts.latency_ms} ms, {elapsed:.1f} s")
    print(f"admitted while racing: {admitted[nodes[0]['url']]} on node a, {admitted[nodes[1]['url']]} on node b "
          f"(+1 warm-up request each); each request ${COST}")
    print(f"ledger spend ${spend}: overshoot ${over} = {over / COST:.1f} requests "
          f"({over / COST / 2:.1f} per node; target at most 1 per node)", flush=True)
    return over / COST


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--clients-per-node", type=int, default=32)
    args.add_argument("--limit", default="0.05")
    args.add_argument("--seconds", type=float, default=20)
    args.add_argument("--latency-ms", type=int, default=0, help="the provider's time to answer each request")
    args.add_argument("--runs", type=int, default=1, help="races, each at a new organization's cap, on the same processes")
    opts = args.parse_args()
    limit = Decimal(opts.limit)

    work = Path(tempfile.mkdtemp(prefix="recovea-overshoot-"))
    procs: list[subprocess.Popen] = []
    try:
        mock = subprocess.Popen([binary("recovea-mock-provider"), "--listen", "127.0.0.1:0", "--max-recorded", "0"],
                                stdout=subprocess.PIPE)
        procs.append(mock)
        mock_url = read_banner(mock, r"listening on (http://\S+)")["url"]
        behaviour = {"usage": USAGE, "times": 4_000_000}
        if opts.latency_ms:
            behaviour["delay_ms"] = opts.latency_ms
        httpx.post(f"{mock_url}/__mock/script", json=behaviour).raise_for_status()

        master_key, node_token = secrets.token_hex(32), secrets.token_hex(16)
        control_proc = subprocess.Popen(
            [binary("recovea"), "control", "--admin-listen", "127.0.0.1:0", "--data-dir", str(work / "control"),
             "--database-url", f"sqlite://{work / 'control.db'}", "--master-key", master_key,
             "--admin-token", TOKEN, "--node-token", node_token, "--log", "warn"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        procs.append(control_proc)
        control = read_banner(control_proc, r"recovea admin:\s+(http://\S+)/admin/v1", last="recovea admin:")
        control_url = control["admin"]
        nodes = []
        for name in ("a", "b"):
            proc = subprocess.Popen(
                [binary("recovea"), "node", "--listen", "127.0.0.1:0", "--data-dir", str(work / name),
                 "--control-url", control_url, "--node-token", node_token, "--master-key", master_key,
                 "--redis-url", "redis://127.0.0.1:6379/", "--openai-base-url", mock_url,
                 "--anthropic-base-url", mock_url, "--log", "warn"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            procs.append(proc)
            nodes.append(read_banner(proc, r"recovea node \S+:\s+(http://\S+)"))

        admin = httpx.Client(base_url=f"{control_url}/admin/v1", headers={"Authorization": f"Bearer {TOKEN}"})
        overs = [race(admin, nodes, limit, opts) for _ in range(opts.runs)]
        if opts.runs > 1:
            overs.sort()
            median = overs[len(overs) // 2] if len(overs) % 2 else (overs[len(overs) // 2 - 1] + overs[len(overs) // 2]) / 2
            within = sum(1 for o in overs if o <= 2)
            print(f"{opts.runs} runs: overshoot {overs[0]:.1f} to {overs[-1]:.1f} requests (median {median:.1f}); "
                  f"{within} of {opts.runs} within the target (at most 1 per node)")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
