"""Level 6 with many models and a front door: LoRA adapters (fetched at pod start, or Ray Serve
LLM's multiplexing), the API gateway with Redis and the NetworkPolicies around them, the edge
routing only inference paths with session affinity, and prefix caching on by default."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.eks import validate as v
from infra.eks.render import render
from infra.eks.spec import EksSpec, pinned, resolve
from options.core import BadInput

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0"
GATEWAY_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-gateway:0.1.0"
ADAPTERS = (("support", "s3://acme-adapters/llm/support"), ("sql", "s3://acme-adapters/llm/sql/"))
MODEL = "Qwen/Qwen2.5-7B-Instruct"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _needs_schemas(schemas):
    """Every test here validates against the upstream schemas."""


def spec(**kw) -> EksSpec:
    """A spec; a RayService here runs ray.serve.llm, whose multiplexing serves the adapters."""
    if kw.get("engine") == "rayservice":
        kw.setdefault("serve_app", "ray-llm")
    return EksSpec(**{"image": IMAGE, "gateway_image": GATEWAY_IMAGE, **kw})


def by_ref(rendered) -> dict[str, dict]:
    return {m.ref: m.doc for m in rendered.manifests}


def validated(rendered, tmp_path: Path) -> None:
    """Every offline check but checkov (the CLI test runs it on an adapter + gateway stack)."""
    rendered.write(tmp_path)
    report = v.validate_rendered(rendered, tmp_path, run_checkov=False)
    assert report.complete, report.findings()


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


# -- LoRA adapters on the Deployment -----------------------------------------------------------

def test_adapters_turn_lora_on_and_an_init_container_fetches_them(tmp_path):
    rendered = render(spec(adapters=ADAPTERS, max_lora_rank=32))
    validated(rendered, tmp_path)        # checkov: test_cli_gateway_renders_and_validates
    docs = by_ref(rendered)
    pod = docs["Deployment/spectrum/llm"]["spec"]["template"]["spec"]
    server, = pod["containers"]
    env = env_of(server)
    assert {k: env[k] for k in env if "LORA" in k or k == "SPECTRUM_SERVER_ADAPTERS_DIR"} == {
        "SM_VLLM_ENABLE_LORA": "true", "SM_VLLM_MAX_LORAS": "2", "SM_VLLM_MAX_LORA_RANK": "32",
        "SM_VLLM_MAX_CPU_LORAS": "2", "SPECTRUM_SERVER_ADAPTERS_DIR": "/adapters"}
    assert {"name": "adapters", "mountPath": "/adapters", "readOnly": True} in server["volumeMounts"]

    fetch, = pod["initContainers"]
    assert fetch["image"] == pinned("aws_cli_image")
    assert fetch["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "adapters", "mountPath": "/adapters"} in fetch["volumeMounts"]
    script = fetch["command"][2]
    for name, uri in (("support", "s3://acme-adapters/llm/support/"),
                      ("sql", "s3://acme-adapters/llm/sql/")):
        assert (f"aws s3 sync --only-show-errors --exclude '*' --include adapter_config.json "
                f"--include adapter_model.safetensors {uri} /adapters/{name}") in script
    assert {"name": "adapters", "emptyDir": {"sizeLimit": "20Gi"}} in pod["volumes"]

    # The pods' identity may read the adapters' prefixes and nothing else.
    association, = rendered.cluster_config["iam"]["podIdentityAssociations"]
    assert (association["namespace"], association["serviceAccountName"]) == ("spectrum", "llm")
    assert pod["serviceAccountName"] == "llm"
    statements = association["permissionPolicy"]["Statement"]
    assert statements[0] == {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": [
        "arn:aws:s3:::acme-adapters/llm/sql/*", "arn:aws:s3:::acme-adapters/llm/support/*"]}
    assert statements[1]["Resource"] == ["arn:aws:s3:::acme-adapters"]
    assert statements[1]["Condition"]["StringLike"]["s3:prefix"] == [
        "llm/sql", "llm/sql/*", "llm/support", "llm/support/*"]


def test_without_adapters_lora_stays_off(tmp_path):
    rendered = render(spec())
    pod = by_ref(rendered)["Deployment/spectrum/llm"]["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert not [k for k in env_of(pod["containers"][0]) if "LORA" in k]
    assert "podIdentityAssociations" not in rendered.cluster_config["iam"]


def write_stand_in_aws(folder: Path, mirror: Path) -> None:
    """An `aws` on PATH for the init container's script: `s3 sync --include` copies the named
    files from a local mirror of the bucket (the script's shell logic is what is tested)."""
    folder.mkdir()
    (folder / "aws").write_text(f"""#!{sys.executable}
import shutil, sys
from pathlib import Path
args = sys.argv[1:]
assert args[:2] == ["s3", "sync"], args
include = [args[i + 1] for i, a in enumerate(args) if a == "--include"]
src, dest = args[-2], Path(args[-1])
source = Path({str(mirror)!r}) / src[len("s3://"):]
dest.mkdir(parents=True, exist_ok=True)
for name in include:
    if (source / name).is_file():
        shutil.copyfile(source / name, dest / name)
""")
    (folder / "aws").chmod(0o755)


def test_the_init_script_copies_only_adapter_files_and_names_a_missing_one(tmp_path):
    from infra.eks.workload import adapter_fetch_script

    mirror = tmp_path / "s3"
    for name in ("support", "sql"):
        folder = mirror / "acme-adapters" / "llm" / name
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")
        (folder / "adapter_model.safetensors").write_bytes(b"\0" * 8)
        (folder / "adapter_model.bin").write_bytes(b"pickle")         # never copied
    write_stand_in_aws(tmp_path / "bin", mirror)
    root = tmp_path / "pod"

    def run(adapters):
        script = adapter_fetch_script(resolve(spec(adapters=adapters)))
        return subprocess.run(["/bin/sh", "-c", script.replace(" /adapters/", f" {root}/adapters/")],
                              capture_output=True, text=True,
                              env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"})

    done = run(ADAPTERS)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (root / "adapters" / "sql").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert "adapters ready: support sql" in done.stdout
    missing = run(ADAPTERS + (("legal", "s3://acme-adapters/llm/legal"),))
    assert missing.returncode == 1
    assert "adapter legal: no adapter_config.json under s3://acme-adapters/llm/legal/" in missing.stderr


def test_the_rendered_server_env_is_what_the_byo_server_and_vllm_accept():
    from byo_vllm.config import settings_from_env
    from byo_vllm.engine_args import engine_argv, engine_parser

    rendered = render(spec(adapters=ADAPTERS, prefix_caching=False, max_loras=1))
    server = by_ref(rendered)["Deployment/spectrum/llm"]["spec"]["template"]["spec"]["containers"][0]
    env = {k: value for k, value in env_of(server).items() if value is not None}
    settings = settings_from_env(env)
    assert settings.adapters_dir == "/adapters"
    argv = engine_argv(settings, engine_parser())
    assert argv[:2] == ["--model", MODEL]
    flags = {a: argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else True
             for i, a in enumerate(argv) if a.startswith("--")}
    assert {k: flags[k] for k in ("--enable-lora", "--max-loras", "--max-lora-rank",
                                  "--max-cpu-loras", "--no-enable-prefix-caching")} == {
        "--enable-lora": True, "--max-loras": "1", "--max-lora-rank": "16",
        "--max-cpu-loras": "2", "--no-enable-prefix-caching": True}


# -- LoRA adapters on the RayService -----------------------------------------------------------

RAY_ADAPTERS = (("support", "s3://acme-adapters/llm/support"), ("sql", "s3://acme-adapters/llm/sql"))


def llm_config(rendered) -> dict:
    ray = by_ref(rendered)["RayService/spectrum/llm"]
    return yaml.safe_load(ray["spec"]["serveConfigV2"])["applications"][0]["args"]["llm_configs"][0]


def test_rayservice_multiplexes_adapters_from_one_folder(tmp_path):
    rendered = render(spec(engine="rayservice", adapters=RAY_ADAPTERS, max_cpu_loras=8))
    validated(rendered, tmp_path)
    llm = llm_config(rendered)
    assert llm["lora_config"] == {"dynamic_lora_loading_path": "s3://acme-adapters/llm",
                                  "max_num_adapters_per_replica": 8}
    assert {k: llm["engine_kwargs"][k] for k in ("enable_lora", "max_loras", "max_lora_rank",
                                                 "max_cpu_loras")} == {
        "enable_lora": True, "max_loras": 2, "max_lora_rank": 16, "max_cpu_loras": 8}
    ray = by_ref(rendered)["RayService/spectrum/llm"]
    worker = ray["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    head = ray["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert worker["serviceAccountName"] == "llm" and "serviceAccountName" not in head
    assert "ServiceAccount/spectrum/llm" in by_ref(rendered)
    assert rendered.cluster_config["iam"]["podIdentityAssociations"][0]["serviceAccountName"] == "llm"


def test_the_byo_serve_app_multiplexes_adapters_fetched_into_its_worker_pods(tmp_path):
    rendered = render(spec(engine="rayservice", serve_app="byo", adapters=ADAPTERS,
                           max_loras=2, max_cpu_loras=6))
    validated(rendered, tmp_path)        # JSON schemas, ServeDeploySchema, the builder's check
    ray = by_ref(rendered)["RayService/spectrum/llm"]
    app, = yaml.safe_load(ray["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == "byo_vllm.ray_serve:build_app"
    assert app["args"]["max_adapters_per_replica"] == 6
    assert {k: app["args"]["settings"][k] for k in (
        "SM_VLLM_ENABLE_LORA", "SM_VLLM_MAX_LORAS", "SM_VLLM_MAX_CPU_LORAS",
        "SPECTRUM_SERVER_ADAPTERS_DIR")} == {
        "SM_VLLM_ENABLE_LORA": "true", "SM_VLLM_MAX_LORAS": "2", "SM_VLLM_MAX_CPU_LORAS": "6",
        "SPECTRUM_SERVER_ADAPTERS_DIR": "/adapters"}
    # Each GPU worker pod (where the engine replicas run) copies the adapters from S3 first,
    # from any folders, as the Deployment's pods do; the head runs no engine.
    cluster = ray["spec"]["rayClusterConfig"]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    fetch, = worker["initContainers"]
    assert "s3://acme-adapters/llm/sql/ /adapters/sql" in fetch["command"][2]
    assert {"name": "adapters", "mountPath": "/adapters", "readOnly": True} in \
        worker["containers"][0]["volumeMounts"]
    assert worker["serviceAccountName"] == "llm"
    assert "initContainers" not in cluster["headGroupSpec"]["template"]["spec"]
    # The builder's check refuses a multiplexing size the engine's adapter cache cannot hold.
    broken = copy.deepcopy(ray)
    config = yaml.safe_load(broken["spec"]["serveConfigV2"])
    config["applications"][0]["args"]["max_adapters_per_replica"] = 7
    broken["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    found = [str(f) for f in v.check_ray_serve_configs([("f.yaml", broken)]).findings]
    assert any("max_adapters_per_replica 7 is above SM_VLLM_MAX_CPU_LORAS=6" in f
               for f in found), found
    config["applications"][0]["args"]["settings"].pop("SM_VLLM_ENABLE_LORA")
    broken["spec"]["serveConfigV2"] = yaml.safe_dump(config)
    found = [str(f) for f in v.check_ray_serve_configs([("f.yaml", broken)]).findings]
    assert any("max_adapters_per_replica 7 needs LoRA on" in f for f in found), found


def test_the_gateway_names_byo_ray_adapters_as_clients_do(tmp_path):
    rendered = render(spec(gateway=True, engine="rayservice", serve_app="byo", adapters=ADAPTERS))
    config = load_gateway_config(
        by_ref(rendered)["ConfigMap/spectrum/llm-gateway"]["data"]["gateway.yaml"], tmp_path)
    assert {name: m.upstreams[0].model for name, m in config.models.items()} == {
        MODEL: None, "support": None, "sql": None}


def test_the_serve_config_check_fails_on_broken_lora_settings():
    rendered = render(spec(engine="rayservice", adapters=RAY_ADAPTERS))
    ray = by_ref(rendered)["RayService/spectrum/llm"]
    config = yaml.safe_load(ray["spec"]["serveConfigV2"])

    def findings(mutate) -> list[str]:
        doc, broken = copy.deepcopy(ray), copy.deepcopy(config)
        mutate(broken["applications"][0]["args"]["llm_configs"][0])
        doc["spec"]["serveConfigV2"] = yaml.safe_dump(broken)
        return [str(f) for f in v.check_serve_configs([("f.yaml", doc)]).findings]

    assert findings(lambda llm: None) == []
    assert any("lora_config needs engine_kwargs.enable_lora: true" in f
               for f in findings(lambda llm: llm["engine_kwargs"].pop("enable_lora")))
    assert any("max_num_adapters_per_replica" in f
               for f in findings(lambda llm: llm["lora_config"].update(max_num_adapters_per_replica=0)))
    assert any("max_adapters" in f
               for f in findings(lambda llm: llm["lora_config"].update(max_adapters=4)))
    assert any("max_lora_rank" in f
               for f in findings(lambda llm: llm["engine_kwargs"].update(max_lora_rank=12)))


def test_rayservice_refuses_adapters_that_do_not_share_one_folder():
    with pytest.raises(BadInput) as e:
        resolve(spec(engine="rayservice", adapters=ADAPTERS[:1] + (
            ("sql", "s3://other-bucket/sql"),)))
    assert "--serve-app ray-llm loads every adapter from one S3 folder" in str(e.value)
    assert "sql=s3://other-bucket/sql" in str(e.value)
    with pytest.raises(BadInput, match="support=s3://acme-adapters/llm/v2"):
        resolve(spec(engine="rayservice", adapters=(("support", "s3://acme-adapters/llm/v2"),)))


@pytest.mark.parametrize("adapters, words", [
    ((("bad name", "s3://acme-adapters/x"),), ["'bad name' is what clients send as 'model'"]),
    ((("a", "https://example.com/a"),), ["'https://example.com/a' is not an s3://bucket/prefix"]),
    ((("a", "s3://Bad_Bucket/a"),), ["'s3://Bad_Bucket/a' is not an s3://bucket/prefix"]),
    ((("a", "s3://acme-adapters"),), ["'s3://acme-adapters' is not an s3://bucket/prefix"]),
    ((("a", "s3://acme-adapters/a"), ("a", "s3://acme-adapters/b")), ["--adapter a is given twice"]),
    ((("Qwen2.5-7B-Instruct", "s3://acme-adapters/q"),), ["named as the base model"]),
])
def test_bad_adapters_are_bad_input_naming_them(adapters, words):
    with pytest.raises(BadInput) as e:
        resolve(spec(adapters=adapters))
    for word in words:
        assert word in str(e.value)


def test_lora_sizes_are_checked():
    with pytest.raises(BadInput) as e:
        resolve(spec(adapters=ADAPTERS, max_lora_rank=12, max_loras=4, max_cpu_loras=2,
                     options=(("SM_VLLM_ENABLE_LORA", "true"),)))
    text = str(e.value)
    assert "--max-lora-rank 12 must be one of 1, 8, 16, 32" in text
    assert "--max-cpu-loras 2 is below --max-loras 4" in text
    assert "--option SM_VLLM_ENABLE_LORA fights the LoRA settings" in text
    with pytest.raises(BadInput, match="--max-loras 2 needs at least one --adapter"):
        resolve(spec(max_loras=2))


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    from options.deploy import main
    code = main(["--level", "6", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_bad_adapter_exits_2_naming_it(tmp_path, capsys):
    out = tmp_path / "never"
    code, _, stderr = run_cli(["--out", str(out), "--adapter", "support"], capsys)
    assert code == 2 and "--adapter 'support' must look like NAME=s3://bucket/prefix" in stderr
    code, _, stderr = run_cli(["--out", str(out), "--adapter", "support=s3://x/a"], capsys)
    assert code == 2 and "'s3://x/a' is not an s3://bucket/prefix" in stderr
    assert "Traceback" not in stderr and not out.exists()


# -- the gateway, Redis and who may reach whom ---------------------------------------------------

def load_gateway_config(text: str, tmp_path: Path):
    """The gateway's own loader (containers/gateway/spectrum_gateway/config.py)."""
    sys.path.insert(0, str(REPO / "containers" / "gateway"))
    try:
        from spectrum_gateway.config import load_config
    finally:
        sys.path.remove(str(REPO / "containers" / "gateway"))
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize("engine", ["deployment", "rayservice"])
def test_gateway_renders_a_config_its_own_loader_accepts(engine, tmp_path):
    adapters = RAY_ADAPTERS if engine == "rayservice" else ADAPTERS
    rendered = render(spec(gateway=True, engine=engine, adapters=adapters))
    validated(rendered, tmp_path / "out")
    docs = by_ref(rendered)
    config = load_gateway_config(docs["ConfigMap/spectrum/llm-gateway"]["data"]["gateway.yaml"],
                                 tmp_path)
    assert config.store == "redis://llm-redis.spectrum.svc.cluster.local:6379/0"
    assert config.uses_redis
    upstream_url = ("http://llm-serve-svc.spectrum.svc.cluster.local:8000" if engine == "rayservice"
                    else "http://llm.spectrum.svc.cluster.local:8080")
    assert sorted(config.models) == sorted([MODEL, "support", "sql"])
    for name, model in config.models.items():
        upstream, = model.upstreams
        assert upstream.url == upstream_url
        expected = None if name == MODEL else (f"{MODEL}:{name}" if engine == "rayservice" else None)
        assert upstream.model == expected
    assert config.tenants["default"].models == ("*",)

    # The pod: its config and secret where the config says, probes, limits, locked down.
    pod = docs["Deployment/spectrum/llm-gateway"]["spec"]["template"]["spec"]
    gateway, = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in gateway["volumeMounts"]}
    volumes = {vol["name"]: vol for vol in pod["volumes"]}
    assert gateway["args"][:3] == ["serve", "--config", f"{mounts['config']}/gateway.yaml"]
    assert volumes["config"]["configMap"]["name"] == "llm-gateway"
    assert str(config.secret_file) == f"{mounts['secret']}/secret"
    assert volumes["secret"]["secret"]["secretName"] == "llm-gateway-secret"
    assert str(config.state_dir).startswith(mounts["tmp"])
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert gateway["resources"]["requests"] and gateway["resources"]["limits"]
    security = gateway["securityContext"]
    assert security["readOnlyRootFilesystem"] and security["runAsNonRoot"] and \
        security["runAsUser"] >= 10000 and not security["allowPrivilegeEscalation"]
    assert "env" not in gateway       # the secret is a file, never an environment variable
    assert "Secret" not in {d["kind"] for d in rendered.documents()}   # no value in manifests
    assert config.upstream_timeout_s == rendered.resolved.max_request_s

    # Redis: one StatefulSet on an encrypted gp3 volume that outlives the stack, its Service.
    redis = docs["StatefulSet/spectrum/llm-redis"]
    assert docs["Service/spectrum/llm-redis"]["spec"]["ports"][0]["port"] == 6379
    assert redis["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "spectrum-gp3"
    assert docs["StorageClass/spectrum-gp3"]["reclaimPolicy"] == "Retain"
    assert {"name": "aws-ebs-csi-driver", "useDefaultPodIdentityAssociations": True} in \
        rendered.cluster_config["addons"]


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == value for k, value in selector["matchLabels"].items())


def peers_allowed(policy: dict, pod_labels: dict, namespace: str = "spectrum") -> bool:
    """Whether a pod with these labels in this namespace may open connections to the policy's pods."""
    for rule in policy["spec"]["ingress"]:
        for peer in rule.get("from", []):
            if "podSelector" in peer and namespace == "spectrum" and selects(peer["podSelector"], pod_labels):
                return True
            if "namespaceSelector" in peer and selects(
                    peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace}):
                return True
    return False


@pytest.mark.parametrize("engine", ["deployment", "rayservice"])
def test_only_the_gateway_reaches_the_servers_and_redis(engine):
    rendered = render(spec(gateway=True, engine=engine))
    docs = by_ref(rendered)
    gateway_pods = docs["Deployment/spectrum/llm-gateway"]["spec"]["template"]["metadata"]["labels"]
    redis_pods = docs["StatefulSet/spectrum/llm-redis"]["spec"]["template"]["metadata"]["labels"]
    if engine == "deployment":
        server_pods = docs["Deployment/spectrum/llm"]["spec"]["template"]["metadata"]["labels"]
    else:
        cluster = docs["RayService/spectrum/llm"]["spec"]["rayClusterConfig"]
        server_pods = cluster["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
    server_policy = docs["NetworkPolicy/spectrum/llm"]
    redis_policy = docs["NetworkPolicy/spectrum/llm-redis"]
    gateway_policy = docs["NetworkPolicy/spectrum/llm-gateway"]
    assert selects(server_policy["spec"]["podSelector"], server_pods)
    assert selects(redis_policy["spec"]["podSelector"], redis_pods)
    assert selects(gateway_policy["spec"]["podSelector"], gateway_pods)
    assert not selects(server_policy["spec"]["podSelector"], gateway_pods)

    assert peers_allowed(server_policy, gateway_pods)
    assert not peers_allowed(server_policy, redis_pods)
    assert not peers_allowed(server_policy, {}, namespace="envoy-gateway-system")  # edge: gateway only
    assert peers_allowed(server_policy, {}, namespace="monitoring")                 # the HPA's metric
    assert peers_allowed(redis_policy, gateway_pods)
    assert not peers_allowed(redis_policy, server_pods)
    assert not peers_allowed(redis_policy, {}, namespace="monitoring")
    assert redis_policy["spec"]["egress"] == [] and "Egress" in redis_policy["spec"]["policyTypes"]
    assert peers_allowed(gateway_policy, {}, namespace="envoy-gateway-system")
    assert not peers_allowed(gateway_policy, {}, namespace="default")
    port = 8000 if engine == "rayservice" else 8080
    egress = gateway_policy["spec"]["egress"]
    assert any(selects(rule["to"][0]["podSelector"], server_pods)
               and rule["ports"] == [{"protocol": "TCP", "port": port}]
               for rule in egress if "to" in rule)
    assert any(selects(rule["to"][0]["podSelector"], redis_pods)
               and rule["ports"] == [{"protocol": "TCP", "port": 6379}]
               for rule in egress if "to" in rule)


def test_without_the_gateway_the_edge_reaches_the_servers():
    docs = by_ref(render(spec()))
    policy = docs["NetworkPolicy/spectrum/llm"]
    assert peers_allowed(policy, {}, namespace="envoy-gateway-system")
    assert not any(d["metadata"]["name"].endswith(("-gateway", "-redis")) for d in docs.values())


def test_gateway_flags_are_checked():
    with pytest.raises(BadInput) as e:
        resolve(spec(gateway=True, gateway_image="repo/gateway:latest", gateway_replicas=0))
    assert "--gateway-image 'repo/gateway:latest' uses the rolling tag 'latest'" in str(e.value)
    assert "--gateway-replicas 0 must be a whole number between 1 and 100" in str(e.value)


def test_cli_gateway_renders_and_validates(tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["--json", "--out", str(out), "--image", IMAGE, "--gateway",
                                    "--adapter", "support=s3://acme-adapters/llm/support"], capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["validation"]["complete"], summary["validation"]
    checkov = next(c for c in summary["validation"]["checks"] if c["name"].startswith("checkov"))
    assert checkov["status"] == "passed" and checkov["checked"] >= 20
    resources = {r["resource"] for r in summary["resources"]}
    assert {"Deployment/spectrum/llm-gateway", "StatefulSet/spectrum/llm-redis",
            "NetworkPolicy/spectrum/llm-redis", "ConfigMap/spectrum/llm-gateway"} <= resources
    assert any("spectrum-gateway:0.1.0" in n for n in summary["notes"])
    code, _, stderr = run_cli(["--target", "aws", "--image", IMAGE, "--gateway"], capsys)
    assert code == 2 and "--gateway on --target aws needs --gateway-image URI" in stderr


def test_cli_emulator_lifecycle_with_the_gateway(capsys, monkeypatch):
    monkeypatch.delenv("SPECTRUM_GATEWAY_SECRET", raising=False)
    code, stdout, stderr = run_cli(["--target", "emulator", "--json", "--cluster-name", "emu-gw",
                                    "--gateway", "--adapter", "a1=s3://acme-adapters/llm/a1"], capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert {"StorageClass/spectrum-gp3", "StatefulSet/spectrum/llm-redis",
            "Deployment/spectrum/llm-gateway", "Secret/spectrum/llm-gateway-secret"} <= set(summary["created"])
    assert summary["status"]["status"] == "applied"
    assert "cluster emu-gw" in summary["removed"]


def test_apply_creates_the_gateway_secret_once(monkeypatch):
    from infra.eks.kube import KubeApi, apply_manifests
    from infra.eks.memory_api import InMemoryKubernetes
    from options.eks import _gateway_secret

    monkeypatch.delenv("SPECTRUM_GATEWAY_SECRET", raising=False)
    rendered = render(spec(gateway=True))
    r = rendered.resolved
    with InMemoryKubernetes() as k8s:
        api = KubeApi.from_url(k8s.url)
        first = _gateway_secret(api, r)
        assert first[0]["metadata"]["name"] == "llm-gateway-secret"
        value = first[0]["stringData"]["secret"]
        assert len(value) == 64
        apply_manifests(api, rendered.documents() + first, lambda _: None, wait=False)
        assert _gateway_secret(api, r) == []           # kept: a new one would void every key
        monkeypatch.setenv("SPECTRUM_GATEWAY_SECRET", "from-the-operator-0123456789")
        assert _gateway_secret(api, r) == []
        stored = api.get(first[0])
        assert stored is not None and "StatefulSet" in {d["kind"] for d in rendered.documents()}
    assert _gateway_secret(None, resolve(spec())) == []


# -- the edge: inference paths only, sessions on one pod ---------------------------------------

ADMIN_PATHS = ("/models", "/metrics", "/ping", "/healthz", "/readyz", "/")


@pytest.mark.parametrize("engine, edge, gateway, paths", [
    ("deployment", "gateway", False, {"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                      "/v1/models", "/invocations"}),
    ("deployment", "nginx", False, {"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                    "/v1/models", "/invocations"}),
    ("deployment", "gateway", True, {"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                     "/v1/models"}),
    ("rayservice", "nginx", True, {"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                   "/v1/models"}),
    ("rayservice", "gateway", False, {"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                                      "/v1/models"}),
])
def test_the_edge_routes_only_inference_paths(engine, edge, gateway, paths, tmp_path):
    rendered = render(spec(engine=engine, edge=edge, gateway=gateway, adapters=RAY_ADAPTERS))
    validated(rendered, tmp_path)
    docs = by_ref(rendered)
    backend = ("llm-gateway", 8000) if gateway else (
        ("llm-serve-svc", 8000) if engine == "rayservice" else ("llm", 8080))
    if edge == "gateway":
        rule, = docs["HTTPRoute/spectrum/llm"]["spec"]["rules"]
        assert {m["path"]["type"] for m in rule["matches"]} == {"Exact"}
        routed = {m["path"]["value"] for m in rule["matches"]}
        assert [(b["name"], b["port"]) for b in rule["backendRefs"]] == [backend]
    else:
        http = docs["Ingress/spectrum/llm"]["spec"]["rules"][0]["http"]
        assert {p["pathType"] for p in http["paths"]} == {"Exact"}
        routed = {p["path"] for p in http["paths"]}
        assert {(p["backend"]["service"]["name"], p["backend"]["service"]["port"]["number"])
                for p in http["paths"]} == {backend}
    assert routed == paths
    assert not any(p == admin or p.startswith("/models") for p in routed for admin in ADMIN_PATHS)


def test_sessions_hash_on_x_session_id_at_the_edge(tmp_path):
    envoy = by_ref(render(spec()))["BackendTrafficPolicy/spectrum/llm"]
    assert envoy["spec"]["loadBalancer"] == {"type": "ConsistentHash", "consistentHash": {
        "type": "Header", "header": {"name": "x-session-id"}}}
    assert envoy["spec"]["targetRefs"] == [{"group": "gateway.networking.k8s.io",
                                            "kind": "HTTPRoute", "name": "llm"}]
    nginx = by_ref(render(spec(edge="nginx")))["Ingress/spectrum/llm"]
    assert nginx["metadata"]["annotations"]["nginx.ingress.kubernetes.io/upstream-hash-by"] == \
        "$http_x_session_id"


def test_the_project_schema_refuses_a_hash_without_its_header():
    policy = by_ref(render(spec()))["BackendTrafficPolicy/spectrum/llm"]
    assert v.check_project_kinds([("f.yaml", policy)]).status == v.PASSED
    for broken_hash in ({"type": "Header"}, {"type": "Header", "header": {"name": "x"}, "cookie": {"name": "c"}},
                        {"type": "Sticky", "header": {"name": "x"}}):
        broken = copy.deepcopy(policy)
        broken["spec"]["loadBalancer"]["consistentHash"] = broken_hash
        assert v.check_project_kinds([("f.yaml", broken)]).status == v.FAILED, broken_hash
    broken = copy.deepcopy(policy)
    broken["spec"]["loadBalancer"] = {"type": "RoundRobin", "consistentHash": {"type": "SourceIP"}}
    assert v.check_project_kinds([("f.yaml", broken)]).status == v.FAILED


# -- prefix caching ------------------------------------------------------------------------------

def test_prefix_caching_is_on_by_default_and_can_be_turned_off():
    def server_env(**kw) -> dict:
        pod = by_ref(render(spec(**kw)))["Deployment/spectrum/llm"]["spec"]["template"]["spec"]
        return env_of(pod["containers"][0])

    assert server_env()["SM_VLLM_ENABLE_PREFIX_CACHING"] == "true"
    assert server_env(prefix_caching=False)["SM_VLLM_ENABLE_PREFIX_CACHING"] == "false"
    # A pooling model: vLLM turns it on only where the pooling supports it, so it decides.
    assert "SM_VLLM_ENABLE_PREFIX_CACHING" not in server_env(options=(("SM_VLLM_RUNNER", "pooling"),))
    assert llm_config(render(spec(engine="rayservice")))["engine_kwargs"]["enable_prefix_caching"] is True
    assert llm_config(render(spec(engine="rayservice", prefix_caching=False)))[
        "engine_kwargs"]["enable_prefix_caching"] is False
    with pytest.raises(BadInput, match="--no-prefix-caching turns it off"):
        resolve(spec(options=(("SM_VLLM_ENABLE_PREFIX_CACHING", "false"),)))


def test_cli_no_prefix_caching(tmp_path, capsys):
    code, stdout, stderr = run_cli(["--plan", "--json", "--no-prefix-caching"], capsys)
    assert code == 0, stderr
    plan = json.loads(stdout)
    deployment, = [s["params"]["manifest"] for s in plan["steps"] if s["operation"] == "Apply"
                   and s["params"]["manifest"]["kind"] == "Deployment"]
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    assert env["SM_VLLM_ENABLE_PREFIX_CACHING"] == "false"
