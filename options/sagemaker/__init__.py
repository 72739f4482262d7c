"""The SageMaker real-time endpoint that levels 2–5 share, in two halves: ``plan`` (pure: the
requests a rung's endpoint needs, names, uploads, cost) and ``apply`` (sending them: create,
wait, roll back, status, down, invoke). A rung decides only *what* goes into the model.

A SageMaker real-time endpoint is three resources made in order — a model (image + env +
artifacts), an endpoint config (instance type and count) and the endpoint — plus, optionally,
an application-autoscaling target and policy on its variant.
"""
