"""The VllmTuning resource as a whole: identity, metadata and (de)serialisation.

Everything that names the API (group, version, kind, plural) is defined here
once; the CRD generator, the controller and the tests import it from here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from vllm_autotuner.api.spec import VllmTuningSpec
from vllm_autotuner.api.status import VllmTuningStatus

GROUP = "autotuner.vllm-tuning.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "VllmTuning"
PLURAL = "vllmtunings"
SINGULAR = "vllmtuning"
SHORT_NAMES = ["vlt"]
CATEGORIES = ["all", "vllm"]
CRD_NAME = f"{PLURAL}.{GROUP}"


class VllmTuning(BaseModel):
    """Keeps vLLM's --max-num-batched-tokens and --max-num-seqs of one Deployment at the best values for its live traffic and the time of day."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: VllmTuningSpec
    status: VllmTuningStatus = VllmTuningStatus()

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> VllmTuning:
        """Parse an object as the API server returns it."""
        return cls.model_validate(obj)

    def to_object(self) -> dict[str, Any]:
        """The object as the API server takes it (camelCase, no nulls)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
