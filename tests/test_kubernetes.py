"""Static checks of the Kubernetes example in docker/kubernetes, without a cluster: each KEDA
ScaledObject validates against KEDA's CRD schema (vendored; unknown fields refused, since the API
server would silently prune a misspelt one), scales an engine Deployment of the file between 0
and 1 replica, and follows blockq_desired_instances of that slot's model and GPU kind from the
fleet the file declares, at the slot's position among them."""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from domain.settings import Settings

KUBERNETES = Path(__file__).resolve().parent.parent / "docker" / "kubernetes"
MANIFESTS = sorted(KUBERNETES.glob("*.yaml"))
SCHEMA_FILE = KUBERNETES / "keda-scaledobject.schema.json"
QUERY = re.compile(r'^clamp\(max\(blockq_desired_instances\{model="(?P<model>[^"]+)",'
                   r'gpu_kind="(?P<kind>[^"]+)"\}\) - (?P<position>\d+), 0, 1\)$')


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with unknown fields refused wherever the CRD lists an object's fields."""
    schema = copy.deepcopy(schema)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if (node.get("type") == "object" and "properties" in node
                    and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    # NOTE: metadata is Kubernetes' ObjectMeta, which the CRD leaves open.
    schema["properties"]["metadata"].pop("additionalProperties", None)
    return schema


@cache
def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    schema.pop("$comment", None)
    return jsonschema.Draft7Validator(_strict(schema))


def test_there_is_an_example() -> None:
    assert MANIFESTS, "docker/kubernetes holds no manifest"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_engine_deployment_has_a_valid_scaled_object_on_its_slot(path: Path) -> None:
    docs = _documents(path)
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    fleet = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["BLOCKQ_FLEET"]
    settings = Settings(fleet=fleet, autoscale=True)
    slots = {slot.instance_id: slot for slot in settings.fleet_slots}
    engines = {name: d for (kind, name), d in kinds.items()
               if kind == "Deployment" and "ENGINE_QUEUE" in json.dumps(d)}
    assert len(engines) == len(slots), "one engine Deployment per fleet slot"

    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    for obj in scaled:
        errors = sorted(_validator().iter_errors(obj), key=str)
        assert not errors, f"{obj['metadata']['name']}: {[e.message for e in errors]}"
        spec = obj["spec"]
        target = spec["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment" and target["name"] in engines
        assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 1)
        deployment = engines[target["name"]]
        assert deployment["spec"]["replicas"] == 0
        pod = deployment["spec"]["template"]["spec"]
        container, = pod["containers"]
        queue = next(e["value"] for e in container["env"] if e["name"] == "ENGINE_QUEUE")
        slot = slots[queue]
        # Its drain: a warm shutdown as long as the local stack allows an engine.
        assert pod["terminationGracePeriodSeconds"] >= 180
        trigger, = spec["triggers"]
        assert trigger["type"] == "prometheus"
        match = QUERY.match(trigger["metadata"]["query"])
        assert match, trigger["metadata"]["query"]
        kind_slots = [s for s in settings.fleet_slots if s.entry_index == slot.entry_index]
        assert match["model"] == slot.spec.model and match["kind"] == slot.spec.gpu_kind
        assert int(match["position"]) == kind_slots.index(slot)
    assert {o["spec"]["scaleTargetRef"]["name"] for o in scaled} == set(engines)


def test_the_strict_schema_refuses_a_misspelt_field() -> None:
    obj = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
           "spec": {"scaleTargetRef": {"name": "x"}, "minReplicaCount": 0,
                    "maxReplicasCount": 1,
                    "triggers": [{"type": "prometheus", "metadata": {"query": "1"}}]}}
    assert any("maxReplicasCount" in e.message for e in _validator().iter_errors(obj))
