"""Session fixtures for the black-box SDK suite.

One mock provider (`recovea-mock-provider`) and one gateway (`recovea serve`) are started for the whole
session, on ports the OS picks (each prints the addresses it listens on), with a temporary data dir and a
fixed admin token. Every test makes its own organization, keys and credentials (unique names), so tests
are independent; the mock's request log is never reset mid-run: a test takes a marker (the log's length)
before its calls and reads what came after. Receipts are read per key (`key_id=`), and `Ledger.settle`
checks that a key has exactly one receipt per admitted request, the suite's own probes included.

Binaries: `RECOVEA_BIN` and `MOCK_PROVIDER_BIN`, defaulting to `debug/recovea` and `debug/recovea-mock-provider`
in cargo's target directory (`CARGO_TARGET_DIR`, else `target` under the repository root). A missing binary
fails the session.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import queue
import re
import secrets
import shutil
import signal
import string
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Callable, Iterable

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "sdk-suite-admin-token-0123456789abcdef"
# The contract: admin changes reach the serving gateway within one second. Poll, never sleep.
PROPAGATION_DEADLINE_S = float(os.environ.get("RECOVEA_SDK_PROPAGATION_DEADLINE", "3"))
STARTUP_DEADLINE_S = float(os.environ.get("RECOVEA_SDK_STARTUP_DEADLINE", "30"))
SECRET_RE = re.compile(r"^rk_[0-9A-Za-z]{40,}$")
ANY_RK_SECRET_RE = re.compile(r"rk_[0-9A-Za-z]{40,}")
BASE62 = string.ascii_letters + string.digits

OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-sonnet-4-6"
ANTHROPIC_VERSION = "2023-06-01"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def random_base62(n: int) -> str:
    return "".join(secrets.choice(BASE62) for _ in range(n))


def _binary(env_var: str, name: str) -> Path:
    """`env_var`'s path, else the debug build of `name` in cargo's target directory."""
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    raw = os.environ.get(env_var, f"{target}/debug/{name}")
    path = Path(raw)
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"{env_var}: binary not found or not executable: {path} "
            f"(build it first: cargo build --workspace)",
            pytrace=False,
        )
    return path


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def _pump(stream, log_path: Path, lines: "queue.Queue[str] | None") -> None:
    """Copy a child's stdout to a log file (so the pipe never fills), handing lines to `lines` too."""
    with open(log_path, "a", buffering=1, errors="replace") as log:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            log.write(line)
            if lines is not None:
                lines.put(line.rstrip("\r\n"))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


# --------------------------------------------------------------------------------------------------
# Mock provider
# --------------------------------------------------------------------------------------------------


@dataclass
class ProviderRequest:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: Any

    @property
    def body_text(self) -> str:
        if self.body is None:
            return ""
        if isinstance(self.body, str):
            return self.body
        return json.dumps(self.body)

    @property
    def body_json(self) -> Any:
        if isinstance(self.body, (dict, list)):
            return self.body
        return json.loads(self.body_text)

    def header_values(self, name: str) -> list[str]:
        name = name.lower()
        return [v for (k, v) in self.headers if k.lower() == name]

    def header(self, name: str) -> str | None:
        values = self.header_values(name)
        assert len(values) <= 1, f"header {name!r} sent {len(values)} times upstream: {values}"
        return values[0] if values else None


class MockProvider:
    def __init__(self, url: str, log_path: Path):
        self.url = url.rstrip("/")
        self.log_path = log_path
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def requests(self) -> list[ProviderRequest]:
        r = self.http.get("/__mock/requests")
        assert r.status_code == 200, f"GET /__mock/requests: {r.status_code} {r.text}"
        out = []
        for item in r.json():
            headers = [(str(h[0]), str(h[1])) for h in item.get("headers", [])]
            out.append(ProviderRequest(item["method"], item["path"], headers, item.get("body")))
        return out

    def mark(self) -> int:
        return len(self.requests())

    def since(self, mark: int) -> list[ProviderRequest]:
        return self.requests()[mark:]

    def script(self, **behaviour: Any) -> None:
        r = self.http.post("/__mock/script", json=behaviour)
        assert r.status_code == 204, f"POST /__mock/script: {r.status_code} {r.text}"


@pytest.fixture(scope="session")
def mock_provider(tmp_path_factory) -> Iterable[MockProvider]:
    binary = _binary("MOCK_PROVIDER_BIN", "recovea-mock-provider")
    workdir = tmp_path_factory.mktemp("mock")
    out_log, err_log = workdir / "stdout.log", workdir / "stderr.log"
    with open(err_log, "wb") as err:
        proc = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, out_log, lines), daemon=True).start()
    url = None
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    try:
        while url is None:
            if proc.poll() is not None:
                pytest.fail(f"mock provider exited with {proc.returncode}:\n{_tail(err_log)}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"mock provider printed no 'listening on' line:\n{_tail(out_log)}", pytrace=False)
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
        _SESSION_LOGS["mock provider"] = (out_log, err_log)
        yield MockProvider(url, err_log)
    finally:
        _stop(proc)


# --------------------------------------------------------------------------------------------------
# Gateway
# --------------------------------------------------------------------------------------------------


class Gateway:
    def __init__(self, url: str, admin_url: str, mock_url: str, proc: subprocess.Popen, logs: tuple[Path, Path]):
        self.url = url
        self.admin_url = admin_url
        self.mock_url = mock_url
        self.proc = proc
        self.logs = logs
        self.http = httpx.Client(base_url=url, timeout=30)

    def log_tail(self) -> str:
        return f"--- stdout\n{_tail(self.logs[0])}\n--- stderr\n{_tail(self.logs[1])}"

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.http.request(method, path, **kw)


GATEWAY_BANNER_RE = re.compile(r"^recovea gateway:\s+(http://\S+?)/?$")
ADMIN_BANNER_RE = re.compile(r"^recovea admin:\s+(http://\S+?)/admin/v1/?$")


@pytest.fixture(scope="session")
def gateway(mock_provider: MockProvider, tmp_path_factory) -> Iterable[Gateway]:
    """`recovea serve` on ports the OS picks (`127.0.0.1:0`): the addresses are read from its banner, whose
    last line (`recovea admin:   http://ADDR/admin/v1`) it prints once ready. No port is probed and
    released beforehand, so no other process can take it in between."""
    yield from launch_serve(mock_provider, tmp_path_factory.mktemp("gateway"), "gateway")


def launch_serve(mock_provider: MockProvider, workdir: Path, log_name: str, *extra: str,
                 admin_listen: str = "127.0.0.1:0") -> Iterable[Gateway]:
    """Starts `recovea serve` with `extra` arguments in `workdir`, yields it once ready, stops it after.
    `admin_listen` is the admin listener's address (a port the OS picks unless a test needs to know it
    before the start, as single sign-on's redirect URL does)."""
    binary = _binary("RECOVEA_BIN", "recovea")
    data_dir = workdir / "data"
    data_dir.mkdir()
    out_log, err_log = workdir / "stdout.log", workdir / "stderr.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVEA_")}
    env.setdefault("RUST_LOG", "info")
    cmd = [
        str(binary), "serve",
        "--listen", "127.0.0.1:0",
        "--admin-listen", admin_listen,
        "--data-dir", str(data_dir),
        "--admin-token", ADMIN_TOKEN,
        "--openai-base-url", mock_provider.url,
        "--anthropic-base-url", mock_provider.url,
        *extra,
    ]
    with open(err_log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, out_log, lines), daemon=True).start()
    _SESSION_LOGS[log_name] = (out_log, err_log)
    try:
        url = admin_url = None
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while admin_url is None:
            if proc.poll() is not None:
                pytest.fail(f"recovea serve exited with {proc.returncode}:\n{_tail(out_log)}\n{_tail(err_log)}",
                            pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"recovea serve printed no 'recovea admin:' banner line after {STARTUP_DEADLINE_S}s:\n"
                            f"{_tail(out_log)}\n{_tail(err_log)}", pytrace=False)
            try:
                line = lines.get(timeout=0.1)
            except queue.Empty:
                continue
            if m := GATEWAY_BANNER_RE.match(line.strip()):
                url = m.group(1)
            elif m := ADMIN_BANNER_RE.match(line.strip()):
                admin_url = m.group(1)
        if url is None:
            pytest.fail(f"recovea serve printed its admin line before any 'recovea gateway:' line:\n{_tail(out_log)}",
                        pytrace=False)
        for name, u in (("gateway", url), ("admin", admin_url)):
            assert not u.endswith(":0"), f"the banner shows the {name} address asked for, not the bound one: {u}"
        gw = Gateway(url, admin_url, mock_provider.url, proc, (out_log, err_log))
        # The banner's last line means ready: both listeners answer at once, without polling.
        r = httpx.get(f"{url}/readyz", timeout=5)
        assert r.status_code == 200, f"banner printed but GET /readyz is {r.status_code}:\n{gw.log_tail()}"
        r = httpx.get(f"{admin_url}/admin/v1/orgs", timeout=5, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert r.status_code == 200, f"banner printed but GET /admin/v1/orgs is {r.status_code}:\n{gw.log_tail()}"
        try:
            yield gw
        finally:
            gw.http.close()
    finally:
        _stop(proc)


# --------------------------------------------------------------------------------------------------
# Admin API
# --------------------------------------------------------------------------------------------------


class Admin:
    def __init__(self, admin_url: str, token: str = ADMIN_TOKEN):
        self.http = httpx.Client(
            base_url=f"{admin_url}/admin/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    @staticmethod
    def _expect(r: httpx.Response, status: int) -> dict:
        assert r.status_code == status, (
            f"{r.request.method} {r.request.url.path}: expected {status}, got {r.status_code}: {r.text}"
        )
        return r.json()

    def create_org(self, name: str) -> dict:
        return self._expect(self.http.post("/orgs", json={"name": name}), 201)

    def create_key(self, org_id: str, name: str, **extra: Any) -> dict:
        return self._expect(self.http.post(f"/orgs/{org_id}/keys", json={"name": name, **extra}), 201)

    def revoke_key(self, key_id: str) -> dict:
        return self._expect(self.http.post(f"/keys/{key_id}/revoke"), 200)

    def put_provider(self, org_id: str, name: str, kind: str, api_key: str, base_url: str | None = None) -> dict:
        body: dict[str, Any] = {"kind": kind, "api_key": api_key}
        if base_url is not None:
            body["base_url"] = base_url
        return self._expect(self.http.put(f"/orgs/{org_id}/providers/{name}", json=body), 200)


@pytest.fixture(scope="session")
def admin(gateway: Gateway) -> Iterable[Admin]:
    a = Admin(gateway.admin_url)
    yield a
    a.http.close()


# --------------------------------------------------------------------------------------------------
# Tenants: an org, a key and (optionally) managed credentials, visible to the gateway
# --------------------------------------------------------------------------------------------------


@dataclass
class Tenant:
    org_id: str
    key_id: str
    secret: str
    openai_key: str | None
    anthropic_key: str | None
    # the x-request-id of every probe the gateway admitted while the tenant was set up: each has a receipt
    probe_request_ids: list[str] = field(default_factory=list)


def refusal_code(r: httpx.Response) -> str | None:
    """The `error.code` of a gateway refusal, or None if `r` is not one of the given refusals."""
    if r.status_code not in (400, 401):
        return None
    try:
        code = r.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
    if (r.status_code, code) in ((401, "invalid_api_key"), (400, "provider_not_configured")):
        return code
    return None


def request_id(headers: Any) -> str:
    """The gateway's `x-request-id` (`req_...`) from response headers; every receipt names it."""
    rid = headers.get("x-request-id")
    assert rid and rid.startswith("req_"), f"no gateway x-request-id (req_...) in {dict(headers)}"
    return rid


def probe(gateway: Gateway, secret: str, route: str) -> httpx.Response:
    """One cheap request on a route (`openai`: Bearer; `anthropic`: `x-api-key`), forwarded if admitted."""
    if route == "openai":
        return gateway.request("GET", "/v1/models", headers={"Authorization": f"Bearer {secret}"})
    return gateway.request(
        "POST", "/v1/messages",
        headers={"x-api-key": secret, "anthropic-version": ANTHROPIC_VERSION},
        json={"model": ANTHROPIC_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "ping"}]},
    )


def wait_until(gateway: Gateway, secret: str, route: str, want: Callable[[httpx.Response], bool], what: str,
               deadline_s: float = PROPAGATION_DEADLINE_S, admitted: list[str] | None = None) -> httpx.Response:
    """Probes the route until `want(response)`, failing after `deadline_s`. The request ids of the probes the
    gateway admitted (not refused: each has a receipt) are appended to `admitted`."""
    deadline = time.monotonic() + deadline_s
    while True:
        r = probe(gateway, secret, route)
        if admitted is not None and refusal_code(r) is None:
            admitted.append(request_id(r.headers))
        if want(r):
            return r
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: still {r.status_code} {r.text!r} after {deadline_s}s", pytrace=False)
        time.sleep(0.05)


def wait_admitted(gateway: Gateway, secret: str, route: str, configured: bool = True,
                  admitted: list[str] | None = None) -> httpx.Response:
    """Polls until the gateway knows the key (and, if `configured`, the route's credential)."""
    if configured:
        return wait_until(gateway, secret, route, lambda r: refusal_code(r) is None,
                          f"key and {route} credential reaching the gateway", admitted=admitted)
    return wait_until(gateway, secret, route, lambda r: refusal_code(r) != "invalid_api_key",
                      "key reaching the gateway", admitted=admitted)


def wait_refused(gateway: Gateway, secret: str, route: str = "openai",
                 deadline_s: float = PROPAGATION_DEADLINE_S, admitted: list[str] | None = None) -> httpx.Response:
    return wait_until(gateway, secret, route, lambda r: refusal_code(r) == "invalid_api_key",
                      "key refused by the gateway", deadline_s, admitted=admitted)


@pytest.fixture
def make_tenant(gateway: Gateway, admin: Admin) -> Callable[..., Tenant]:
    def make(openai: bool = True, anthropic: bool = True) -> Tenant:
        org = admin.create_org(unique("sdk-org"))
        openai_key = anthropic_key = None
        if openai:
            openai_key = f"sk-managed-openai-{uuid.uuid4().hex}"
            admin.put_provider(org["id"], "openai", "openai", openai_key)
        if anthropic:
            anthropic_key = f"sk-managed-anthropic-{uuid.uuid4().hex}"
            admin.put_provider(org["id"], "anthropic", "anthropic", anthropic_key)
        key = admin.create_key(org["id"], unique("sdk-key"))
        tenant = Tenant(org["id"], key["id"], key["secret"], openai_key, anthropic_key)
        wait_admitted(gateway, tenant.secret, "openai", configured=openai, admitted=tenant.probe_request_ids)
        wait_admitted(gateway, tenant.secret, "anthropic", configured=anthropic,
                      admitted=tenant.probe_request_ids)
        return tenant

    return make


@pytest.fixture
def tenant(make_tenant) -> Tenant:
    return make_tenant()


# --------------------------------------------------------------------------------------------------
# SDK clients
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def openai_client(gateway: Gateway) -> Callable[..., Any]:
    import openai

    made = []

    def make(api_key: str, **kw: Any) -> "openai.OpenAI":
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        c = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def anthropic_client(gateway: Gateway) -> Callable[..., Any]:
    """`make(key, auth=...)`: `auth="sdk"` lets the SDK send `api_key` its own way (anthropic 2.x sends
    `Authorization: Bearer <key>`); `auth="x-api-key"` sends the key as `x-api-key`, as the Anthropic API
    documents and older SDKs do, with no `Authorization` header."""
    import anthropic

    made = []

    def make(api_key: str, auth: str = "sdk", **kw: Any) -> "anthropic.Anthropic":
        kw.setdefault("max_retries", 0)
        kw.setdefault("timeout", 30)
        if auth == "x-api-key":
            kw["default_headers"] = {**kw.get("default_headers", {}), "x-api-key": api_key,
                                     "Authorization": anthropic.Omit()}
            api_key = None
        else:
            assert auth == "sdk", auth
        c = anthropic.Anthropic(base_url=gateway.url, api_key=api_key, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


JS_DIR = REPO_ROOT / "tests" / "sdk" / "js"


def run_node(script: str, *args: str) -> list[dict]:
    """Runs `tests/sdk/js/<script>` (a TypeScript SDK's calls through the gateway) with `args`; the JSON lines
    it printed, one per call, in order. The SDKs' environment variables are not passed on."""
    if not (JS_DIR / "node_modules").is_dir() or shutil.which("node") is None:
        pytest.fail("the TypeScript SDKs are not installed: run scripts/test-sdk (npm ci in tests/sdk/js)",
                    pytrace=False)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPENAI_", "ANTHROPIC_", "AZURE_OPENAI_"))}
    done = subprocess.run(["node", str(JS_DIR / script), *args], capture_output=True, text=True, timeout=60,
                          cwd=JS_DIR, env=env)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(autouse=True)
def _no_sdk_environment(monkeypatch):
    """The SDKs read keys and URLs from the environment; the suite passes everything explicitly."""
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "ANTHROPIC_", "AZURE_OPENAI_", "GOOGLE_", "GEMINI_")):
            monkeypatch.delenv(name)


# --------------------------------------------------------------------------------------------------
# Assertions on what the provider received
# --------------------------------------------------------------------------------------------------


def assert_no_recovea_secret(reqs: list[ProviderRequest], *secrets_: str) -> None:
    """No Recovea secret (the given ones, nor anything shaped like one) in any header or body upstream."""
    for req in reqs:
        for name, value in req.headers:
            assert name.lower() != "x-recovea-key", f"{req.path}: x-recovea-key forwarded upstream"
            assert not ANY_RK_SECRET_RE.search(value), f"{req.path}: header {name} carries an rk_ secret: {value}"
            for s in secrets_:
                assert s not in value and s[3:] not in value, f"{req.path}: header {name} carries the rk_ secret"
        body = req.body_text
        assert not ANY_RK_SECRET_RE.search(body), f"{req.path}: body carries an rk_ secret"
        for s in secrets_:
            assert s not in body and s[3:] not in body, f"{req.path}: body carries the rk_ secret"


def assert_forwarded_with_managed_key(mock: MockProvider, mark: int, tenant: Tenant, path: str,
                                      count: int = 1) -> list[ProviderRequest]:
    """Exactly `count` provider requests since `mark`, all to `path`, signed with the managed key."""
    reqs = mock.since(mark)
    assert [r.path.split("?")[0] for r in reqs] == [path] * count, (
        f"expected {count} provider request(s) to {path}, got {[(r.method, r.path) for r in reqs]}"
    )
    for req in reqs:
        if path.startswith("/v1/messages"):
            assert req.header("x-api-key") == tenant.anthropic_key, req.headers
            for v in req.header_values("authorization"):
                assert tenant.secret not in v
        else:
            assert req.header("authorization") == f"Bearer {tenant.openai_key}", req.headers
            assert req.header("x-api-key") is None, req.headers
    assert_no_recovea_secret(reqs, tenant.secret)
    return reqs


def assert_request_id(headers: Any) -> str:
    return request_id(headers)


# --------------------------------------------------------------------------------------------------
# Metering: receipts, prices and the expected figures
# --------------------------------------------------------------------------------------------------

# Receipts are delivered from the node's local spool well within a second; poll up to this long.
RECEIPT_DEADLINE_S = float(os.environ.get("RECOVEA_SDK_RECEIPT_DEADLINE", "5"))

RECEIPT_FIELDS = {
    "id", "request_id", "org_id", "key_id", "provider", "model", "endpoint", "status", "stream",
    "input_tokens", "output_tokens", "cached_input_tokens", "cache_write_input_tokens", "reasoning_tokens",
    "cost_usd", "usage_source", "priced", "priced_as", "price_revision", "started_at", "finished_at", "node_id",
}
USD_RE = re.compile(r"^\d+\.\d{2,9}$")


@dataclass(frozen=True)
class Price:
    """USD per million tokens; a missing cached or cache-write price means the input price."""
    input: str
    output: str
    cached: str | None = None
    cache_write: str | None = None


# The built-in table (crates/core/prices/builtin.json) for the models the suite uses. No test overrides
# these models' prices: the override tests use models of their own.
BUILTIN_PRICES = {
    "gpt-4o-mini": Price("0.15", "0.6", "0.075"),
    "gpt-4o": Price("2.5", "10", "1.25"),
    "gpt-3.5-turbo-instruct": Price("1.5", "2"),
    "text-embedding-3-small": Price("0.02", "0"),
    "claude-sonnet-4-5": Price("3", "15", "0.3", "3.75"),
    "claude-sonnet-4-6": Price("3", "15", "0.3", "3.75"),
    "claude-haiku-4-5": Price("1", "5", "0.1", "1.25"),
    "gemini-2.5-flash": Price("0.3", "2.5", "0.03"),
}

OPENAI_CHAT_USAGE = {  # 1000 input of which 400 cached; 200 output of which 50 reasoning
    "prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
    "prompt_tokens_details": {"cached_tokens": 400, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 50, "audio_tokens": 0,
                                  "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
}
# gpt-4o-mini: 600 x 0.15 + 400 x 0.075 + 200 x 0.6 per M = (90 + 30 + 120) / 1e6
OPENAI_CHAT_COST = "0.00024"

MOCK_TEXT_KEYS = frozenset({"content", "text", "input", "prompt", "system", "instructions"})
MOCK_OUTPUT_TOKENS = 5  # one per streamed piece of "This is a mock response."


def mock_input_tokens(body: Any) -> int:
    """The mock provider's input-token count of a request body (crates/testkit/src/usage.rs): 1 + the
    whitespace-separated words of every string, and 1 per integer, under a text key, at any depth."""
    def walk(v: Any, in_text: bool) -> int:
        if isinstance(v, bool) or v is None or isinstance(v, float):
            return 0
        if isinstance(v, int):
            return int(in_text)
        if isinstance(v, str):
            return len(v.split()) if in_text else 0
        if isinstance(v, list):
            return sum(walk(x, in_text) for x in v)
        if isinstance(v, dict):
            return sum(walk(val, k in MOCK_TEXT_KEYS) for k, val in v.items())
        raise TypeError(type(v))
    return 1 + walk(body, False)


NANO = Decimal("0.000000001")


def format_usd(amount: Decimal) -> str:
    """The API's money format: trailing zeros trimmed, at least two decimals ("0.00", "0.00000345", "1.50")."""
    text = format(amount.quantize(NANO), "f").rstrip("0")
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"


def expected_cost(price: Price, input_tokens: int, output_tokens: int, cached: int = 0, cache_write: int = 0) -> str:
    """Plain input x input + cached x cached + cache-write x cache-write + output x output, exact, rounded
    once (half up) to the nano-dollar."""
    plain = input_tokens - cached - cache_write
    assert plain >= 0, (input_tokens, cached, cache_write)
    per_mtok = (plain * Decimal(price.input)
                + cached * Decimal(price.cached or price.input)
                + cache_write * Decimal(price.cache_write or price.input)
                + output_tokens * Decimal(price.output))
    return format_usd((per_mtok / Decimal(1_000_000)).quantize(NANO, rounding=ROUND_HALF_UP))


def parse_time(text: str) -> dt.datetime:
    assert isinstance(text, str) and text.endswith("Z"), f"not an RFC 3339 UTC time: {text!r}"
    return dt.datetime.fromisoformat(text[:-1] + "+00:00")


class Ledger:
    """The receipts side of the admin API: listing (all pages), CSV, summary, prices, and `settle`."""

    def __init__(self, admin: Admin, gateway: Gateway):
        self.http = admin.http
        self.gateway = gateway

    def page(self, org_id: str, **params: Any) -> dict:
        r = self.http.get(f"/orgs/{org_id}/receipts", params=params)
        assert r.status_code == 200, f"GET receipts {params}: {r.status_code} {r.text}"
        body = r.json()
        assert set(body) == {"receipts", "next_cursor"}, body
        assert isinstance(body["receipts"], list), body
        assert body["next_cursor"] is None or isinstance(body["next_cursor"], str), body
        return body

    def receipts(self, org_id: str, **params: Any) -> list[dict]:
        """Every receipt matching `params`, following `next_cursor` to the last page."""
        out: list[dict] = []
        cursor = None
        for _ in range(10_000):
            body = self.page(org_id, **params, **({"cursor": cursor} if cursor else {}))
            out.extend(body["receipts"])
            cursor = body["next_cursor"]
            if cursor is None:
                return out
        pytest.fail("receipts: the cursor never ends", pytrace=False)

    def csv(self, org_id: str, **params: Any) -> httpx.Response:
        r = self.http.get(f"/orgs/{org_id}/receipts", params={**params, "format": "csv"})
        assert r.status_code == 200, f"GET receipts as CSV: {r.status_code} {r.text}"
        return r

    def summary(self, org_id: str, **params: Any) -> list[dict]:
        r = self.http.get(f"/orgs/{org_id}/receipts/summary", params=params)
        assert r.status_code == 200, f"GET receipts/summary: {r.status_code} {r.text}"
        body = r.json()
        assert set(body) == {"rows"} and isinstance(body["rows"], list), body
        return body["rows"]

    def prices(self) -> dict:
        r = self.http.get("/prices")
        assert r.status_code == 200, f"GET /prices: {r.status_code} {r.text}"
        body = r.json()
        assert isinstance(body.get("revision"), int) and isinstance(body.get("prices"), dict), body
        return body

    def price_revision(self) -> int:
        return self.prices()["revision"]

    def fallback_price(self, kind: str) -> Price:
        """The price in force for `kind`'s unpriced models."""
        fallback = self.prices()["fallback"][kind]
        return Price(fallback["input_per_mtok_usd"], fallback["output_per_mtok_usd"],
                     fallback.get("cached_input_per_mtok_usd"), fallback.get("cache_write_per_mtok_usd"))

    def put_price(self, model: str, price: Price) -> dict:
        body = {"input_per_mtok_usd": price.input, "output_per_mtok_usd": price.output}
        if price.cached is not None:
            body["cached_input_per_mtok_usd"] = price.cached
        if price.cache_write is not None:
            body["cache_write_per_mtok_usd"] = price.cache_write
        r = self.http.put(f"/prices/{model}", json=body)
        assert r.status_code == 200, f"PUT /prices/{model}: {r.status_code} {r.text}"
        return r.json()

    def pending(self) -> float:
        """The gateway's `recovea_receipts_pending`: receipts spooled and not yet delivered."""
        r = self.gateway.request("GET", "/metrics")
        assert r.status_code == 200, f"GET /metrics: {r.status_code}"
        m = re.search(r"^recovea_receipts_pending(?:\{[^}]*\})? (\S+)$", r.text, re.M)
        assert m, "no recovea_receipts_pending in /metrics"
        return float(m.group(1))

    def settle(self, org_id: str, key_id: str, request_ids: Iterable[str], also: Iterable[str] = (),
               deadline_s: float = RECEIPT_DEADLINE_S) -> dict[str, dict]:
        """Waits until the key has the receipt of every request in `request_ids` and `also` (the suite's
        own admitted probes) and the spool is empty, then checks that the key has exactly one receipt per
        such request and no other. Returns the receipts of `request_ids`, by request id."""
        wanted = list(request_ids)
        assert len(set(wanted)) == len(wanted), f"a request id was given twice: {wanted}"
        expected = set(wanted) | set(also)
        deadline = time.monotonic() + deadline_s
        while True:
            got = self.receipts(org_id, key_id=key_id)
            missing = expected - {r.get("request_id") for r in got}
            pending = self.pending() if not missing else None
            if not missing and pending == 0:
                break
            if time.monotonic() > deadline:
                pytest.fail(
                    f"key {key_id}: after {deadline_s}s, no receipt for {sorted(missing)} "
                    f"(spool pending: {pending}); the key has {[r.get('request_id') for r in got]}",
                    pytrace=False)
            time.sleep(0.05)
        got = self.receipts(org_id, key_id=key_id)
        rids = [r["request_id"] for r in got]
        dupes = sorted({x for x in rids if rids.count(x) > 1})
        assert not dupes, f"key {key_id}: more than one receipt for {dupes}"
        extra = sorted(set(rids) - expected)
        assert not extra, f"key {key_id}: receipts for requests it did not make or that were refused: " + \
            json.dumps([r for r in got if r["request_id"] in extra], indent=1)
        assert len(got) == len(expected), (len(got), len(expected))
        ids = [r["id"] for r in got]
        assert len(set(ids)) == len(ids), f"duplicate receipt ids: {ids}"
        for r in got:
            assert RECEIPT_FIELDS <= set(r), f"receipt lacks {RECEIPT_FIELDS - set(r)}: {r}"
            assert r["org_id"] == org_id and r["key_id"] == key_id, r
        by_rid = {r["request_id"]: r for r in got}
        return {rid: by_rid[rid] for rid in wanted}

    def settle_tenant(self, tenant: Tenant, request_ids: Iterable[str] = ()) -> dict[str, dict]:
        return self.settle(tenant.org_id, tenant.key_id, request_ids, also=tenant.probe_request_ids)


@pytest.fixture(scope="session")
def ledger(admin: Admin, gateway: Gateway) -> Ledger:
    return Ledger(admin, gateway)


def assert_receipt(receipt: dict, *, tenant: Tenant, request_id: str, provider: str, model: str | None,
                   endpoint: str, stream: bool, input_tokens: int, output_tokens: int, cached: int = 0,
                   cache_write: int = 0, reasoning: int = 0, status: int = 200, price: Price | None = None,
                   cost: str | None = None, priced: bool = True, usage_source: str = "provider",
                   price_revision: int | None = None, priced_as: str | None = None,
                   not_before: dt.datetime | None = None) -> None:
    """Every field of one receipt. `price` (default: the built-in price of `model`) gives the expected cost,
    unless `cost` is given (an unpriced receipt is costed at its kind's fallback price, which the caller gives)."""
    if cost is None:
        if price is None:
            assert priced, "an unpriced receipt's cost is its kind's fallback price: pass `price` or `cost`"
            price = BUILTIN_PRICES[model]
        cost = expected_cost(price, input_tokens, output_tokens, cached, cache_write)
    want = {
        "id": "rcpt_" + request_id.removeprefix("req_"),
        "request_id": request_id,
        "org_id": tenant.org_id,
        "key_id": tenant.key_id,
        "provider": provider,
        "model": model,
        "endpoint": endpoint,
        "status": status,
        "stream": stream,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cached_input_tokens": cached,
        "cache_write_input_tokens": cache_write,
        "reasoning_tokens": reasoning,
        "cost_usd": cost,
        "usage_source": usage_source,
        "priced": priced,
    }
    if price_revision is not None:
        want["price_revision"] = price_revision
    if priced_as is not None:
        want["priced_as"] = priced_as
    got = {k: receipt.get(k) for k in want}
    assert got == want, "receipt differs:\n" + "\n".join(
        f"  {k}: got {got[k]!r}, want {want[k]!r}" for k in want if got[k] != want[k]) + f"\nreceipt: {receipt}"
    assert USD_RE.match(receipt["cost_usd"]), receipt["cost_usd"]
    assert isinstance(receipt["price_revision"], int) and receipt["price_revision"] >= 0, receipt
    assert isinstance(receipt["node_id"], str) and receipt["node_id"], receipt
    started, finished = parse_time(receipt["started_at"]), parse_time(receipt["finished_at"])
    now = dt.datetime.now(dt.timezone.utc)
    assert started <= finished <= now + dt.timedelta(seconds=1), receipt
    if not_before is not None:
        assert started >= not_before - dt.timedelta(seconds=1), (receipt["started_at"], not_before)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# --------------------------------------------------------------------------------------------------
# Where the logs are, when something failed
# --------------------------------------------------------------------------------------------------

_SESSION_LOGS: dict[str, tuple[Path, Path]] = {}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if exitstatus != 0 and _SESSION_LOGS:
        terminalreporter.section("recovea sdk suite: process logs")
        for name, (out, err) in _SESSION_LOGS.items():
            terminalreporter.write_line(f"{name}: stdout {out}  stderr {err}")
            tail = _tail(err, 15)
            if tail.strip():
                terminalreporter.write_line(tail)
