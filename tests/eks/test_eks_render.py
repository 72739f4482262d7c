"""Every rendered document validates across a matrix of specs, and every validator can fail."""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from infra.eks import validate as v
from infra.eks.render import render
from infra.eks.spec import EksSpec

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0"

# (instance, GPUs per replica, tensor parallel, engine, edge, GPU nodes)
MATRIX = [
    ("g5.xlarge", 1, 1, "deployment", "gateway", "karpenter"),
    ("g5.12xlarge", 4, 4, "deployment", "nginx", "karpenter"),
    ("g5.12xlarge", 4, 2, "rayservice", "gateway", "nodegroup"),
    ("g5.12xlarge", 1, 1, "deployment", "gateway", "nodegroup"),
    ("g6e.xlarge", 1, 1, "rayservice", "nginx", "karpenter"),
    ("g6e.12xlarge", 4, 1, "deployment", "gateway", "karpenter"),
    ("g6e.12xlarge", 4, 4, "rayservice", "gateway", "karpenter"),
    ("p4d.24xlarge", 4, 2, "deployment", "nginx", "nodegroup"),
    ("p4d.24xlarge", 1, 1, "rayservice", "gateway", "karpenter"),
    ("p4d.24xlarge", 4, 4, "deployment", "gateway", "karpenter"),
]


def spec_for(instance, gpus, tp, engine, edge, nodes, **kw) -> EksSpec:
    return EksSpec(image=IMAGE, instance_type=instance, gpus_per_replica=gpus,
                   tensor_parallel_size=tp, engine=engine, edge=edge, gpu_nodes=nodes,
                   max_model_len=8192, min_replicas=2, max_replicas=6,
                   capacity_type="spot" if nodes == "nodegroup" else "on-demand",
                   options=(("SM_VLLM_GPU_MEMORY_UTILIZATION", "0.9"),), **kw)


@pytest.fixture(autouse=True)
def _needs_schemas(schemas):
    """Every test here validates against the upstream schemas."""


@pytest.fixture(scope="module")
def rendered_matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    out = []
    for i, row in enumerate(MATRIX):
        rendered = render(spec_for(*row))
        folder = root / f"case{i}"
        rendered.write(folder)
        out.append((row, rendered, folder))
    return root, out


@pytest.mark.parametrize("index", range(len(MATRIX)), ids=["-".join(map(str, r)) for r in MATRIX])
def test_every_document_validates(rendered_matrix, index):
    _, cases = rendered_matrix
    row, rendered, folder = cases[index]
    report = v.validate_rendered(rendered, folder, run_checkov=False)
    assert report.complete, report.findings()
    counts = {c.name.split(" ")[0]: c.checked for c in report.checks}
    engine = row[3]
    assert counts["kubernetes-validate"] >= 2          # namespace, network policy, ...
    assert counts["eksctl"] == 1
    assert counts["yamllint"] == len(rendered.files())
    assert counts["Ray"] == (1 if engine == "rayservice" else 0)
    assert counts["CRD"] == (row[5] == "karpenter") * 2 + (engine == "rayservice")


def test_checkov_has_no_unskipped_failures(rendered_matrix):
    root, cases = rendered_matrix
    check = v.check_checkov(root)
    assert check.status == v.PASSED, (check.findings, check.note)
    assert check.checked >= 40                          # resources checkov looked at
    assert check.skipped and all(": (no reason)" not in s for s in check.skipped)
    from infra.eks.rayservice import HEAD_SKIPS

    deployment_skips = {s.split()[0] for s in check.skipped if ".llm-" not in s}
    assert deployment_skips == {"CKV_K8S_35", "CKV_K8S_43"}
    # RayService pods (checkov skips custom kinds, so the validator hands it their templates).
    ray_skips = {s.split()[0] for s in check.skipped if "Pod.spectrum.llm-head" in s}
    assert ray_skips == set(HEAD_SKIPS)
    assert any("Pod.spectrum.llm-gpu" in s for s in check.skipped)


def docs_by_kind(rendered):
    return {m.doc["kind"]: m.doc for m in rendered.manifests}


def test_server_workload_follows_the_image_contract():
    rendered = render(spec_for("g5.12xlarge", 4, 2, "deployment", "gateway", "karpenter"))
    dep = docs_by_kind(rendered)["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_MODEL_ID"]["value"] == "Qwen/Qwen2.5-7B-Instruct"
    assert env["SM_NUM_GPUS"]["value"] == "4"
    assert env["SM_VLLM_TENSOR_PARALLEL_SIZE"]["value"] == "2"
    assert env["SM_VLLM_PIPELINE_PARALLEL_SIZE"]["value"] == "2"
    assert env["SM_VLLM_MAX_MODEL_LEN"]["value"] == "8192"
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "hf-token", "key": "token", "optional": True}}}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"        # a string quantity
    assert c["ports"][0]["containerPort"] == 8080
    assert c["readinessProbe"]["httpGet"]["path"] == "/ping"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert pod["terminationGracePeriodSeconds"] > 300
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert docs_by_kind(rendered)["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    pool = docs_by_kind(rendered)["NodePool"]
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "24"}     # 6 replicas x 4 GPUs
    reqs = {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}
    assert reqs["karpenter.k8s.aws/instance-family"] == ["g5"]
    assert reqs["karpenter.k8s.aws/instance-size"] == ["12xlarge"]


def test_classic_hpa_example_from_flags():
    from infra.eks.spec import resolve

    r = resolve(EksSpec(image=IMAGE, min_replicas=3, max_replicas=15, target_cpu=70,
                        edge="nginx", rate_limit_rps=50))
    docs = docs_by_kind(render(r))
    hpa = docs["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 15)
    assert {"type": "Resource", "resource": {"name": "cpu", "target": {
        "type": "Utilization", "averageUtilization": 70}}} in hpa["metrics"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "vllm_num_requests_waiting"
    notes = docs["Ingress"]["metadata"]["annotations"]
    assert notes["nginx.ingress.kubernetes.io/limit-rps"] == "50"
    assert notes["nginx.ingress.kubernetes.io/limit-burst-multiplier"] == "5"
    assert notes["nginx.ingress.kubernetes.io/proxy-body-size"] == "8m"
    assert any("ingress-nginx is retired" in w for w in r.warnings)


def test_rayservice_runs_the_byo_application_with_the_servers_settings_by_default():
    rendered = render(spec_for("g6e.12xlarge", 4, 2, "rayservice", "gateway", "karpenter"))
    ray = docs_by_kind(rendered)["RayService"]
    app = yaml.safe_load(ray["spec"]["serveConfigV2"])["applications"][0]
    assert app["import_path"] == "byo_vllm.ray_serve:build_app"
    assert app["args"]["settings"] == {
        "SM_NUM_GPUS": "4", "SM_VLLM_TENSOR_PARALLEL_SIZE": "2",
        "SM_VLLM_PIPELINE_PARALLEL_SIZE": "2", "SM_VLLM_MAX_MODEL_LEN": "8192",
        "SM_VLLM_ENABLE_PREFIX_CACHING": "true", "SM_VLLM_GPU_MEMORY_UTILIZATION": "0.9"}
    assert app["args"]["engine_num_gpus"] == 4
    assert app["args"]["autoscaling_config"]["max_replicas"] == 6
    cluster = ray["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == "2.60.0"
    images = {c["image"] for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
              for c in group["template"]["spec"]["containers"]}
    assert images == {IMAGE}, "the project's serving image, not Ray's LLM image"
    assert "HorizontalPodAutoscaler" not in docs_by_kind(rendered)


def test_serve_app_ray_llm_keeps_build_openai_app_with_the_same_settings():
    rendered = render(spec_for("g6e.12xlarge", 4, 2, "rayservice", "gateway", "karpenter",
                               serve_app="ray-llm"))
    ray = docs_by_kind(rendered)["RayService"]
    config = yaml.safe_load(ray["spec"]["serveConfigV2"])
    app = config["applications"][0]
    assert app["import_path"] == "ray.serve.llm:build_openai_app"
    llm = app["args"]["llm_configs"][0]
    assert llm["engine_kwargs"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 2,
                                    "max_model_len": 8192, "gpu_memory_utilization": 0.9,
                                    "enable_prefix_caching": True}
    assert llm["accelerator_type"] == "L40S"
    assert llm["deployment_config"]["autoscaling_config"]["max_replicas"] == 6
    assert "HorizontalPodAutoscaler" not in docs_by_kind(rendered)


def test_no_secret_value_anywhere_and_no_stale_files(tmp_path):
    rendered = render(spec_for("g5.xlarge", 1, 1, "deployment", "nginx", "karpenter"))
    rendered.write(tmp_path)
    (tmp_path / "manifests" / "99-stale.yaml").write_text("---\nkind: Old\n")
    render(spec_for("g5.xlarge", 1, 1, "deployment", "gateway", "karpenter")).write(tmp_path)
    names = sorted(p.name for p in (tmp_path / "manifests").glob("*.yaml"))
    assert "99-stale.yaml" not in names and "40-edge.yaml" in names
    text = json.dumps(rendered.documents())
    assert '"HF_TOKEN", "value"' not in text


# --- each validator catches a deliberately broken manifest ---------------------------------

@pytest.fixture(scope="module")
def base():
    return render(spec_for("g5.12xlarge", 4, 2, "rayservice", "gateway", "karpenter",
                           serve_app="ray-llm"))


@pytest.fixture(scope="module")
def base_deployment():
    return render(spec_for("g5.xlarge", 1, 1, "deployment", "gateway", "karpenter"))


def broken(rendered, kind, mutate):
    docs = []
    for m in rendered.manifests:
        doc = copy.deepcopy(m.doc)
        if doc["kind"] == kind:
            mutate(doc)
        docs.append((m.file, doc))
    return docs


def failures(check):
    assert check.status == v.FAILED, "the broken manifest passed"
    return " | ".join(map(str, check.findings))


def test_kubernetes_validate_catches_unknown_field_and_unknown_kind(base_deployment):
    docs = broken(base_deployment, "Deployment", lambda d: d["spec"].update(replica=2))
    assert "replica" in failures(v.check_builtin_kinds(docs, "1.34", v.schema_dir()))
    docs = [("x.yaml", {"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w"}})]
    assert "unknown kind" in failures(v.check_builtin_kinds(docs, "1.34", v.schema_dir()))
    docs = broken(base_deployment, "Deployment", lambda d: d["spec"]["template"]["spec"][
        "containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": [1]}))
    assert "nvidia.com/gpu" in failures(v.check_builtin_kinds(docs, "1.34", v.schema_dir()))


def test_crd_schema_catches_unknown_and_mistyped_fields(base):
    docs = broken(base, "NodePool", lambda d: d["spec"]["template"]["spec"].update(requirement=[]))
    assert "requirement" in failures(v.check_crd_kinds(docs, v.schema_dir()))
    docs = broken(base, "RayService", lambda d: d["spec"]["rayClusterConfig"][
        "workerGroupSpecs"][0].update(maxReplicas="six"))
    assert "maxReplicas" in failures(v.check_crd_kinds(docs, v.schema_dir()))


def test_cel_hand_checks(base):
    docs = broken(base, "EC2NodeClass", lambda d: d["spec"].update(instanceProfile="p"))
    assert "exactly one of ['role', 'instanceProfile']" in failures(v.check_crd_kinds(docs, v.schema_dir()))

    def empty_in(d):
        d["spec"]["template"]["spec"]["requirements"][0]["values"] = []
    assert "operator 'In' must have a value" in failures(v.check_crd_kinds(broken(base, "NodePool", empty_in), v.schema_dir()))

    def bad_label(d):
        d["spec"]["template"]["spec"]["requirements"][0]["key"] = "karpenter.k8s.aws/instance-gpus"
    assert "label domain 'karpenter.k8s.aws' is restricted" in failures(
        v.check_crd_kinds(broken(base, "NodePool", bad_label), v.schema_dir()))


def test_serve_config_model_catches_bad_contents(base):
    def tp_too_big(d):
        config = yaml.safe_load(d["spec"]["serveConfigV2"])
        config["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]["tensor_parallel_size"] = 8
        d["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    assert "needs 16 GPUs" in failures(v.check_serve_configs(broken(base, "RayService", tp_too_big)))

    def misspelt(d):
        d["spec"]["serveConfigV2"] = d["spec"]["serveConfigV2"].replace("import_path", "importpath")
    assert "importpath" in failures(v.check_serve_configs(broken(base, "RayService", misspelt)))


def test_rays_own_schema_and_the_byo_builder_check_each_serve_config():
    byo = render(spec_for("g5.12xlarge", 4, 2, "rayservice", "gateway", "karpenter"))
    docs = [(m.file, m.doc) for m in byo.manifests]
    assert v.check_ray_serve_configs(docs).status == v.PASSED

    def edit(change):
        def mutate(d):
            config = yaml.safe_load(d["spec"]["serveConfigV2"])
            change(config["applications"][0])
            d["spec"]["serveConfigV2"] = yaml.safe_dump(config)
        return failures(v.check_ray_serve_configs(broken(byo, "RayService", mutate)))

    assert "invalid import path" in edit(lambda app: app.update(import_path="byo_vllm"))
    assert "'replicas' is not an argument" in edit(lambda app: app["args"].update(replicas=2))
    assert "SM_VLLM_MAX_MODEL_LEN=8192 must be a string" in edit(
        lambda app: app["args"]["settings"].update(SM_VLLM_MAX_MODEL_LEN=8192))
    assert "max_replicas" in edit(lambda app: app["args"]["autoscaling_config"].update(
        max_replicas=0))
    assert "needs 8 GPUs but worker pods have 4" in edit(
        lambda app: app["args"].update(engine_num_gpus=8))


def test_the_engine_as_its_own_ingress_renders_and_passes_rays_schema_and_the_builder():
    rendered = render(spec_for("g5.12xlarge", 4, 2, "rayservice", "gateway", "karpenter",
                               ray_ingress_replicas=0))
    ray = docs_by_kind(rendered)["RayService"]
    assert yaml.safe_load(ray["spec"]["serveConfigV2"])["applications"][0]["args"][
        "ingress_replicas"] == 0
    docs = [(m.file, m.doc) for m in rendered.manifests]
    assert v.check_ray_serve_configs(docs).status == v.PASSED
    default = render(spec_for("g5.12xlarge", 4, 2, "rayservice", "gateway", "karpenter"))
    assert "ingress_replicas" not in yaml.safe_load(docs_by_kind(default)["RayService"]["spec"][
        "serveConfigV2"])["applications"][0]["args"]      # the builder's default: one


def test_haproxy_in_front_of_ray_serve_is_the_ray_pods_env_and_still_validates():
    rendered = render(spec_for("g5.12xlarge", 4, 2, "rayservice", "gateway", "karpenter",
                               ray_proxy="haproxy", ray_ingress_replicas=0))
    cluster = docs_by_kind(rendered)["RayService"]["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["template"]["spec"]["containers"][0]["env"]}
        assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
        assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
        # the local-only shortcut (no drain before a replica stops) never ships
        assert "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S" not in env
    docs = [(m.file, m.doc) for m in rendered.manifests]
    assert v.check_ray_serve_configs(docs).status == v.PASSED
    default = docs_by_kind(render(spec_for("g5.12xlarge", 4, 2, "rayservice", "gateway",
                                           "karpenter")))["RayService"]
    head_env = default["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"][
        "containers"][0]["env"]
    assert not any(e["name"].startswith("RAY_SERVE_") for e in head_env)


def test_eksctl_schema_catches_a_misspelt_field(base):
    config = copy.deepcopy(base.cluster_config)
    config["managedNodeGroups"][0]["instanceTyp"] = config["managedNodeGroups"][0].pop("instanceType")
    assert "instanceTyp" in failures(v.check_cluster_config(config, v.schema_dir()))


def test_project_schemas_catch_gateway_and_monitor_mistakes(base_deployment):
    docs = broken(base_deployment, "BackendTrafficPolicy", lambda d: d["spec"]["rateLimit"][
        "local"]["rules"][0]["limit"].update(unit="Seconds"))
    assert "Seconds" in failures(v.check_project_kinds(docs))
    docs = broken(base_deployment, "ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(
        path="metrics"))
    assert "path" in failures(v.check_project_kinds(docs))


def test_yamllint_catches_a_duplicate_key():
    assert "duplicate" in failures(v.check_yaml({"bad.yaml": "---\na: 1\na: 2\n"}))


def test_checkov_catches_an_insecure_pod_and_an_unjustified_skip(tmp_path):
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "bad", "namespace": "x",
                        "annotations": {"checkov.io/skip1": "CKV_K8S_43"}},
           "spec": {"containers": [{"name": "c", "image": "busybox:1.36",
                                    "securityContext": {"privileged": True}}]}}
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    text = failures(v.check_checkov(tmp_path))
    assert "CKV_K8S_16" in text                                  # privileged container
    assert "CKV_K8S_43 is skipped without a reason" in text


def test_missing_schema_folder_is_said_clearly(monkeypatch, tmp_path, base):
    check = v.check_crd_kinds([(m.file, m.doc) for m in base.manifests], None)
    assert check.status == v.NOT_RUN and "SPECTRUM_K8S_SCHEMAS" in check.note
    monkeypatch.setenv("SPECTRUM_K8S_SCHEMAS", str(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in v.missing_schemas_note()
    monkeypatch.setenv("SPECTRUM_K8S_SCHEMAS", str(tmp_path))
    assert v.schema_dir() == tmp_path


def test_missing_schemas_note_names_every_upstream_file_the_checks_read():
    # An installed copy has no schema folder: the note is all its user has to fetch them by.
    folder = v.schema_dir()
    read = {p.name for p in folder.iterdir() if p.suffix in (".yaml", ".json")}
    assert set(v.UPSTREAM_SCHEMAS) == read
    note = v.missing_schemas_note()
    assert all(name in note and where in note for name, where in v.UPSTREAM_SCHEMAS.items())
