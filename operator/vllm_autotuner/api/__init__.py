"""The VllmTuning custom resource: pydantic models of spec and status.

The models are the single source of truth for the resource's shape: the CRD
in ``crds/`` is generated from them (``vllm-autotuner crd``), the controller
parses objects with them, and the decision core reads the spec through them.
"""
