"""Render a checked spec into documents and files: plain dicts, one module per concern, YAML out.

Layout of the output folder (``--out``, default ``./out/eks-<name>``)::

    cluster.yaml                   eksctl ClusterConfig (eksctl create cluster -f cluster.yaml)
    manifests/NN-<concern>.yaml    Kubernetes manifests, applied in file order
    helm/<chart>-values.yaml       values for the add-on charts the manifests rely on
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.eks import (autoscaling, cluster, edge, gateway, karpenter, monitoring, rayservice,
                       workload)
from infra.eks.spec import EksSpec, ResolvedSpec, pinned_versions, resolve


@dataclass
class Manifest:
    file: str               # "manifests/20-server.yaml"
    doc: dict[str, Any]

    @property
    def ref(self) -> str:
        meta = self.doc["metadata"]
        ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
        return f"{self.doc['kind']}/{ns}{meta['name']}"


@dataclass
class Rendered:
    resolved: ResolvedSpec
    cluster_config: dict[str, Any]
    manifests: list[Manifest]
    helm_values: dict[str, dict[str, Any]] = field(default_factory=dict)

    def documents(self) -> list[dict[str, Any]]:
        return [m.doc for m in self.manifests]

    def files(self) -> dict[str, str]:
        """Relative path -> YAML text, for every file of the output folder."""
        out = {"cluster.yaml": dump_yaml([self.cluster_config])}
        grouped: dict[str, list[dict[str, Any]]] = {}
        for m in self.manifests:
            grouped.setdefault(m.file, []).append(m.doc)
        out.update({name: dump_yaml(docs) for name, docs in sorted(grouped.items())})
        out.update({f"helm/{chart}-values.yaml": dump_yaml([values])
                    for chart, values in sorted(self.helm_values.items())})
        return out

    def write(self, out_dir: str | Path) -> list[Path]:
        """Write the folder; files this spec no longer renders are removed (stale manifests
        in a folder someone applies with ``kubectl apply -f`` would be applied too)."""
        out_dir = Path(out_dir)
        texts = self.files()
        for sub in ("manifests", "helm"):
            folder = out_dir / sub
            if folder.is_dir():
                for old in folder.glob("*.yaml"):
                    if f"{sub}/{old.name}" not in texts:
                        old.unlink()
        written = []
        for rel, text in texts.items():
            path = out_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
        return written

    def gpu_count(self, replicas: int) -> int:
        return replicas * self.resolved.gpus_per_replica

    def required_charts(self) -> list[dict[str, Any]]:
        """The add-on charts these manifests need in the cluster, in install order."""
        r = self.resolved
        wanted = ["kube-prometheus-stack"]
        if r.gpu_nodes == "karpenter":
            wanted.insert(0, "nvidia-device-plugin")   # node groups get it from eksctl
        if r.engine == "deployment":
            wanted.append("prometheus-adapter")
        else:
            wanted.append("kuberay-operator")
        wanted.append("envoy-gateway" if r.edge == "gateway" else "ingress-nginx")
        charts = {c["name"]: c for c in pinned_versions()["charts"]}
        return [charts[n] for n in wanted]


def render(spec: EksSpec | ResolvedSpec) -> Rendered:
    """Check the spec (BadInput before anything is rendered), then render every document."""
    r = spec if isinstance(spec, ResolvedSpec) else resolve(spec)
    manifests = [Manifest("manifests/00-namespace.yaml", workload.namespace(r))]
    if r.gpu_nodes == "karpenter":
        manifests += [Manifest("manifests/10-gpu-nodes.yaml", karpenter.ec2_node_class(r)),
                      Manifest("manifests/10-gpu-nodes.yaml", karpenter.node_pool(r))]
    helm_values: dict[str, dict[str, Any]] = {}
    if r.engine == "deployment":
        manifests += [Manifest("manifests/20-server.yaml", doc) for doc in (
            workload.service_account(r), workload.deployment(r), workload.service(r),
            workload.pod_disruption_budget(r), workload.network_policy(r))]
        manifests.append(Manifest("manifests/30-autoscaling.yaml",
                                  autoscaling.horizontal_pod_autoscaler(r)))
        helm_values["prometheus-adapter"] = autoscaling.prometheus_adapter_values(r)
    else:
        if r.lora:   # the GPU workers' identity for reading the adapters from S3
            manifests.append(Manifest("manifests/20-rayservice.yaml", workload.service_account(r)))
        manifests += [Manifest("manifests/20-rayservice.yaml", rayservice.ray_service(r)),
                      Manifest("manifests/20-rayservice.yaml", workload.network_policy(r))]
    if r.gateway:
        manifests += [Manifest("manifests/25-gateway.yaml", doc)
                      for doc in gateway.gateway_documents(r)]
    manifests += [Manifest("manifests/40-edge.yaml", doc) for doc in edge.edge_documents(r)]
    manifests += [Manifest("manifests/50-monitoring.yaml", doc)
                  for doc in monitoring.monitoring_documents(r)]
    return Rendered(r, cluster.cluster_config(r), manifests, helm_values)


class _Dumper(yaml.SafeDumper):
    """Block style that yamllint's default rules accept: indented sequences, `|` for text."""

    def increase_indent(self, flow: bool = False, indentless: bool = False):
        return super().increase_indent(flow, False)


def _str_representer(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_representer)


def dump_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, explicit_start=True,
                         default_flow_style=False, width=4096, allow_unicode=True)
