"""Rung 6's autoscaling as ``cost simulate`` chose it, into what ``options.deploy`` renders:
``--autoscaling-from`` a simulation's --json gives the RayService's Serve application the
simulated ``autoscaling_config`` (checked by Ray's own ServeDeploySchema and the byo builder's
argument check), or the Deployment's HPA its target; mismatches are refused by name."""
from __future__ import annotations

import json

import pytest
import yaml

from infra.eks import validate as v
from infra.eks.render import render
from options.core import BadInput

TRACE_ARGS = ["--window", "0:600", "--model", "meta.llama3-1-8b-instruct-v1:0", "--instance", "g5.xlarge",
              "--capacity", "1500", "--rungs", "6", "--slo-ttft-ms", "3000", "--json", "--no-progress"]


def simulate(tmp_path, capsys, *extra) -> tuple[str, dict]:
    from cost.__main__ import main
    from cost.traces import AZURE_CONV_TRACE

    assert main(["simulate", "--trace", str(AZURE_CONV_TRACE), *TRACE_ARGS, *extra]) == 0
    doc = json.loads(capsys.readouterr().out)
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    return str(path), doc


def spec(*argv: str):
    from options.deploy import parse_args
    from options.eks import spec_from_args

    return spec_from_args(parse_args(["--level", "6", "--plan", *argv])).eks


def serve_app(rendered) -> dict:
    ray = next(m.doc for m in rendered.manifests if m.doc["kind"] == "RayService")
    return yaml.safe_load(ray["spec"]["serveConfigV2"])["applications"][0]


def test_the_simulated_ray_serve_policy_is_what_the_rayservice_runs(tmp_path, capsys):
    path, doc = simulate(tmp_path, capsys, "--rung6-autoscaler", "ray-serve", "--target-ongoing", "16",
                         "--max-instances", "4", "--ray-autoscaling", "upscale_delay_s=12")
    rendered = render(spec("--engine", "rayservice", "--autoscaling-from", path))
    assert serve_app(rendered)["args"]["autoscaling_config"] == doc["ray_serve_autoscaling_config"] == {
        "min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 16.0, "upscale_delay_s": 12.0,
        "downscale_delay_s": 600.0, "look_back_period_s": 30.0}
    docs = [(m.file, m.doc) for m in rendered.manifests]
    ray_check = v.check_ray_serve_configs(docs)
    assert ray_check.status == v.PASSED, ray_check.findings      # Ray's own schema + build_app's check
    assert v.check_serve_configs(docs).status == v.PASSED
    workers = rendered.resolved.max_replicas
    assert workers == 4                                            # the worker pool is sized by it too
    # the ray-llm application takes the same config
    llm = serve_app(render(spec("--engine", "rayservice", "--serve-app", "ray-llm",
                                "--autoscaling-from", path)))
    assert (llm["args"]["llm_configs"][0]["deployment_config"]["autoscaling_config"]
            == doc["ray_serve_autoscaling_config"])


def test_a_bare_autoscaling_config_and_the_local_application(tmp_path):
    from options.deploy import parse_args
    from options.eks import local_autoscaling_config
    from options.eks.ray_local import local_app_args

    path = tmp_path / "scaling.json"
    path.write_text(json.dumps({"target_ongoing_requests": 2, "min_replicas": 1, "max_replicas": 2,
                                "upscale_delay_s": 1}))
    rendered = render(spec("--engine", "rayservice", "--autoscaling-from", str(path)))
    assert serve_app(rendered)["args"]["autoscaling_config"] == {
        "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2, "upscale_delay_s": 1}
    args = parse_args(["--level", "6", "--engine", "rayservice", "--autoscaling-from", str(path)])
    local = local_app_args("tiny", (), local_autoscaling_config(args))
    assert local["autoscaling_config"]["upscale_delay_s"] == 1 and "num_replicas" not in local
    assert local_app_args("tiny", ())["num_replicas"] == 1          # without it: one replica, as before


def test_ray_autoscaling_flags_set_the_config_alone_or_beside_a_file(tmp_path):
    from options.deploy import parse_args
    from options.eks import local_autoscaling_config

    flags = ["--engine", "rayservice", "--min-replicas", "2", "--max-replicas", "5",
             "--ray-autoscaling", "target_ongoing_requests=8", "--ray-autoscaling", "downscale_delay_s=120"]
    config = {"min_replicas": 2, "max_replicas": 5, "target_ongoing_requests": 8.0, "downscale_delay_s": 120.0}
    assert serve_app(render(spec(*flags)))["args"]["autoscaling_config"] == config
    assert local_autoscaling_config(parse_args(["--level", "6", *flags])) == config
    path = tmp_path / "scaling.json"
    path.write_text(json.dumps({"target_ongoing_requests": 8, "upscale_delay_s": 1}))
    both = serve_app(render(spec(*flags, "--autoscaling-from", str(path))))["args"]["autoscaling_config"]
    assert both == {**config, "upscale_delay_s": 1}


@pytest.mark.parametrize("argv, message", [
    (["--ray-autoscaling", "target_ongoing_requests=8"], "add --engine rayservice"),
    (["--engine", "rayservice", "--ray-autoscaling", "max_replicas=3"], "give max_replicas as --max-replicas"),
    (["--engine", "rayservice", "--ray-autoscaling", "upscale=3"], "KEY one of target_ongoing_requests"),
    (["--engine", "rayservice", "--ray-autoscaling", "upscale_delay_s=soon"], "'soon' is not a number"),
    (["--engine", "rayservice", "--ray-autoscaling", "target_ongoing_requests=0"],
     "target_ongoing_requests 0.0 must be a number > 0"),
])
def test_bad_ray_autoscaling_flags_are_refused_naming_the_value(argv, message):
    with pytest.raises(BadInput, match=message):
        spec(*argv)


def test_a_flag_and_the_file_disagreeing_is_refused(tmp_path):
    path = tmp_path / "scaling.json"
    path.write_text(json.dumps({"target_ongoing_requests": 2}))
    with pytest.raises(BadInput, match="target_ongoing_requests=8 and --autoscaling-from .* disagree"):
        spec("--engine", "rayservice", "--autoscaling-from", str(path), "--ray-autoscaling",
             "target_ongoing_requests=8")


def test_the_simulated_hpa_is_what_the_deployment_scales_with(tmp_path, capsys):
    path, doc = simulate(tmp_path, capsys, "--target-waiting", "2", "--max-instances", "4")
    eks = spec("--autoscaling-from", path)
    assert (eks.min_replicas, eks.max_replicas, eks.target_waiting, eks.target_cpu) == (1, 4, 2.0, 0)
    hpa = next(m.doc for m in render(eks).manifests if m.doc["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["maxReplicas"] == 4


@pytest.mark.parametrize("content, argv, message", [
    ("hpa", ["--engine", "rayservice"], "simulated with hpa_keda_queue_depth (the HPA)"),
    ("ray", [], "add --engine rayservice"),
    ("ray", ["--engine", "rayservice", "--max-replicas", "9"], "--max-replicas 9 and --autoscaling-from"),
    ({"target_ongoing_requests": 2, "upscale_delay": 1}, ["--engine", "rayservice"], "upscale_delay not modelled"),
    ({"target_ongoing_requests": -2}, ["--engine", "rayservice"], "target_ongoing_requests -2 must be"),
    ({"target_ongoing_requests": 2}, [], "applies to --engine rayservice only"),
    ("not json", ["--engine", "rayservice"], "is not JSON"),
    (None, ["--engine", "rayservice"], "does not exist"),
])
def test_bad_autoscaling_files_are_refused_naming_the_problem(tmp_path, content, argv, message):
    path = tmp_path / "in.json"
    if content in ("hpa", "ray"):
        kind = "hpa_keda_queue_depth" if content == "hpa" else "ray_serve_ongoing_requests"
        policy = {"kind": kind, "min_replicas": 1, "max_replicas": 4, "target": 8,
                  "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}}
        path.write_text(json.dumps({"rungs": [{"level": 6, "policy": policy}]}))
    elif isinstance(content, dict):
        path.write_text(json.dumps(content))
    elif content is not None:
        path.write_text(content)
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec(*argv, "--autoscaling-from", str(path))


def test_other_rungs_refuse_the_flag_with_how_they_scale():
    from options.deploy import parse_args

    with pytest.raises(BadInput, match="--autoscaling-from does not apply to level 3"):
        parse_args(["--level", "3", "--autoscaling-from", "sim.json"])


def test_the_deploy_flag_renders_the_engine_as_its_own_ingress():
    eks = spec("--engine", "rayservice", "--image", "registry.example/byo:1", "--ray-ingress-replicas", "0")
    assert eks.ray_ingress_replicas == 0
    assert serve_app(render(eks))["args"]["ingress_replicas"] == 0
    assert spec("--engine", "rayservice", "--image", "registry.example/byo:1").ray_ingress_replicas == 1
