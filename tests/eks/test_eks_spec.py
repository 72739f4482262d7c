"""A broken spec fails before anything is rendered, with a message naming the problem."""
from __future__ import annotations

import pytest

from infra.eks.render import render
from infra.eks.spec import EksSpec, resolve
from options.core import BadInput
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/spectrum-byo-vllm:0.1.0"


def problem(**kw) -> str:
    with pytest.raises(BadInput) as info:
        render(EksSpec(**{"image": IMAGE, **kw}))
    return str(info.value)


def test_tensor_parallel_must_divide_gpus_per_replica():
    msg = problem(instance_type="g5.12xlarge", gpus_per_replica=4, tensor_parallel_size=3)
    assert "--tensor-parallel-size 3 does not divide --gpus-per-replica 4" in msg
    assert "1, 2, 4" in msg


def test_tensor_parallel_larger_than_gpus():
    msg = problem(instance_type="g5.12xlarge", gpus_per_replica=2, tensor_parallel_size=4)
    assert "--tensor-parallel-size 4 is larger than --gpus-per-replica 2" in msg


def test_unknown_gpu_type_names_closest():
    msg = problem(gpu_type="A10")
    assert "GPU type 'A10' is not known" in msg and "A10G" in msg


def test_unknown_instance_type_names_closest():
    msg = problem(instance_type="g5.xlarg")
    assert "g5.xlarge" in msg and "unknown" in msg


def test_min_greater_than_max():
    msg = problem(min_replicas=5, max_replicas=2)
    assert "--min-replicas 5 is greater than --max-replicas 2" in msg


def test_missing_image():
    msg = problem(image="")
    assert "image is missing" in msg and "--image" in msg


def test_rolling_tag_refused():
    assert "rolling tag 'latest'" in problem(image="repo/server:latest")
    assert "has no tag" in problem(image="repo/server")


def test_replica_larger_than_node():
    msg = problem(instance_type="g5.xlarge", gpus_per_replica=4)
    assert "does not fit on g5.xlarge" in msg and "g5.12xlarge" in msg


def test_inferentia_refused():
    assert "no NVIDIA GPU" in problem(instance_type="inf2.xlarge")


def test_secret_option_refused():
    msg = problem(options=(("HF_TOKEN", "hf_abc"),))
    assert "Secret 'hf-token'" in msg and "hf_abc" not in msg


def test_every_problem_listed_at_once():
    msg = problem(image="", min_replicas=4, max_replicas=1, edge="haproxy")
    assert msg.startswith("the EKS spec has 3 problems")
    assert "image is missing" in msg and "--edge 'haproxy'" in msg


def test_gpu_type_picks_cheapest_instance_with_enough_gpus(prices):
    r = resolve(EksSpec(image=IMAGE, gpu_type="L40S", gpus_per_replica=4), prices)
    assert r.instance.name == "g6e.12xlarge"
    assert r.tensor_parallel_size == 4 and r.replicas_per_node == 1


def test_defaults_fill_from_catalogue(prices):
    r = resolve(EksSpec(image=IMAGE, instance_type="ml.g5.12xlarge", tensor_parallel_size=2), prices)
    assert (r.instance.name, r.gpus_per_replica, r.pipeline_parallel_size) == ("g5.12xlarge", 4, 2)
    assert r.rate_limit_burst == 5 * r.rate_limit_rps
    assert r.karpenter_gpu_name == "a10g"


def test_ray_llm_needs_no_image_and_says_an_image_is_unused(prices):
    assert resolve(EksSpec(engine="rayservice", serve_app="ray-llm"), prices).warnings == ()
    r = resolve(EksSpec(engine="rayservice", serve_app="ray-llm", image=IMAGE), prices)
    assert any("--image is not used by --engine rayservice" in w for w in r.warnings)


def test_ray_proxy_is_checked_against_the_engine_and_the_rays_release(prices):
    assert resolve(EksSpec(engine="rayservice", image=IMAGE, ray_proxy="haproxy"),
                   prices).ray_proxy == "haproxy"
    with pytest.raises(BadInput, match="--ray-proxy haproxy sets what fronts Ray Serve's "
                                       "ingress: it needs --engine rayservice"):
        resolve(EksSpec(image=IMAGE, ray_proxy="haproxy"), prices)
    with pytest.raises(BadInput, match=r"--ray-proxy haproxy needs Ray 2.56 or later; "
                                       r"--serve-app ray-llm runs Ray 2.50.1"):
        resolve(EksSpec(engine="rayservice", serve_app="ray-llm", ray_proxy="haproxy"), prices)
    with pytest.raises(BadInput, match="--ray-proxy 'nginx' is not one of serve, haproxy"):
        resolve(EksSpec(engine="rayservice", image=IMAGE, ray_proxy="nginx"), prices)


def test_ray_ingress_replicas_size_the_byo_application_only(prices):
    assert resolve(EksSpec(engine="rayservice", image=IMAGE, ray_ingress_replicas=0),
                   prices).ray_ingress_replicas == 0
    with pytest.raises(BadInput, match="--ray-ingress-replicas 2 sizes the byo Serve "
                                       "application's ingress: it needs --engine rayservice"):
        resolve(EksSpec(image=IMAGE, ray_ingress_replicas=2), prices)
    with pytest.raises(BadInput, match="--ray-ingress-replicas -1 must be a whole number >= 0"):
        resolve(EksSpec(engine="rayservice", image=IMAGE, ray_ingress_replicas=-1), prices)
    with pytest.raises(BadInput, match="--ray-ingress-replicas 0 with --adapter"):
        resolve(EksSpec(engine="rayservice", image=IMAGE, ray_ingress_replicas=0,
                        adapters=(("a1", "s3://acme-adapters/llm/a1"),)), prices)


def test_the_byo_serve_app_runs_on_the_projects_image(prices):
    with pytest.raises(BadInput, match="image is missing"):
        resolve(EksSpec(engine="rayservice"), prices)
    assert resolve(EksSpec(engine="rayservice", image=IMAGE), prices).warnings == ()
    with pytest.raises(BadInput, match="--serve-app ray-llm applies to --engine rayservice only"):
        resolve(EksSpec(image=IMAGE, serve_app="ray-llm"), prices)
    with pytest.raises(BadInput, match="--serve-app 'llm' is not one of byo, ray-llm"):
        resolve(EksSpec(engine="rayservice", image=IMAGE, serve_app="llm"), prices)
    # Adapters: the byo application multiplexes them from any S3 folders.
    assert resolve(EksSpec(engine="rayservice", image=IMAGE, adapters=(
        ("a1", "s3://acme-adapters/llm/a1"), ("a2", "s3://other-bucket/x"))), prices).lora
