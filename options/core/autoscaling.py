"""The autoscalers' behaviour that the deploy commands set and the simulator simulates: one set
of numbers and names.

``infra/eks`` writes ``HPA_BEHAVIOUR`` into the HorizontalPodAutoscaler's ``behavior``;
``cost.simulate``'s queue-depth policy applies the same limits, so what ``cost simulate`` predicts
for rung 6 is what the rendered manifests do. ``SAGEMAKER_METRIC_NAMES`` are the predefined metrics
``options.deploy --autoscale-metric [--scale-to-zero]`` registers and the simulator names.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HpaBehaviour:
    # Queues build fast: add replicas at once (no stabilisation), a GPU pod takes minutes to be ready.
    scale_up_pods: int = 2                  # at most this many pods added ...
    scale_up_period_s: int = 60             # ... per this many seconds
    # Losing a loaded replica is expensive: wait out short dips before removing one.
    scale_down_stabilization_s: int = 600   # the highest recommendation of this window wins
    scale_down_pods: int = 1                # at most this many pods removed ...
    scale_down_period_s: int = 300          # ... per this many seconds


HPA_BEHAVIOUR = HpaBehaviour()

# Application Auto Scaling's predefined SageMaker metrics, by (--autoscale-metric, what scales):
# invocations a minute (one datapoint a minute) or requests in flight (high resolution: every
# 10 s, so a burst is seen sooner), on a variant's instances or, with --scale-to-zero, an
# inference component's copies.
SAGEMAKER_METRIC_NAMES = {
    ("invocations", "instances"): "SageMakerVariantInvocationsPerInstance",
    ("concurrency", "instances"): "SageMakerVariantConcurrentRequestsPerModelHighResolution",
    ("invocations", "copies"): "SageMakerInferenceComponentInvocationsPerCopy",
    ("concurrency", "copies"): "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution",
}
