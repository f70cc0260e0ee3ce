#!/usr/bin/env python3
"""Overshoot of an armed cap with several nodes racing at its line, phantom refusals, and what a
request near the line pays for the counter store's answer.

One `recovea control` (on SQLite) feeds N `recovea node` processes that share the Redis at
127.0.0.1:6379 (`--redis-url`; the node has no key prefix flag, and every race uses a cap of its
own, so races and other users of that Redis do not meet): N gateway nodes behind a load
balancer, each with its own spool and counters. Each race, on the same processes, at a new
organization's armed cap:

1. far: every client sends a few requests to one organization whose armed cap is far from its
   line (a million dollars): the latency of armed requests the line does not concern;
2. line: every client on every node sends requests at the race's cap (a few dozen requests'
   cost) until it has been refused several times in a row; the ledger, once every admitted
   request's receipt is in it, says how far past the limit the spend went (exact decimals);
3. again: the cap's limit is raised to the ledger's spend plus one request's cost per node, and
   each node must admit a request again (polling, with a deadline): a node that keeps refusing
   once every reservation has settled below the line refuses phantoms.

Every request costs exactly its reservation: its body's input estimate (crates/providers
`usage::estimate_input_tokens`: ceil(characters / 4) + 3, counting the message's keys and
strings) is exactly the input tokens the mock reports, and its `max_tokens` exactly the output
tokens; the model's price is set by the bench (`PUT /admin/v1/prices/overshoot-model`). So the
bound is exact: spend <= limit + one request's cost (`--limit-requests` a whole number: a node
deciding on the exact spend and reservations of all nodes admits no request past the limit).

With `--uncapped`, every request sets no output limit and the mock reports 20 x 1,024 output
tokens (20 times the 1,024 a request without a limit is reserved far from any armed cap); the
model's most output is set to 32,768 tokens, which is what a request under an armed cap reserves.
The bound is then spend <= limit + one request's reservation, and a race's limit is
`--limit-requests` requests' real cost. A client refused while the requests admitted and answered
so far leave room for one more at its real cost waits 2 ms and goes on (the reservations of those in
flight are what stands in its way); it stops after `--refusals` refusals in a row once they do not. *Phantom refusals* are counted as each comes: a
refusal is one when the request's real cost would have fit even had every request then in flight
been admitted and cost its real cost (admitted so far + in flight + this one, at the real cost,
<= limit): room left for its actual cost, not for its reservation.

With `--fault`, the shared store misbehaves while the nodes race (a `recovea-fault-proxy` between
the nodes and Redis): `slow:MS` adds MS to every node's round trip to Redis for the whole run;
`cut:SECONDS` cuts the first node off from Redis (packets dropped) for SECONDS from the start of
each race's line; `clock:SECONDS` starts the first node with its clock SECONDS ahead (libfaketime);
`wipe:PERCENT` runs a Redis of the bench's own and flushes it (FLUSHALL) in each race once the
requests admitted reach PERCENT of the limit, receipts still on their way to the ledger;
`kill:PERCENT` (with `--redis-cluster`) kills, in the first race, the cluster's primary that holds
the race's organization once the requests admitted reach PERCENT of the limit (its replica takes
over in about two seconds; the other races run on the cluster left).

With `--redis-cluster`, the nodes share a Redis Cluster of the bench's own (three primaries, each
with a replica, on loopback ports; `redis+cluster://` with every server as a seed) instead of the
local Redis.
A `503 budget_unverifiable` (a request the node could not confirm) is counted and retried 100 ms
later; the bound is the same.

Usage: bench/overshoot.py [--nodes 2] [--clients-per-node 32] [--races 100] [--limit-requests 40]
                          [--latency-ms 0] [--far-requests 3] [--refusals 5] [--seconds 15] [--uncapped]
                          [--redis-cluster] [--fault slow:MS|cut:SECONDS|clock:SECONDS|wipe:PERCENT|kill:PERCENT]
Exit status 1 when a race broke the bound, ended with room left for a whole request after
refusing (a phantom refusal; with `--uncapped` they are counted and reported instead), or a node
did not admit again once the limit was raised.
Needs the venv of scripts/test-sdk (httpx) and target/{release,debug}/recovea[-mock-provider]
(RECOVEA_PROFILE=debug picks the debug build even where a release build exists; RECOVEA_BIN_DIR
names a directory holding other builds of both).
"""

import argparse
import asyncio
import json
import math
import os
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "overshoot-admin-token-0123456789abcdef0123456789"
MODEL = "overshoot-model"
# gpt-4o-mini's list prices, set on a model of the bench's own so that the built-in table's
# changes do not move the figures.
INPUT_PER_MTOK, OUTPUT_PER_MTOK = Decimal("0.15"), Decimal("0.60")
INPUT_TOKENS, OUTPUT_TOKENS = 1000, 1000
MILLION = Decimal(1_000_000)
COST = (INPUT_TOKENS * INPUT_PER_MTOK + OUTPUT_TOKENS * OUTPUT_PER_MTOK) / MILLION  # $0.00075


def prompt_for(tokens: int) -> str:
    """Text whose chat message the gateway estimates at exactly `tokens` input tokens:
    ceil(("role" + "user" + "content" + text) characters / 4) + 3."""
    chars = (tokens - 3) * 4 - len("role" + "user" + "content")
    text = ("word " * (chars // 5 + 1))[:chars]
    assert math.ceil((15 + len(text)) / 4) + 3 == tokens
    return text


BODY = json.dumps({"model": MODEL, "max_tokens": OUTPUT_TOKENS,
                   "messages": [{"role": "user", "content": prompt_for(INPUT_TOKENS)}]}).encode()
USAGE = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
         "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}
# What one request reserves under the armed cap: its cost, unless --uncapped.
RESERVED = COST
# --uncapped: the model's most output (what an uncapped request reserves under an armed cap), and
# what the mock writes (20 x the 1,024 reserved far from any armed cap).
MAX_OUTPUT_TOKENS, UNCAPPED_OUTPUT_TOKENS = 32_768, 20 * 1024


def uncapped() -> None:
    """Every request without an output limit, writing 20 x 1,024 tokens: rebinds the request,
    the mock's usage, the real cost and the reservation."""
    global BODY, USAGE, COST, RESERVED
    BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt_for(INPUT_TOKENS)}]}).encode()
    USAGE = {"prompt_tokens": INPUT_TOKENS, "completion_tokens": UNCAPPED_OUTPUT_TOKENS,
             "total_tokens": INPUT_TOKENS + UNCAPPED_OUTPUT_TOKENS}
    COST = (INPUT_TOKENS * INPUT_PER_MTOK + UNCAPPED_OUTPUT_TOKENS * OUTPUT_PER_MTOK) / MILLION
    RESERVED = (INPUT_TOKENS * INPUT_PER_MTOK + MAX_OUTPUT_TOKENS * OUTPUT_PER_MTOK) / MILLION


def binary(name: str) -> str:
    if "RECOVEA_BIN_DIR" in os.environ:  # another build, e.g. the commit before a change
        return str(Path(os.environ["RECOVEA_BIN_DIR"]) / name)
    profiles = [os.environ["RECOVEA_PROFILE"]] if "RECOVEA_PROFILE" in os.environ else ["release", "debug"]
    for profile in profiles:
        path = ROOT / "target" / profile / name
        if path.exists():
            return str(path)
    sys.exit(f"build first: cargo build --release -p recovea -p recovea-testkit --bins ({name} not found)")


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


class Connection:
    """One keep-alive HTTP/1.1 connection to a node, sending the bench's one request. Plain
    asyncio streams rather than httpx: the client's own cost per request is a small part of it,
    so that 32 clients per node put 32 requests in flight on a 2-core machine."""

    def __init__(self, url: str, secret: str):
        self.host, self.port = url.removeprefix("http://").rsplit(":", 1)
        self.request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {self.host}\r\n"
                        f"authorization: Bearer {secret}\r\ncontent-type: application/json\r\n"
                        f"content-length: {len(BODY)}\r\n\r\n").encode() + BODY
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, int(self.port))

    async def send(self) -> int:
        """Sends the request and reads its answer to the end; the status."""
        for attempt in range(2):
            await self.open()
            try:
                self.writer.write(self.request)
                return await self.read_answer()
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def read_answer(self) -> int:
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ")[1])
        headers = dict((k.strip().lower(), v.strip()) for k, v in (h.split(":", 1) for h in head[1:] if h))
        if "content-length" in headers:
            await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
                await self.reader.readexactly(size + 2)
            await self.reader.readuntil(b"\r\n")
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Latencies:
    """Client-side seconds of each request, by class."""
    far: list[float] = field(default_factory=list)
    approach: list[float] = field(default_factory=list)
    near_admitted: list[float] = field(default_factory=list)
    near_refused: list[float] = field(default_factory=list)


@dataclass
class Race:
    number: int
    limit: Decimal
    spend: Decimal
    admitted: list[int]
    refused: int
    other: dict[int, int]
    seconds: float
    readmitted_in: list[float | None]
    again_refusals: dict[int, int]
    phantom: int = 0

    @property
    def room_left_requests(self) -> Decimal:
        """The limit less the spend, in requests' real cost (negative: over)."""
        return (self.limit - self.spend) / COST

    @property
    def over(self) -> Decimal:
        return self.spend - self.limit

    @property
    def within(self) -> bool:
        return self.spend <= self.limit + RESERVED

    @property
    def room_left(self) -> bool:
        """Refused with room for a whole request left, though no request failed: a phantom refusal
        (with --uncapped, where phantom refusals are expected, counted in `phantom` instead)."""
        return self.spend + COST <= self.limit and not self.other and RESERVED == COST

    @property
    def readmitted(self) -> bool:
        """Every node admitted again within 5 s of the raise (the feed brings it within milliseconds)."""
        return all(t is not None and t <= 5 for t in self.readmitted_in)


class FaultProxy:
    """A `recovea-fault-proxy` in front of Redis, told its fault a line at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([binary("recovea-fault-proxy"), "--upstream", "127.0.0.1:6379"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout
        # Its own banner: its output goes on answering each fault, so no reader drains it.
        banner = self.proc.stdout.readline().strip()
        if not banner.startswith("listening on "):
            sys.exit(f"recovea-fault-proxy: {banner!r}")
        self.addr = banner.removeprefix("listening on ")

    def set(self, fault: str) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(fault + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer == "ok", f"fault proxy: {fault!r}: {answer}"


def parse_fault(text: str | None) -> tuple[str, int] | None:
    if text is None:
        return None
    kind, _, amount = text.partition(":")
    if kind not in ("slow", "cut", "clock", "wipe", "kill") or not amount.isdigit():
        sys.exit(f"--fault: slow:MS, cut:SECONDS, clock:SECONDS, wipe:PERCENT or kill:PERCENT, not {text!r}")
    return kind, int(amount)


class OwnRedis:
    """A `redis-server` of the bench's own, keeping nothing on disk: `--fault wipe` flushes it."""

    def __init__(self, work: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(work)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(f"redis-server did not come up on {self.port}")
                time.sleep(0.02)

    def flushall(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as conn:
            conn.sendall(b"*1\r\n$8\r\nFLUSHALL\r\n")
            assert conn.recv(16).startswith(b"+OK"), "FLUSHALL"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def free_cluster_port() -> int:
    """A free port for a cluster's server, whose bus listens 10,000 higher: at most 55,535, both free."""
    while True:
        port = free_port()
        if port <= 55_535:
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", port + 10_000))
                    return port
                except OSError:
                    pass


def redis_cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *args], check=True, capture_output=True, text=True).stdout


class RedisCluster:
    """A Redis Cluster of the bench's own: three primaries, each with a replica, keeping nothing on disk."""

    def __init__(self, work: Path) -> None:
        self.ports = [free_cluster_port() for _ in range(6)]
        self.procs = {port: subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(work), "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
             "--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for port in self.ports}
        for port in self.ports:
            wait_for_port(port, "redis-server")
        subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                        "--cluster-replicas", "1", "--cluster-yes"], check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not all("cluster_state:ok" in redis_cli(p, "cluster", "info") for p in self.ports):
            if time.monotonic() > deadline:
                sys.exit("the bench's Redis Cluster did not settle")
            time.sleep(0.05)
        self.killed: list[int] = []

    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def kill_primary_of(self, org: str) -> int:
        """Kills the primary serving `org`'s windows (their hash tag is the org id): its port."""
        alive = next(p for p in self.ports if p not in self.killed)
        slot = int(redis_cli(alive, "cluster", "keyslot", org))
        for line in redis_cli(alive, "cluster", "nodes").splitlines():
            fields = line.split()
            addr, flags, ranges = fields[1], fields[2], fields[8:]
            if "master" not in flags or "fail" in flags:
                continue
            for r in ranges:
                low, _, high = r.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    port = int(addr.split("@")[0].rsplit(":", 1)[1])
                    self.procs[port].kill()
                    self.killed.append(port)
                    return port
        sys.exit(f"no primary serves slot {slot}")


def wait_for_port(port: int, what: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"{what} did not come up on {port}")
            time.sleep(0.02)


class Bench:
    def __init__(self, opts: argparse.Namespace, admin: httpx.Client, nodes: list[str],
                 proxy: FaultProxy | None = None, own_redis: OwnRedis | None = None,
                 cluster: RedisCluster | None = None):
        self.opts, self.admin, self.nodes, self.proxy, self.own_redis = opts, admin, nodes, proxy, own_redis
        self.cluster = cluster
        self.wipes = 0
        self.killed_at: float | None = None
        self.latencies = Latencies()
        self.limit = opts.limit_requests * COST

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        answer = self.admin.request(method, path, json=body)
        if not answer.is_success:
            sys.exit(f"{method} {path}: {answer.status_code} {answer.text}")
        return answer.json()

    def tenant(self, limit: Decimal) -> tuple[str, str, str]:
        """A new organization with a key and an armed monthly cap, served by every node: (org, cap, secret)."""
        org = self.call("POST", "/orgs", {"name": "overshoot"})["id"]
        self.call("PUT", f"/orgs/{org}/providers/openai", {"kind": "openai", "api_key": "sk-bench-0123456789"})
        secret = self.call("POST", f"/orgs/{org}/keys", {"name": "k"})["secret"]
        cap = self.call("POST", f"/orgs/{org}/caps", {"scope": "organization", "window": "month",
                                                       "limit_usd": str(limit), "hard_stop": True, "alert_at": []})
        self.wait_fed()
        return org, cap["id"], secret

    def wait_fed(self) -> None:
        """Until every node has installed the control plane's latest version (the cap with it)."""
        deadline = time.monotonic() + 10
        while True:
            listed = self.call("GET", "/nodes")
            versions = [n["feed_version"] for n in listed["nodes"]]
            if len(versions) >= len(self.nodes) and all(v == listed["feed_version"] for v in versions):
                return
            if time.monotonic() > deadline:
                sys.exit(f"the nodes did not install version {listed['feed_version']} within 10 s: {versions}")
            time.sleep(0.01)

    def ledger(self, org: str, admitted: int) -> Decimal:
        """The cap's spend in the ledger once all `admitted` receipts are in it; checked against the
        receipts' own costs, summed exactly."""
        deadline = time.monotonic() + 30
        while True:
            rows = self.call("GET", f"/orgs/{org}/receipts/summary")["rows"]
            if sum(r["requests"] for r in rows) >= admitted:
                break
            if time.monotonic() > deadline:
                sys.exit(f"{org}: {sum(r['requests'] for r in rows)} of {admitted} receipts in the ledger after 30 s")
            time.sleep(0.05)
        counted = sum(r["requests"] for r in rows)
        assert counted == admitted, f"{org}: {counted} receipts for {admitted} admitted requests"
        spend = Decimal(self.call("GET", f"/orgs/{org}/spend")["spend"][0]["spend_usd"])
        summed = sum((Decimal(r["cost_usd"]) for r in rows), Decimal(0))
        assert spend == summed == admitted * COST, f"{org}: spend {spend}, receipts {summed}, {admitted} x {COST}"
        return spend

    async def clients(self, secret: str, work) -> None:
        connections = [[Connection(url, secret) for _ in range(self.opts.clients_per_node)] for url in self.nodes]
        try:
            # Connected before the clock starts: a latency is a request's, not a connection's.
            await asyncio.gather(*(c.open() for per_node in connections for c in per_node))
            await asyncio.gather(*(work(i, c) for i, per_node in enumerate(connections) for c in per_node))
        finally:
            for per_node in connections:
                for c in per_node:
                    c.close()

    async def far(self, secret: str) -> int:
        """Every client sends `--far-requests` to the organization far from its line."""
        async def client(_node: int, connection: Connection) -> None:
            for _ in range(self.opts.far_requests):
                started = time.perf_counter()
                status = await connection.send()
                self.latencies.far.append(time.perf_counter() - started)
                assert status == 200, f"far from the line: {status}"
        await self.clients(secret, client)
        return self.opts.far_requests * self.opts.clients_per_node * len(self.nodes)

    async def line(self, org: str, secret: str) -> tuple[list[int], int, dict[int, int], int]:
        """Every client at the race's cap until refused `--refusals` times in a row (with
        `--uncapped`, in a row once the answered spend leaves no room for a request's real cost);
        the phantom refusals (`--uncapped`)."""
        admitted, refused, other = [0] * len(self.nodes), 0, {}
        in_flight, phantom = 0, 0
        stop_at = time.monotonic() + self.opts.seconds
        near_from = self.opts.limit_requests - self.opts.near

        fault = parse_fault(self.opts.fault)
        restore = None
        if fault and fault[0] == "cut" and self.proxy:
            self.proxy.set("cut")

            async def after() -> None:
                await asyncio.sleep(fault[1])
                self.proxy.set("pass")
            restore = asyncio.create_task(after())
        wipe_at = self.opts.limit_requests * fault[1] / 100 if fault and fault[0] == "wipe" else None
        kill_at = (self.opts.limit_requests * fault[1] / 100
                   if fault and fault[0] == "kill" and self.cluster and not self.cluster.killed else None)

        async def client(node: int, connection: Connection) -> None:
            nonlocal in_flight, refused, phantom, wipe_at, kill_at
            in_a_row = 0
            while in_a_row < self.opts.refusals and time.monotonic() < stop_at:
                # The admitted and the in-flight requests, as the nodes count them: spend and reservations.
                near = sum(admitted) + in_flight >= near_from
                far = sum(admitted) + in_flight < self.opts.limit_requests / 2
                in_flight += 1
                started = time.perf_counter()
                try:
                    status = await connection.send()
                finally:
                    in_flight -= 1
                took = time.perf_counter() - started
                if status == 200:
                    in_a_row = 0
                    admitted[node] += 1
                    if wipe_at is not None and sum(admitted) >= wipe_at and self.own_redis:
                        wipe_at = None
                        self.own_redis.flushall()
                        self.wipes += 1
                    if kill_at is not None and sum(admitted) >= kill_at and self.cluster:
                        kill_at = None
                        port = self.cluster.kill_primary_of(org)
                        self.killed_at = time.monotonic()
                        print(f"  killed the primary on {port}, which holds {org}")
                elif status == 402 and self.opts.uncapped:
                    refused += 1
                    # Room for this request's real cost, had every request in flight been
                    # admitted and cost its own: refused for its reservation alone.
                    if (sum(admitted) + in_flight + 1) * COST <= self.limit:
                        phantom += 1
                    # A refusal ends the race only once the spend of the requests admitted and
                    # answered leaves no room for one more at its real cost; before that, requests
                    # in flight hold the room (their reservations), and the client tries again.
                    if (sum(admitted) + 1) * COST <= self.limit:
                        in_a_row = 0
                        await asyncio.sleep(0.002)
                    else:
                        in_a_row += 1
                elif status == 402:
                    in_a_row += 1
                    refused += 1
                else:
                    other[status] = other.get(status, 0) + 1
                    if status == 503:  # budget_unverifiable: retry in a moment
                        await asyncio.sleep(0.1)
                if status == 402:
                    self.latencies.near_refused.append(took)
                elif status == 200 and near:
                    self.latencies.near_admitted.append(took)
                elif status == 200 and far:
                    self.latencies.approach.append(took)
        await self.clients(secret, client)
        if restore:
            await restore
        if time.monotonic() >= stop_at:
            print(f"  (the race was cut at {self.opts.seconds} s)")
        return admitted, refused, other, phantom

    async def again(self, secret: str) -> tuple[list[float | None], dict[int, int]]:
        """Each node, asked every 20 ms, admits a request again: seconds until it did (None after
        15 s), and the statuses of the refusals meanwhile."""
        refusals: dict[int, int] = {}

        async def node(url: str) -> float | None:
            connection = Connection(url, secret)
            started = time.monotonic()
            try:
                while time.monotonic() - started < 15:
                    status = await connection.send()
                    if status == 200:
                        return time.monotonic() - started
                    refusals[status] = refusals.get(status, 0) + 1
                    await asyncio.sleep(0.02)
                return None
            finally:
                connection.close()
        return list(await asyncio.gather(*(node(url) for url in self.nodes))), refusals

    async def race(self, number: int, far_secret: str) -> Race:
        await self.far(far_secret)
        org, cap, secret = self.tenant(self.limit)
        started = time.monotonic()
        admitted, refused, other, phantom = await self.line(org, secret)
        seconds = time.monotonic() - started
        spend = self.ledger(org, sum(admitted))
        # Room for one more request on each node: every node admits again once the limit is known.
        self.call("PATCH", f"/caps/{cap}", {"limit_usd": str(spend + RESERVED * len(self.nodes))})
        readmitted_in, again_refusals = await self.again(secret)
        return Race(number, self.limit, spend, admitted, refused, other, seconds, readmitted_in, again_refusals,
                    phantom)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)]


def line_answers(nodes: list[str]) -> dict[str, int]:
    """`recovea_cap_line_asks_total` summed over the nodes, by answer: how the requests near the
    line were decided (the last three decided from the node's own view)."""
    answers: dict[str, int] = {}
    for url in nodes:
        for m in re.finditer(r'^recovea_cap_line_asks_total\{answer="(\w+)"\} (\d+)', httpx.get(f"{url}/metrics").text, re.M):
            answers[m.group(1)] = answers.get(m.group(1), 0) + int(m.group(2))
    return answers


def report(races: list[Race], latencies: Latencies, opts: argparse.Namespace, answers: dict[str, int]) -> bool:
    overs = sorted(r.over / COST for r in races)
    median = overs[len(overs) // 2] if len(overs) % 2 else (overs[len(overs) // 2 - 1] + overs[len(overs) // 2]) / 2
    within = sum(r.within for r in races)
    room = [r.number for r in races if r.room_left]
    stuck = [r.number for r in races if not r.readmitted]
    worst = max(races, key=lambda r: r.over)
    waits = [t for r in races for t in r.readmitted_in if t is not None and t <= 5]
    print()
    print(f"{len(races)} races, {opts.nodes} nodes x {opts.clients_per_node} clients, limit {opts.limit_requests} "
          f"requests (${races[0].limit}), provider latency {opts.latency_ms} ms")
    print(f"overshoot (spend - limit, in requests): worst {worst.over / COST} (race {worst.number}, "
          f"${worst.over}), median {median}, best {overs[0]}")
    print(f"within the bound (spend <= limit + one request's reservation, ${RESERVED}): {within} of {len(races)}")
    if opts.uncapped:
        phantoms = sorted(r.phantom for r in races)
        refusals = sum(r.refused for r in races)
        rooms = sorted(r.room_left_requests for r in races)
        print(f"phantom refusals (room left for the request's real cost, not its reservation): "
              f"{sum(phantoms)} of {refusals} refusals; per race median {phantoms[len(phantoms) // 2]}, "
              f"max {phantoms[-1]}; races with any: {sum(1 for p in phantoms if p)} of {len(races)}")
        print(f"admitted per race: median {sorted(sum(r.admitted) for r in races)[len(races) // 2]}, "
              f"room left at the end (limit - spend, in real requests): median {rooms[len(rooms) // 2]:.2f}, "
              f"max {rooms[-1]:.2f}, min {rooms[0]:.2f}")
    print(f"room for a whole request left after refusals (phantom refusals): {len(room)} of {len(races)}"
          + (f" (races {room})" if room else ""))
    print(f"every node admitted again within 5 s once the limit was raised: {len(races) - len(stuck)} of {len(races)}"
          + (f" (not in races {stuck})" if stuck else "")
          + (f"; within p50 {percentile(waits, 50) * 1000:.0f} ms, max {max(waits) * 1000:.0f} ms" if waits else ""))
    print("asks at the line, by the answer acted on: " + ", ".join(f"{k} {v}" for k, v in answers.items()))
    print("client-side latency, ms:           count     p50     p99     max")
    for name, values in (("far from the line (own cap)", latencies.far),
                         ("approach (< half the limit)", latencies.approach),
                         (f"near, admitted (last {opts.near})", latencies.near_admitted),
                         ("near, refused at the line", latencies.near_refused)):
        if values:
            print(f"  {name:31} {len(values):7} {percentile(values, 50) * 1000:7.2f} "
                  f"{percentile(values, 99) * 1000:7.2f} {max(values) * 1000:7.2f}")
        else:
            print(f"  {name:31} {0:7}")
    return within == len(races) and not room and not stuck


async def run(bench: Bench, opts: argparse.Namespace) -> list[Race]:
    _org, _cap, far_secret = bench.tenant(Decimal(1_000_000))
    # The cost check: the first request's receipt costs exactly the reservation's estimate.
    connection = Connection(bench.nodes[0], far_secret)
    # A store made slow or cut by `--fault` may leave the first request unconfirmed (503): again.
    for _ in range(50):
        status = await connection.send()
        if status != 503:
            break
        await asyncio.sleep(0.1)
    assert status == 200, f"the first request far from any line was answered {status}"
    connection.close()
    bench.ledger(_org, 1)
    output = f"{MAX_OUTPUT_TOKENS} output (no output limit: the model's most)" if opts.uncapped \
        else f"{OUTPUT_TOKENS} output (max_tokens)"
    print(f"each request: reservation estimate {INPUT_TOKENS} input tokens (from the body) + {output} "
          f"at ${INPUT_PER_MTOK}/${OUTPUT_PER_MTOK} per Mtok = ${RESERVED}; real cost "
          f"(the mock's usage {USAGE['prompt_tokens']} + {USAGE['completion_tokens']}, the ledger's receipt) = ${COST}")
    print(f"bound: spend <= limit + ${RESERVED} (one request's reservation); limit {opts.limit_requests} requests = "
          f"${bench.limit}", flush=True)
    races = []
    for number in range(1, opts.races + 1):
        race = await bench.race(number, far_secret)
        races.append(race)
        waits = " ".join("never (15 s)" if t is None else f"{t * 1000:.0f}" for t in race.readmitted_in)
        if not race.readmitted:
            waits += f" ms, refused meanwhile {race.again_refusals} (statuses)"
        else:
            waits += " ms"
        phantom = f", phantom {race.phantom}" if opts.uncapped else ""
        print(f"race {number:3}: spend ${race.spend}, over {race.over / COST:+.3f} requests "
              f"{'ok' if race.within else 'OVER THE BOUND'}; admitted {'+'.join(map(str, race.admitted))}, "
              f"refused {race.refused}{phantom}{f', other {race.other}' if race.other else ''}, {race.seconds:.2f} s; "
              f"admitted again in {waits}{' ROOM LEFT' if race.room_left else ''}", flush=True)
    return races


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args.add_argument("--nodes", type=int, default=2)
    args.add_argument("--clients-per-node", type=int, default=32)
    args.add_argument("--races", "--runs", type=int, default=100, dest="races",
                      help="races, each at a new organization's cap, on the same processes")
    args.add_argument("--limit-requests", type=int, default=40, help="the cap's limit, in requests' cost")
    args.add_argument("--latency-ms", type=int, default=0, help="the provider's time to answer each request")
    args.add_argument("--far-requests", type=int, default=3, help="requests of each client far from the line, per race")
    args.add_argument("--refusals", type=int, default=5, help="a client stops after this many refusals in a row")
    args.add_argument("--near", type=int, default=8,
                      help="requests sent within this many requests' cost of the line (admitted and in flight) are near it")
    args.add_argument("--seconds", type=float, default=15, help="a race's longest time")
    args.add_argument("--redis-cluster", action="store_true",
                      help="share a Redis Cluster of the bench's own (three primaries with replicas)")
    args.add_argument("--uncapped", action="store_true",
                      help="every request sets no output limit and the mock writes 20 x 1,024 output tokens")
    args.add_argument("--fault", help="slow:MS (Redis's round trip + MS), cut:SECONDS (the first node cut off "
                                      "from Redis at each race's line), clock:SECONDS (the first node's clock ahead), "
                                      "wipe:PERCENT (a Redis of the bench's own flushed at PERCENT of each race's limit)")
    opts = args.parse_args()
    fault = parse_fault(opts.fault)
    if opts.uncapped:
        uncapped()
    if opts.nodes < 1 or opts.clients_per_node < 1 or opts.races < 1 or opts.limit_requests < 1:
        sys.exit("--nodes, --clients-per-node, --races and --limit-requests are at least 1")

    work = Path(tempfile.mkdtemp(prefix="recovea-overshoot-"))
    procs: list[subprocess.Popen] = []
    try:
        mock = subprocess.Popen([binary("recovea-mock-provider"), "--listen", "127.0.0.1:0", "--max-recorded", "0"],
                                stdout=subprocess.PIPE)
        procs.append(mock)
        mock_url = read_banner(mock, r"listening on (http://\S+)")["url"]
        behaviour = {"usage": USAGE, "times": 100_000_000}
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
        control_url = read_banner(control_proc, r"recovea admin:\s+(http://\S+)/admin/v1", last="recovea admin:")["admin"]
        admin = httpx.Client(base_url=f"{control_url}/admin/v1", headers={"Authorization": f"Bearer {TOKEN}"})
        price = {"input_per_mtok_usd": str(INPUT_PER_MTOK), "output_per_mtok_usd": str(OUTPUT_PER_MTOK),
                 "max_output_tokens": MAX_OUTPUT_TOKENS}
        admin.put(f"/prices/{MODEL}", json=price).raise_for_status()
        proxy, own_redis, cluster = None, None, None
        if fault and fault[0] == "kill" and not opts.redis_cluster:
            sys.exit("--fault kill is for --redis-cluster")
        if opts.redis_cluster:
            cluster = RedisCluster(work)
            procs.extend(cluster.procs.values())
        if fault and fault[0] == "wipe":
            own_redis = OwnRedis(work)
            procs.append(own_redis.proc)
        if fault and fault[0] in ("slow", "cut"):
            proxy = FaultProxy()
            procs.append(proxy.proc)
            if fault[0] == "slow":
                proxy.set(f"delay {fault[1] // 2}")
        nodes = []
        for n in range(opts.nodes):
            redis = f"127.0.0.1:{own_redis.port}" if own_redis else "127.0.0.1:6379"
            if proxy and (fault[0] == "slow" or n == 0):
                redis = proxy.addr
            redis_url = cluster.url() if cluster else f"redis://{redis}/"
            env = dict(os.environ)
            if fault and fault[0] == "clock" and n == 0:
                env.update({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                            "FAKETIME": f"+{fault[1]}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
            proc = subprocess.Popen(
                [binary("recovea"), "node", "--listen", "127.0.0.1:0", "--data-dir", str(work / f"node-{n}"),
                 "--control-url", control_url, "--node-token", node_token, "--master-key", master_key,
                 "--redis-url", redis_url, "--openai-base-url", mock_url,
                 "--anthropic-base-url", mock_url, "--log", "warn"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            procs.append(proc)
            nodes.append(read_banner(proc, r"recovea node \S+:\s+(http://\S+)")["url"])

        bench = Bench(opts, admin, nodes, proxy, own_redis, cluster)
        races = asyncio.run(run(bench, opts))
        ok = report(races, bench.latencies, opts, line_answers(nodes))
        if own_redis:
            print(f"Redis flushed {bench.wipes} times (once a race)")
            ok = ok and bench.wipes == len(races)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
