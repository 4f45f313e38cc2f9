"""The VllmTuning custom resource: pydantic models of spec and status.

The models are the single source of truth for the resource's shape: the CRD
in ``crds/`` is generated from them (``vllm-autotuner crd``), the controller
parses objects with them, and the decision core reads the spec through them.
"""

from vllm_autotuner.api.resource import API_VERSION, GROUP, KIND, PLURAL, VERSION, VllmTuning
from vllm_autotuner.api.spec import (
    SLO,
    Bounds,
    EngineSpec,
    Knobs,
    LatencyTarget,
    Mode,
    PrometheusSpec,
    RolloutSpec,
    Schedule,
    Strategy,
    TargetRef,
    Tier,
    TierMatch,
    TimeWindow,
    TrafficSpec,
    VllmTuningSpec,
)
from vllm_autotuner.api.status import (
    Condition,
    ConditionStatus,
    ConditionType,
    CurrentKnobs,
    DecisionAction,
    DecisionRecord,
    FailedConfig,
    KnobSource,
    LearnedOptimum,
    Measurement,
    ObservedTraffic,
    Recommendation,
    Rollout,
    RolloutPhase,
    VllmTuningStatus,
)

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "VllmTuning",
    "SLO", "Bounds", "EngineSpec", "Knobs", "LatencyTarget", "Mode", "PrometheusSpec", "RolloutSpec",
    "Schedule", "Strategy", "TargetRef", "Tier", "TierMatch", "TimeWindow", "TrafficSpec", "VllmTuningSpec",
    "Condition", "ConditionStatus", "ConditionType", "CurrentKnobs", "DecisionAction", "DecisionRecord",
    "FailedConfig", "KnobSource", "LearnedOptimum", "Measurement", "ObservedTraffic", "Recommendation", "Rollout",
    "RolloutPhase", "VllmTuningStatus",
]
