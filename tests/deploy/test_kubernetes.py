"""The Kubernetes manifests (deploy/kubernetes): each overlay renders with `kubectl kustomize`, passes
the Kubernetes API's schemas (kubernetes-validate, strict: no unknown field), and sets only flags
and environment variables that `recovea` has. Run by scripts/test-deploy."""

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
# The oldest Kubernetes the manifests are for: `preStop.sleep` is there from 1.30 on.
VERSION = "1.32.0"
BIN = os.environ.get("RECOVEA_BIN", str(ROOT / "target" / "debug" / "recovea"))


def render(path: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], check=True, capture_output=True, text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def validate(documents: list[dict], tmp_path: Path) -> subprocess.CompletedProcess:
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(documents))
    return subprocess.run(["kubernetes-validate", "--strict", "--quiet", "-k", VERSION, str(rendered)],
                          capture_output=True, text=True)


def containers(documents: list[dict]):
    for doc in documents:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []):
            yield doc, container


def help_of(subcommand: str) -> str:
    return subprocess.run([BIN, subcommand, "--help"], check=True, capture_output=True, text=True).stdout


def test_there_are_overlays() -> None:
    assert {"development", "production"} <= set(OVERLAYS), OVERLAYS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_and_passes_the_schemas(overlay: str, tmp_path: Path) -> None:
    documents = render(KUBERNETES / "overlays" / overlay)
    kinds = sorted(doc["kind"] for doc in documents)
    assert "HorizontalPodAutoscaler" in kinds and kinds.count("PodDisruptionBudget") == 2, kinds
    checked = validate(documents, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_validator_refuses_what_the_schemas_do_not_have(tmp_path: Path) -> None:
    # So that a pass above means something: an unknown field in a container fails.
    documents = render(KUBERNETES / "overlays" / "development")
    _, container = next(containers(documents))
    container["readinessProbes"] = container["readinessProbe"]
    checked = validate(documents, tmp_path)
    assert checked.returncode != 0, checked.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_flag_and_variable_set_exists(overlay: str) -> None:
    seen = 0
    for doc, container in containers(render(KUBERNETES / "overlays" / overlay)):
        subcommand, *flags = container["args"]
        known = help_of(subcommand)
        variables = set(re.findall(r"env:\s+(RECOVEA_[A-Z0-9_]+)", known))
        for env in container.get("env", []):
            assert env["name"] in variables, f"{doc['kind']}/{doc['metadata']['name']}: {env['name']}"
            seen += 1
        for flag in (f.split("=")[0] for f in flags if f.startswith("--")):
            assert re.search(rf"^\s+{re.escape(flag)}\b", known, re.M), f"{subcommand} has no {flag}"
    assert seen > 10


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_grace_fit_the_drain(overlay: str) -> None:
    for doc, container in containers(render(KUBERNETES / "overlays" / overlay)):
        pod = doc["spec"]["template"]["spec"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        # The node's drain takes at most 30 s (crates/gateway/src/server.rs DRAIN_TIMEOUT).
        assert pod["terminationGracePeriodSeconds"] > pre_stop + 30, doc["metadata"]["name"]
        assert pod["securityContext"]["runAsUser"] == 10001 and pod["securityContext"]["runAsNonRoot"]
        secrets = [e for e in container["env"] if "valueFrom" in e]
        assert secrets and all(e["valueFrom"]["secretKeyRef"]["name"] == "recovea" for e in secrets)


def test_the_persistent_spool_keeps_the_base_pod() -> None:
    base = {doc["kind"]: doc for doc in render(KUBERNETES / "base") if doc["metadata"]["name"] == "recovea-node"}
    production = {doc["kind"]: doc for doc in render(KUBERNETES / "overlays" / "production")
                  if doc["metadata"]["name"] == "recovea-node"}
    assert "Deployment" not in production and production["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"][
        "kind"] == "StatefulSet"
    pod = dict(base["Deployment"]["spec"]["template"]["spec"])
    del pod["volumes"]
    kept = production["StatefulSet"]["spec"]["template"]["spec"]
    for container in kept["containers"]:
        container["image"] = "recovea:0.1.0"  # the overlay's registry
    assert kept == pod
    claim = production["StatefulSet"]["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["name"] == "data"
