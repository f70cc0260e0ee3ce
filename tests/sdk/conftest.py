"""Session fixtures for the black-box SDK suite.

One mock provider (`recovea-mock-provider`) and one gateway (`recovea serve`) are started for the whole
session, on free local ports, with a temporary data dir and a fixed admin token. Every test makes its own
organization, keys and credentials (unique names), so tests are independent; the mock's request log is
never reset mid-run: a test takes a marker (the log's length) before its calls and reads what came after.

Binaries: `RECOVEA_BIN` and `MOCK_PROVIDER_BIN`, defaulting to `target/debug/recovea` and
`target/debug/recovea-mock-provider` under the repository root. A missing binary fails the session.
"""

from __future__ import annotations

import json
import os
import queue
import re
import secrets
import signal
import socket
import string
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binary(env_var: str, default: str) -> Path:
    raw = os.environ.get(env_var, default)
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
    binary = _binary("MOCK_PROVIDER_BIN", "target/debug/recovea-mock-provider")
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


@pytest.fixture(scope="session")
def gateway(mock_provider: MockProvider, tmp_path_factory) -> Iterable[Gateway]:
    binary = _binary("RECOVEA_BIN", "target/debug/recovea")
    workdir = tmp_path_factory.mktemp("gateway")
    data_dir = workdir / "data"
    data_dir.mkdir()
    out_log, err_log = workdir / "stdout.log", workdir / "stderr.log"
    p1, p2 = free_port(), free_port()
    while p2 == p1:
        p2 = free_port()
    url, admin_url = f"http://127.0.0.1:{p1}", f"http://127.0.0.1:{p2}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVEA_")}
    env.setdefault("RUST_LOG", "info")
    cmd = [
        str(binary), "serve",
        "--listen", f"127.0.0.1:{p1}",
        "--admin-listen", f"127.0.0.1:{p2}",
        "--data-dir", str(data_dir),
        "--admin-token", ADMIN_TOKEN,
        "--openai-base-url", mock_provider.url,
        "--anthropic-base-url", mock_provider.url,
    ]
    with open(err_log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env)
    threading.Thread(target=_pump, args=(proc.stdout, out_log, None), daemon=True).start()
    _SESSION_LOGS["gateway"] = (out_log, err_log)
    gw = Gateway(url, admin_url, mock_provider.url, proc, (out_log, err_log))
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        ready_gw = ready_admin = False
        last = "no answer"
        while not (ready_gw and ready_admin):
            if proc.poll() is not None:
                pytest.fail(f"recovea serve exited with {proc.returncode}:\n{gw.log_tail()}", pytrace=False)
            if time.monotonic() > deadline:
                pytest.fail(f"recovea serve not ready after {STARTUP_DEADLINE_S}s ({last}):\n{gw.log_tail()}",
                            pytrace=False)
            try:
                if not ready_gw:
                    r = httpx.get(f"{url}/readyz", timeout=1)
                    ready_gw = r.status_code == 200
                    last = f"/readyz {r.status_code}"
                if ready_gw and not ready_admin:
                    r = httpx.get(f"{admin_url}/admin/v1/orgs", timeout=1,
                                  headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
                    ready_admin = r.status_code == 200
                    last = f"GET /admin/v1/orgs {r.status_code}"
            except httpx.TransportError as e:
                last = repr(e)
            if not (ready_gw and ready_admin):
                time.sleep(0.05)
        yield gw
    finally:
        gw.http.close()
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
               deadline_s: float = PROPAGATION_DEADLINE_S) -> httpx.Response:
    """Probes the route until `want(response)`, failing after `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        r = probe(gateway, secret, route)
        if want(r):
            return r
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: still {r.status_code} {r.text!r} after {deadline_s}s", pytrace=False)
        time.sleep(0.05)


def wait_admitted(gateway: Gateway, secret: str, route: str, configured: bool = True) -> httpx.Response:
    """Polls until the gateway knows the key (and, if `configured`, the route's credential)."""
    if configured:
        return wait_until(gateway, secret, route, lambda r: refusal_code(r) is None,
                          f"key and {route} credential reaching the gateway")
    return wait_until(gateway, secret, route, lambda r: refusal_code(r) != "invalid_api_key",
                      "key reaching the gateway")


def wait_refused(gateway: Gateway, secret: str, route: str = "openai",
                 deadline_s: float = PROPAGATION_DEADLINE_S) -> httpx.Response:
    return wait_until(gateway, secret, route, lambda r: refusal_code(r) == "invalid_api_key",
                      "key refused by the gateway", deadline_s)


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
        wait_admitted(gateway, tenant.secret, "openai", configured=openai)
        wait_admitted(gateway, tenant.secret, "anthropic", configured=anthropic)
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


@pytest.fixture(autouse=True)
def _no_sdk_environment(monkeypatch):
    """The SDKs read keys and URLs from the environment; the suite passes everything explicitly."""
    for name in list(os.environ):
        if name.startswith(("OPENAI_", "ANTHROPIC_")):
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


def assert_request_id(headers: Any) -> None:
    rid = headers.get("x-request-id")
    assert rid, f"no x-request-id in {dict(headers)}"


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
