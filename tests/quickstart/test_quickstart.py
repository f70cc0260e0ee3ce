"""docs/quickstart.md, run as a reader would run it: every shell block marked
`<!-- quickstart-test: run -->` in order in one bash session, each block marked
`<!-- quickstart-test: background "TEXT" -->` started in the background (a terminal of its own) and
waited for until it prints TEXT. The keyless path: the mock provider stands in for OpenAI and
Anthropic. Two changes, so that the test command builds nothing more: the debug build the tests
already made stands in for the release build (`--release` and `target/release` become the debug
ones), and the state goes to a temporary `RECOVEA_DATA_DIR` rather than `./recovea-data`.
Run by scripts/test-quickstart, from the repository's root, with the ports the page names
(8080, 8081, 9901) free."""

import os
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "quickstart.md"
MARKED = re.compile(r'<!-- quickstart-test: (.*?) -->\n```sh\n(.*?)```', re.S)


def debug_build(block: str) -> str:
    return block.replace("cargo build --release", "cargo build").replace("target/release", "target/debug")


def script(page: str, logs: Path) -> str:
    lines = ["set -euo pipefail", "pids=()", 'trap \'kill "${pids[@]}" 2>/dev/null || true; wait\' EXIT']
    for n, (directive, block) in enumerate(MARKED.findall(page)):
        block = debug_build(block)
        if directive.startswith("background"):
            ready = re.fullmatch(r'background "(.+)"', directive).group(1)
            log = logs / f"{n}.log"
            lines += [
                f"( {block.strip()}\n) >'{log}' 2>&1 &",
                "pids+=($!)",
                f"for _ in $(seq 300); do grep -q '{ready}' '{log}' && break; sleep 0.1; done",
                f"grep -q '{ready}' '{log}' || {{ echo 'never ready: {ready}'; cat '{log}'; exit 1; }}",
            ]
        else:
            for old, new in re.findall(r'with "(.+?)" as "(.+?)"', directive):
                block = block.replace(old, new)
            lines.append(block)
    return "\n".join(lines) + "\n"


def test_the_quickstart_runs_as_written_on_the_mock_provider() -> None:
    page = PAGE.read_text()
    blocks = MARKED.findall(page)
    assert len(blocks) >= 10, "the page's steps are marked for this test"
    with tempfile.TemporaryDirectory() as temp:
        temp = Path(temp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RECOVEA_", "OPENAI_", "ANTHROPIC_"))}
        env["RECOVEA_DATA_DIR"] = str(temp / "recovea-data")
        run = subprocess.run(["bash", "-c", script(page, temp)], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)
        out = run.stdout
        assert run.returncode == 0, f"{out}\n{run.stderr}"
    # Each request through the gateway came back from the mock: curl to OpenAI and Anthropic, the
    # named route, bring your own key, and the two SDKs.
    assert out.count("This is a mock response.") >= 6, out
    # Step 7: the receipts of those requests, their summary, an armed cap and its spend.
    assert '"receipts"' in out and '"hard_stop": true' in out and '"spend"' in out, out
