"""deploy/k8s: every overlay renders, validates against the Kubernetes schemas offline, keeps the
security invariants, and runs only perfsweep command lines the real CLI accepts.

``kubectl kustomize`` (Debian's ``kubectl``) renders; ``kubernetes-validate`` checks each object
against the schemas of ``K8S_VERSION`` without a cluster. The invariant checks themselves are
tested on planted bad objects (``test_checks_catch_*``), so a check that stops checking fails.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.deploy import manifests as m

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate not installed (pip install -e '.[test]')"
)

#: Native sidecars (initContainers with restartPolicy: Always) are on by default since 1.29.
K8S_VERSION = "1.32"
OVERLAYS = m.overlays()

KUBECTL_MISSING = m.kubectl_missing()
needs_kubectl = pytest.mark.skipif(KUBECTL_MISSING is not None, reason=str(KUBECTL_MISSING))


@pytest.fixture(scope="module")
def rendered(spawns: None) -> dict[str, list[dict[str, Any]]]:
    if KUBECTL_MISSING is not None:
        pytest.skip(KUBECTL_MISSING)
    return {p.name: m.render(p) for p in OVERLAYS}


def test_every_overlay_is_found() -> None:
    assert {p.name for p in OVERLAYS} >= {
        "sweep",
        "sweep-parallel",
        "sweep-external-db",
        "load",
        "dashboard",
        "dashboard-login",
    }


@needs_kubectl
@pytest.mark.parametrize("overlay", [p.name for p in OVERLAYS])
def test_overlay_validates_and_keeps_invariants(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    objects = rendered[overlay]
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert m.problems(objects) == []


def _parse(argv: list[str]) -> Any:
    """Parse ``perfsweep ARGV`` with the real CLI (types, choices, unknown flags), run nothing.

    Returns the command's click context (``.info_name``, ``.params``); a flag the CLI does not
    know or a value it refuses raises its usage error. (typer >= 0.29 vendors click, so this
    goes through typer's own command objects, not the ``click`` package.)
    """
    from analyzer.cli import app

    group: Any = typer.main.get_command(app)
    name, *rest = argv
    command = group.commands.get(name)
    assert command is not None, f"no perfsweep command {name!r}"
    return command.make_context(name, rest)


@needs_kubectl
def test_every_perfsweep_command_parses_with_the_cli(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    seen: set[str] = set()
    for overlay, objects in rendered.items():
        for container, argv in m.perfsweep_commands(objects):
            assert not any("$(" in a for a in argv), f"{overlay} {container.name}: {argv}"
            ctx = _parse(argv)
            seen.add(str(ctx.info_name))
            if ctx.info_name == "run":
                _check_run(container, argv, objects)
    assert seen == {"run", "load", "ui"}


def _check_run(container: m.Container, argv: list[str], objects: list[dict[str, Any]]) -> None:
    """The sweep's scenario (from its ConfigMap) plus its PERFSWEEP_* env load as one study."""
    from analyzer.config.scenario import load_scenario

    mounts = {v["mountPath"]: v["name"] for v in container.spec.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in container.pod.get("volumes") or []}
    run_dir = Path(str(m.flag(argv, "--run-dir")))
    assert "persistentVolumeClaim" in volumes[mounts["/" + run_dir.parts[1]]], (
        "run dir not on a PVC"
    )
    if m.flag(argv, "--scenario") is None:  # goals from flags, a journal in the run directory
        return
    scenario_path = Path(str(m.flag(argv, "--scenario")))
    configmap_name = volumes[mounts[str(scenario_path.parent)]]["configMap"]["name"]
    (configmap,) = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == configmap_name
    ]
    env = m.container_env(container, objects)

    def load(tmp: Path) -> Any:
        path = tmp / scenario_path.name
        path.write_text(configmap["data"][scenario_path.name])
        return load_scenario(path, {"model.name": m.flag(argv, "--model")}, env=env)

    with tempfile.TemporaryDirectory() as tmp:
        scenario = load(Path(tmp))
    assert scenario.run.storage == m.SECRET_PLACEHOLDERS["url"]
    assert scenario.run.study_name and scenario.run.study_name in str(run_dir)


@needs_kubectl
@pytest.mark.parametrize("overlay", ["load", "sweep-distributed"])
def test_load_master_expects_every_worker(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    objects = rendered[overlay]
    commands = {c.owner: argv for c, argv in m.perfsweep_commands(objects)}
    parsed = _parse(commands["Job/perfsweep-load"])
    master = parsed.params
    worker = _parse(commands["Deployment/perfsweep-load-worker"]).params
    # `perfsweep load --master` measures; `perfsweep run --expect-workers` sweeps as the master.
    assert master.get("master") or parsed.info_name == "run", parsed.info_name
    assert worker["worker"]
    (deployment,) = [o for o in objects if o["metadata"]["name"] == "perfsweep-load-worker"]
    assert master["expect_workers"] == deployment["spec"]["replicas"]
    (service,) = [
        o
        for o in objects
        if o["kind"] == "Service" and o["metadata"]["name"] == worker["master_host"]
    ]
    assert [p["port"] for p in service["spec"]["ports"]] == [worker["master_port"]]
    assert master["master_port"] == worker["master_port"]


@needs_kubectl
def test_parallel_sweep_pairs_each_worker_with_its_own_triton(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    (job,) = [o for o in rendered["sweep-parallel"] if o["kind"] == "Job"]
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 4
    pod = job["spec"]["template"]["spec"]
    (sidecar,) = pod["initContainers"]
    assert (
        sidecar["restartPolicy"] == "Always" and "--model-control-mode=explicit" in sidecar["args"]
    )
    (sweep,) = pod["containers"]
    assert sweep["args"][sweep["args"].index("--url") + 1] == "http://127.0.0.1:8000"
    assert "postgres" not in {o["metadata"]["name"] for o in rendered["sweep-external-db"]}


# ---- the checks themselves, on planted bad objects ------------------------------------------


def _pod(**container: Any) -> dict[str, Any]:
    base = {
        "name": "c",
        "image": "x",
        "command": ["perfsweep", "load"],
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True},
    }
    base.update(container)
    return {
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "d"}},
                "spec": {"containers": [base]},
            }
        },
    }


def test_checks_accept_a_good_pod() -> None:
    assert m.problems([_pod()]) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {
                "securityContext": {
                    "privileged": True,
                    "allowPrivilegeEscalation": False,
                    "runAsNonRoot": True,
                }
            },
            "privileged",
        ),
        ({"securityContext": {"runAsNonRoot": True}}, "allowPrivilegeEscalation is not false"),
        ({"securityContext": {"allowPrivilegeEscalation": False}}, "runAsNonRoot is not set"),
        ({"resources": {"requests": {"cpu": "1"}}}, "no memory request"),
        (
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {m.GPU: 1}}},
            "on a container that is not Triton",
        ),
        ({"command": ["tritonserver"]}, "Triton without a nvidia.com/gpu limit"),
        (
            {"command": ["perfsweep"], "args": ["ui", "--web-host", "0.0.0.0"]},
            "without --web-login",
        ),
        (
            {
                "command": ["perfsweep"],
                "args": ["ui", "--web-host", "0.0.0.0", "--web-login"],
                "env": [{"name": "PERFSWEEP_UI_PASSWORD", "value": "hunter2"}],
            },
            "password not from a Secret",
        ),
    ],
)
def test_checks_catch_bad_containers(change: dict[str, Any], expected: str) -> None:
    found = m.problems([_pod(**change)])
    assert any(expected in p for p in found), found


def test_checks_catch_exposure() -> None:
    service = {
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"type": "NodePort", "selector": {"app": "d"}},
    }
    ui = _pod(command=["perfsweep", "ui"], args=["--web-host", "127.0.0.1"])
    found = m.problems([ui, service, {"kind": "Ingress", "metadata": {"name": "i"}}])
    assert any("type NodePort" in p for p in found)
    assert any("serves on loopback only" in p for p in found)
    assert any(p.startswith("Ingress/i") for p in found)
    host = copy.deepcopy(_pod())
    host["spec"]["template"]["spec"]["hostNetwork"] = True
    assert any("hostNetwork" in p for p in m.problems([host]))


def test_expand_follows_kubernetes() -> None:
    objects = [{"kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"MODEL": "m1"}}]
    pod = _pod(
        args=["--model", "$(MODEL)", "--x", "$(NOPE)", "/runs/$(STUDY)-$(IDX)"],
        env=[
            {"name": "MODEL", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "MODEL"}}},
            {"name": "STUDY", "value": "s-$(MODEL)"},
            {"name": "IDX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
    )
    ((_, argv),) = m.perfsweep_commands([pod, *objects])
    assert argv == ["load", "--model", "m1", "--x", "$(NOPE)", "/runs/s-m1-0"]
