#!/usr/bin/env python3
"""One organization's slow large bodies against a shared node: its memory, and another
organization's latency, with the node's body budget (`--body-memory`, default 256 MiB) and without
one (`--body-memory 64GiB`, more than the storm can send), side by side in one run.

For each build of `recovea serve` (one mock provider behind both): two organizations; another
organization's requests (a small chat and a 1 MiB one, one at a time) timed before the storm; then
the storm: N connections of the greedy organization, each sending a 32 MiB body but for its last
byte as fast as the node takes it, and held; once the node takes no more, the other organization's
requests are timed again. The node's resident memory (VmRSS, and its peak VmHWM) is read from
/proc throughout.

Needs target/{release,debug}/recovea and recovea-mock-provider
(`cargo build --release -p recovea -p recovea-testkit --bins`) and the venv of scripts/test-sdk
(httpx). About a minute.

    .venv/bin/python bench/body_memory.py [--bodies 200]
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overshoot import binary, read_banner  # noqa: E402

TOKEN = "body-memory-bench-admin-token-0123456789"
BODY = 32 << 20
CHAT = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi"}]}'


def chat_of(size: int) -> bytes:
    head, tail = b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"', b'"}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def resident(pid: int) -> tuple[int, int]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) << 10, int(fields["VmHWM"].split()[0]) << 10


def tenant(admin: httpx.Client, name: str) -> str:
    org = admin.post("/orgs", json={"name": name}).json()["id"]
    admin.put(f"/orgs/{org}/providers/openai", json={"kind": "openai", "api_key": "sk-bench-0123456789"})
    return admin.post(f"/orgs/{org}/keys", json={"name": "k"}).json()["secret"]


def timed(client: httpx.Client, secret: str, rounds: int) -> tuple[list[float], list[float]]:
    small, large = [], []
    headers = {"authorization": f"Bearer {secret}", "content-type": "application/json"}
    for _ in range(rounds):
        for body, into in ((CHAT, small), (chat_of(1 << 20), large)):
            started = time.perf_counter()
            response = client.post("/v1/chat/completions", content=body, headers=headers)
            into.append(time.perf_counter() - started)
            assert response.status_code == 200, response.text
    return small, large


async def storm(address: str, secret: str, bodies: int, sent: list[int]) -> list[asyncio.Task]:
    host, port = address.rsplit(":", 1)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {secret}\r\n"
            f"content-type: application/json\r\ncontent-length: {BODY}\r\n\r\n").encode()
    chunk = b" " * (256 << 10)

    async def one() -> None:
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(head)
        left = BODY - 1
        while left > 0:
            piece = chunk[:min(len(chunk), left)]
            writer.write(piece)
            await writer.drain()
            left -= len(piece)
            sent[0] += len(piece)
        await asyncio.Event().wait()  # held: the last byte never comes

    tasks = [asyncio.create_task(one()) for _ in range(bodies)]
    last, still_since = -1, time.monotonic()
    while time.monotonic() - still_since < 2 or sent[0] < 3 * BODY:
        await asyncio.sleep(0.1)
        if sent[0] != last:
            last, still_since = sent[0], time.monotonic()
    return tasks


def run(label: str, mock_url: str, extra: list[str], bodies: int, work: Path) -> dict:
    proc = subprocess.Popen(
        [binary("recovea"), "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
         "--data-dir", str(work / label), "--openai-base-url", mock_url, "--admin-token", TOKEN,
         "--max-connections", str(bodies * 2 + 100), "--log", "warn", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        gateway = read_banner(proc, r"recovea gateway:\s+(http://\S+)", last="recovea admin:")
        admin = httpx.Client(base_url=f"{gateway['admin']}/admin/v1", headers={"authorization": f"Bearer {TOKEN}"})
        greedy, other = tenant(admin, "greedy"), tenant(admin, "other")
        client = httpx.Client(base_url=gateway["url"], timeout=120)
        timed(client, other, 3)
        before = timed(client, other, 20)
        rss_before = resident(proc.pid)[0]
        sent = [0]
        loop = asyncio.new_event_loop()
        tasks = loop.run_until_complete(storm(gateway["url"].removeprefix("http://"), greedy, bodies, sent))
        during = timed(client, other, 20)
        rss_after, peak = resident(proc.pid)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()
        return {"label": label, "sent": sent[0], "rss_before": rss_before, "rss_after": rss_after, "peak": peak,
                "before": before, "during": during}
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bodies", type=int, default=200, help="slow 32 MiB bodies of the greedy organization")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="recovea-body-memory-"))
    mock = subprocess.Popen([binary("recovea-mock-provider"), "--listen", "127.0.0.1:0", "--max-recorded", "0"],
                            stdout=subprocess.PIPE)
    try:
        mock_url = read_banner(mock, r"listening on (http://\S+)")["url"]
        httpx.post(f"{mock_url}/__mock/script", json={"times": 100_000_000}).raise_for_status()
        results = [run("budget", mock_url, [], opts.bodies, work),
                   run("no-budget", mock_url, ["--body-memory", "64GiB"], opts.bodies, work)]
    finally:
        mock.kill()
    mib = lambda n: f"{n / (1 << 20):,.0f} MiB"  # noqa: E731
    ms = lambda xs: f"{statistics.median(xs) * 1000:.1f} / {max(xs) * 1000:.1f}"  # noqa: E731
    print(f"{opts.bodies} slow bodies of 32 MiB (all but the last byte) from one organization; "
          "another organization's requests one at a time, 20 of each, median / worst ms")
    print("| build | storm sent | RSS before | RSS after | RSS peak | small before | small during | "
          "1 MiB before | 1 MiB during | small during/before (median) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        ratio = statistics.median(r["during"][0]) / statistics.median(r["before"][0])
        print(f"| {r['label']} | {mib(r['sent'])} | {mib(r['rss_before'])} | {mib(r['rss_after'])} | "
              f"{mib(r['peak'])} | {ms(r['before'][0])} | {ms(r['during'][0])} | {ms(r['before'][1])} | "
              f"{ms(r['during'][1])} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
