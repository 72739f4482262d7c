"""The SageMaker real-time endpoint that levels 2–5 share, in two halves: ``plan`` (pure: the
requests a rung's endpoint needs, names, uploads, cost) and ``apply`` (sending them: create,
wait, roll back, status, down, invoke). A rung decides only *what* goes into the model.

A SageMaker real-time endpoint is three resources made in order — a model (image + env +
artifacts), an endpoint config (instance type and count) and the endpoint — plus, optionally,
an application-autoscaling target and policy on its variant (read from the flags by
``autoscaling``).
"""


def is_cloud_run(args) -> bool:
    """Whether the flags describe a SageMaker endpoint (a plan of one, its status, taking it
    down, or --target aws/emulator) rather than a server on this machine."""
    return bool(args.plan or args.status or args.down or args.target != "local")
