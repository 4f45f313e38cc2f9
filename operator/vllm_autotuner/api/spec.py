"""The VllmTuning spec: what a platform team asks the operator to do.

Every field has a description because the CRD (and so ``kubectl explain``) is
generated from these models. Rules that one field cannot express (min <= max,
a preset that vLLM would refuse) are CEL rules attached to the model that owns
both fields, so the API server rejects the object at admission. The models
check the same rules (``_refuse``; names unique in a list, as a list-map
keyed on them is), so that a spec built or read outside admission (``recommend
-f``, the simulator, an object stored before a rule was added) is refused in
the same words.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    TypeAdapter,
    WithJsonSchema,
    field_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from vllm_autotuner.api.types import (
    LABEL_NAME_PATTERN,
    CronExpression,
    Duration,
    LabelName,
    TimeZoneName,
    duration_seconds,
)

#: JSON Schema keyword of a field whose value is put over another's (``SpecModel.overlaid``): the CRD gives the
#: fields within it no defaults, so those a person leaves out stay out, and are the other's.
OVERLAY = "x-overlay"

#: Largest values the API accepts; far above any GPU's real limits, they only
#: catch typos (an extra zero) before they reach a Deployment.
MAX_BATCHED_TOKENS = 1_048_576
MAX_SEQS = 16_384


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    """One ``x-kubernetes-validations`` entry.

    A rule on an object whose fields have defaults guards them with has():
    the apiserver also checks the CRD's own ``default: {}`` against the rule,
    without filling in the nested defaults first, and refuses the CRD if the
    rule fails there ("no such key").
    """
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _refuse(broken: bool, rule: dict[str, Any]) -> None:
    """A model's own check of one of its CEL rules (``rule``, from ``cel``): raises its message when ``broken``."""
    if broken:
        raise ValueError(rule["message"])


def _given(model: BaseModel, *fields: str) -> bool:
    """CEL's ``has()`` for ``fields`` of ``model``: written, not defaulted. The apiserver fills defaults in before
    its rules run (except in an overlay), so it checks what the model checks, and more (``Bounds.problems``)."""
    return set(fields) <= model.model_fields_set


def _unique_names(entries: list[Any]) -> list[Any]:
    """Entries of a list-map keyed on ``name`` (``x-kubernetes-list-map-keys``), whose names the apiserver keeps
    unique."""
    names = [entry.name for entry in entries]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:
        raise ValueError(f"Duplicate value: name {repeated!r} is given twice; each entry needs its own")
    return entries


def _named_list(most: int) -> Any:
    """The Field of a list of at most ``most`` named entries: a list-map keyed on the name (``_unique_names``)."""
    return Field(default_factory=list, max_length=most,
                 json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})


def bounded_duration(why: str, least: str | None = None, most: str | None = None) -> Any:
    """A Duration of at least ``least`` and at most ``most`` (either may be absent), refused outside that (``why``
    says what the bounds are for) at admission, by a CEL rule, and by the model, for specs built in Python (the
    simulator, the benchmark)."""
    bounds = [(op, words, value) for op, words, value in ((">=", "at least", least), ("<=", "at most", most))
              if value is not None]
    message = "must be " + " and ".join(f"{words} {value}" for _, words, value in bounds) + f": {why}"
    low = duration_seconds(least) if least is not None else -math.inf
    high = duration_seconds(most) if most is not None else math.inf

    def check(value: str) -> str:
        if not low <= duration_seconds(value) <= high:
            raise ValueError(message)
        return value

    rule = " && ".join(f"duration(self) {op} duration('{value}')" for op, _, value in bounds)
    return Annotated[Duration, AfterValidator(check),
                     Field(json_schema_extra={"x-kubernetes-validations": [cel(rule, message)]})]


QueryTimeout = bounded_duration("a query takes some time", "100ms")
QueryOffset = bounded_duration("the window's newest samples must be younger than the staleness limit (90s at least)",
                               most="1m")
ObservationWindow = bounded_duration("rates need two scrapes in the window", "2s")
EvaluationInterval = bounded_duration("the operator evaluates at most once a second", "1s")
ProgressDeadline = bounded_duration("a shorter one fails every rollout before a pod can start", "10s")


class SpecModel(BaseModel):
    """Base of spec models: camelCase in the resource, snake_case in Python, no unknown fields."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    def overlaid(self, override: Self | None) -> Self:
        """This model with the fields ``override`` was given (at any depth) put over it: a schedule's bounds or
        SLO over the spec's, so a field a schedule leaves out is the spec's, not the field's default."""
        if override is None:
            return self
        update = {}
        for name in override.model_fields_set:
            value, under = getattr(override, name), getattr(self, name)
            update[name] = under.overlaid(value) if isinstance(under, SpecModel) and isinstance(
                value, SpecModel) else value
        return self.model_copy(update=update)


#: Most extra label matchers on the target's series.
MAX_LABEL_MATCHERS = 16
#: Most extra HTTP headers on the queries to Prometheus.
MAX_HEADERS = 8
#: An HTTP header name: a token of RFC 9110, in the letters, digits and dashes header names use.
HEADER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9-]*$"
_AUTHORIZATION = ("credentials go in bearerTokenSecretRef or basicAuth (the operator's own in "
                  "--prometheus-bearer-token-file), not in an Authorization header")


def _not_authorization(name: str) -> str:
    if name.lower() == "authorization":
        raise ValueError(_AUTHORIZATION)
    return name


HeaderName = Annotated[str, Field(pattern=HEADER_NAME_PATTERN, max_length=128), AfterValidator(_not_authorization)]
#: A header value on one line (a line break would start another header).
HEADER_VALUE_PATTERN = r"^[^\r\n]*$"
HeaderValue = Annotated[str, Field(pattern=HEADER_VALUE_PATTERN, max_length=1024)]
#: What spec.prometheus.headers takes, for the operator's own headers too (``--prometheus-header``).
Headers = TypeAdapter(dict[HeaderName, HeaderValue])

BatchedTokens = Annotated[int, Field(ge=1, le=MAX_BATCHED_TOKENS)]
NumSeqs = Annotated[int, Field(ge=1, le=MAX_SEQS)]


#: What vLLM checks of the two knobs at start-up.
_VLLM_ACCEPTS = cel("self.maxNumBatchedTokens >= self.maxNumSeqs",
                    "maxNumBatchedTokens must be >= maxNumSeqs (vLLM refuses to start otherwise)")


class Knobs(SpecModel):
    """A value for each of vLLM's two batching knobs (the status records what ran, refused or not: only a preset
    in the spec, ``Preset``, is checked)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_VLLM_ACCEPTS]})

    max_num_batched_tokens: BatchedTokens
    """--max-num-batched-tokens: the token budget of one engine step (decodes plus prefill chunks)."""
    max_num_seqs: NumSeqs
    """--max-num-seqs: the most requests the engine runs at once."""

    def __str__(self) -> str:
        return f"tokens={self.max_num_batched_tokens} seqs={self.max_num_seqs}"


def _accepted(knobs: Knobs) -> Knobs:
    _refuse(knobs.max_num_batched_tokens < knobs.max_num_seqs, _VLLM_ACCEPTS)
    return knobs


#: Knobs a spec asks for (a schedule's, a tier's): ones vLLM accepts.
Preset = Annotated[Knobs, AfterValidator(_accepted)]


class TargetKind(StrEnum):
    DEPLOYMENT = "Deployment"


#: A transition rule (on update only): a status' measurements, learned configs, failed configs and rollout in
#: progress belong to the Deployment they were taken on, and the model fitted on one model or GPU would be applied
#: to another's. A Deployment re-created under the same name keeps them (the same workload, most likely).
_SAME_TARGET = cel("self == oldSelf", "targetRef.name cannot change: what this tuning has measured and learned "
                   "belongs to its Deployment; to tune another Deployment, create a VllmTuning for it (and delete "
                   "this one)")


class TargetRef(SpecModel):
    """The workload that runs vLLM, in the VllmTuning's namespace."""

    api_version: str = "apps/v1"
    """API version of the target; apps/v1 for Deployments."""
    kind: TargetKind = TargetKind.DEPLOYMENT
    """Kind of the target. Only Deployment is supported."""
    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                      json_schema_extra={"x-kubernetes-validations": [_SAME_TARGET]})
    """Name of the Deployment. It cannot change: what the tuning has measured, learned and seen fail belongs to this Deployment; to tune another, create a VllmTuning for it."""
    container: str | None = Field(default=None, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Container that runs vLLM. Default: the container whose command runs vLLM (vllm serve or the OpenAI api_server module)."""
    ignore_controller: bool = False
    """Change the Deployment even though another object controls it (a controller ownerReference, kubectl describe's Controlled By: a KServe InferenceService, an operator's custom resource). Its controller usually renders the Deployment and puts the args back after every change, so by default the operator then only recommends; set this only when it leaves the vLLM container's args alone."""


class Mode(StrEnum):
    AUTO = "Auto"
    RECOMMEND = "Recommend"
    PAUSED = "Paused"


class SecretKeyRef(SpecModel):
    """A key of a Secret in the VllmTuning's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the Secret."""
    key: str = Field(min_length=1, max_length=253)
    """Key within the Secret."""


class BasicAuth(SpecModel):
    """HTTP basic authentication, user name and password each from a key of a Secret (as the Prometheus
    Operator's basicAuth)."""

    username: SecretKeyRef
    """Secret key holding the user name (Grafana Cloud: the instance ID)."""
    password: SecretKeyRef
    """Secret key holding the password (Grafana Cloud: an access token)."""


_ONE_CREDENTIAL = cel("!has(self.basicAuth) || !has(self.bearerTokenSecretRef)",
                      "set bearerTokenSecretRef or basicAuth, not both: each is an Authorization header")


class PrometheusSpec(SpecModel):
    """Where the vLLM metrics are, and how to select the target's series."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_ONE_CREDENTIAL]})

    url: str | None = Field(default=None, pattern=r"^https?://[^\s]+$")
    """Base URL of the Prometheus HTTP API, e.g. http://prometheus.monitoring:9090. Default: the operator's --prometheus-url setting."""
    label_matchers: Annotated[
        dict[LabelName, Annotated[str, Field(max_length=1024)]],
        # Kubernetes schemas have no propertyNames: a CEL rule checks the keys at admission
        WithJsonSchema({
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": 1024},
            "maxProperties": MAX_LABEL_MATCHERS,
            "x-kubernetes-validations": [cel(f"self.all(k, k.matches('{LABEL_NAME_PATTERN}'))",
                                             "keys must be Prometheus label names ([a-zA-Z_][a-zA-Z0-9_]*)")],
        }),
    ] = Field(default_factory=dict, max_length=MAX_LABEL_MATCHERS)
    """Extra exact-match label matchers added to every query, e.g. {cluster: prod}, for a Prometheus that holds several clusters."""
    namespace_label: LabelName = "namespace"
    """Name of the label that carries the pod's namespace on the vLLM series."""
    pod_label: LabelName = "pod"
    """Name of the label that carries the pod name on the vLLM series."""
    bearer_token_secret_ref: SecretKeyRef | None = None
    """Secret holding a bearer token sent as 'Authorization: Bearer ...' (e.g. for a managed Prometheus)."""
    basic_auth: BasicAuth | None = None
    """User name and password sent as HTTP basic authentication (a Prometheus whose web config sets basic_auth_users, Grafana Cloud, a proxy in front of Prometheus). Not with bearerTokenSecretRef."""
    headers: Annotated[
        dict[HeaderName, HeaderValue],
        # Kubernetes schemas have no propertyNames: CEL rules check the keys at admission
        WithJsonSchema({
            "type": "object",
            "additionalProperties": {"type": "string", "maxLength": 1024, "pattern": HEADER_VALUE_PATTERN},
            "maxProperties": MAX_HEADERS,
            "x-kubernetes-validations": [
                cel(f"self.all(k, k.matches('{HEADER_NAME_PATTERN}'))",
                    "keys must be HTTP header names (letters, digits and dashes)"),
                cel("self.all(k, !k.matches('(?i)^authorization$'))", _AUTHORIZATION),
            ],
        }),
    ] = Field(default_factory=dict, max_length=MAX_HEADERS)
    """HTTP headers sent with every query, e.g. {X-Scope-OrgID: team-a}: the tenant of a multi-tenant Grafana Mimir, Cortex or Thanos (several tenants at once in Mimir: team-a|team-b). Their values are no secret (they show in the resource); credentials go in bearerTokenSecretRef or basicAuth."""
    ca_secret_ref: SecretKeyRef | None = None
    """Secret holding the PEM CA bundle that signs the Prometheus server certificate."""
    timeout: QueryTimeout = "10s"
    """Timeout of one Prometheus query."""
    query_offset: QueryOffset = "2s"
    """How far before each evaluation its window ends: time for the newest scrapes to be stored, so a window reads the same whenever it is queried again (a scrape in flight at the evaluation would otherwise be missing from it, and not from a later query). Raise it for a store that receives samples late (remote write: Thanos Receive, Mimir, a managed Prometheus: 30s to 1m); it counts towards the staleness limit (three evaluation intervals, at least 90s)."""

    @model_validator(mode="after")
    def _one_credential(self) -> Self:
        _refuse(self.basic_auth is not None and self.bearer_token_secret_ref is not None, _ONE_CREDENTIAL)
        return self


class LatencyTarget(SpecModel):
    """A latency objective: the given quantile must stay at or below the given seconds."""

    quantile: float = Field(default=0.95, gt=0, lt=1)
    """Quantile of the latency distribution over the observation window, e.g. 0.95 for p95."""
    seconds: float = Field(gt=0, le=3600)
    """Target for that quantile, in seconds."""


class SLO(SpecModel):
    """Latency objectives. The operator maximises throughput only among configs that meet them."""

    ttft: LatencyTarget = LatencyTarget(quantile=0.95, seconds=2.0)
    """Time to first token (vllm:time_to_first_token_seconds), queueing included."""
    itl: LatencyTarget = LatencyTarget(quantile=0.95, seconds=0.1)
    """Inter-token latency (vllm:inter_token_latency_seconds) while a response streams."""


_ORDERED = cel("!has(self.min) || !has(self.max) || self.min <= self.max",
               "min must be <= max (a min left out is its default, given by kubectl explain)")


class IntRange(SpecModel):
    """An inclusive range."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_ORDERED]})

    min: int
    max: int

    def disordered(self, defaults: bool = True) -> bool:
        """Whether min is above max; ``defaults=False``: only where both were written (CEL's ``has()``)."""
        return (defaults or _given(self, "min", "max")) and self.min > self.max

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        _refuse(self.disordered(defaults=False), _ORDERED)
        return self


class TokenBounds(IntRange):
    """Inclusive range for --max-num-batched-tokens."""

    min: BatchedTokens = 256
    """Smallest token budget the operator may set."""
    max: BatchedTokens = 32_768
    """Largest token budget the operator may set."""


class SeqBounds(IntRange):
    """Inclusive range for --max-num-seqs."""

    min: NumSeqs = 8
    """Smallest max-num-seqs the operator may set."""
    max: NumSeqs = 1024
    """Largest max-num-seqs the operator may set."""


_SEQS_FIT = cel(
    "!has(self.maxNumBatchedTokens) || !has(self.maxNumSeqs) || !has(self.maxNumBatchedTokens.min)"
    " || !has(self.maxNumSeqs.min) || self.maxNumBatchedTokens.min >= self.maxNumSeqs.min",
    "maxNumBatchedTokens.min must be >= maxNumSeqs.min: vLLM needs max_num_batched_tokens >= max_num_seqs",
    ".maxNumBatchedTokens.min",
)


class Bounds(SpecModel):
    """The box the operator searches in; it never sets a value outside it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_SEQS_FIT]})

    max_num_batched_tokens: TokenBounds = TokenBounds()
    """Range for --max-num-batched-tokens."""
    max_num_seqs: SeqBounds = SeqBounds()
    """Range for --max-num-seqs."""

    def seqs_unfit(self, defaults: bool = True) -> bool:
        """Whether the least budget is below the least max_num_seqs; ``defaults=False``: only where both were
        written (CEL's ``has()``)."""
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        given = _given(self, "max_num_batched_tokens", "max_num_seqs") and _given(tokens, "min") and _given(seqs, "min")
        return (defaults or given) and tokens.min < seqs.min

    @model_validator(mode="after")
    def _seqs_fit(self) -> Self:
        _refuse(self.seqs_unfit(defaults=False), _SEQS_FIT)
        return self

    def problems(self) -> list[str]:
        """The CEL rules of these bounds, defaults included, for bounds put together from two
        (``SpecModel.overlaid``), which admission saw apart."""
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        found = [f"{name}.min {r.min} > {name}.max {r.max}" for name, r in (("maxNumBatchedTokens", tokens),
                                                                           ("maxNumSeqs", seqs)) if r.disordered()]
        if self.seqs_unfit():
            found.append(f"maxNumBatchedTokens.min {tokens.min} < maxNumSeqs.min {seqs.min} (vLLM needs "
                         f"max_num_batched_tokens >= max_num_seqs)")
        return found


class Strategy(StrEnum):
    ADAPTIVE = "Adaptive"
    TIERS = "Tiers"


#: A tier's bounds on one measure: (field, its name in the resource). A lower bound holds at it, an upper one below it.
_TIER_MEASURES = (("request_rate", "RequestRate"), ("concurrency", "Concurrency"), ("prompt_tokens", "PromptTokens"))
_TIER_RULES = {
    field: cel(f"!has(self.min{name}) || !has(self.max{name}) || self.min{name} < self.max{name}",
               f"min{name} must be below max{name}: no traffic would match the tier", f".max{name}")
    for field, name in _TIER_MEASURES
}


class TierMatch(SpecModel):
    """Conditions on the observed traffic, all of which must hold (an absent bound always holds)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": list(_TIER_RULES.values())})

    min_request_rate: float | None = Field(default=None, ge=0)
    """Requests per second (all pods of the target) at or above this."""
    max_request_rate: float | None = Field(default=None, ge=0)
    """Requests per second below this."""
    min_concurrency: float | None = Field(default=None, ge=0)
    """Mean running plus waiting requests per pod at or above this."""
    max_concurrency: float | None = Field(default=None, ge=0)
    """Mean running plus waiting requests per pod below this."""
    min_prompt_tokens: float | None = Field(default=None, ge=0)
    """Mean prompt length in tokens at or above this."""
    max_prompt_tokens: float | None = Field(default=None, ge=0)
    """Mean prompt length in tokens below this."""

    @model_validator(mode="after")
    def _matchable(self) -> Self:
        for field, rule in _TIER_RULES.items():
            low, high = getattr(self, f"min_{field}"), getattr(self, f"max_{field}")
            _refuse(low is not None and high is not None and low >= high, rule)
        return self


class Tier(SpecModel):
    """A user-defined traffic tier: when its conditions match, use its knobs."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Name of the tier, shown in status as the regime."""
    match: TierMatch = TierMatch()
    """Conditions on the observed traffic; tiers are tried in order and the first match wins. A tier in force (one whose knobs run: each of several tiers with the same knobs) stays until the traffic is clearly out of it: a factor 1.19 (a quarter of a power of two, as for Adaptive's regimes) below a minimum or above a maximum; the others match strictly, in order. Traffic crosses a boundary one way at the bound and the other way 1.19 past it, so traffic that hovers at a boundary does not swap two tiers' knobs, a rolling restart each. A tier whose own knobs move its measure by more than that (a small maxNumSeqs that queues requests into a higher concurrency tier, whose larger batches drain them back) needs a gap between the tiers' bounds as wide as the move: traffic in a gap matches no tier and changes no knobs."""
    knobs: Preset
    """Knob values for this tier."""


_TIERS_NEEDED = cel("!has(self.strategy) || self.strategy != 'Tiers' || (has(self.tiers) && size(self.tiers) > 0)",
                    "strategy Tiers needs at least one entry in tiers", ".tiers")


class TrafficSpec(SpecModel):
    """How the operator reads traffic and picks knobs outside schedule windows."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_TIERS_NEEDED]})

    strategy: Strategy = Strategy.ADAPTIVE
    """Adaptive: search online for the best knobs under the SLO. Tiers: map observed traffic to the knobs of the first matching tier."""
    window: ObservationWindow = "5m"
    """Observation window: metrics are aggregated over this much time, taken only under the current config."""
    evaluation_interval: EvaluationInterval = "30s"
    """How often the operator observes and decides."""
    min_requests: int = Field(default=50, ge=1, le=1_000_000)
    """Fewest completed requests in the window for an observation to count; fewer means hold."""
    tiers: Annotated[list[Tier], AfterValidator(_unique_names)] = _named_list(32)
    """Tiers for the Tiers strategy, tried in order; each has its own name."""

    @model_validator(mode="after")
    def _tiers_given(self) -> Self:
        _refuse(self.strategy == Strategy.TIERS and not self.tiers, _TIERS_NEEDED)
        return self


#: A window that closes when it opens would never be open.
_WINDOW_RULE = cel("self.start != self.end", "start and end must differ", ".end")


class TimeWindow(SpecModel):
    """A named window of wall-clock time that recurs: open from each start to the next end."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_WINDOW_RULE]})

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Name of the window, shown in the status (a schedule's in status.activeSchedule, a freeze's in the holds it causes)."""
    time_zone: TimeZoneName = "UTC"
    """IANA time zone the cron expressions are read in, e.g. Europe/Berlin; daylight saving time is followed."""
    start: CronExpression
    """Cron expression (minute hour day-of-month month day-of-week) at which the window opens, e.g. '0 22 * * *'."""
    end: CronExpression
    """Cron expression at which the window closes, e.g. '0 6 * * *'; windows may cross midnight."""

    @model_validator(mode="after")
    def _opens(self) -> Self:
        _refuse(self.start == self.end, _WINDOW_RULE)
        return self


_PRESET_OR_OVERRIDES = cel(
    "has(self.knobs) != (has(self.bounds) || has(self.slo))",
    "a schedule sets either knobs (a fixed preset) or overrides of bounds/slo, not both and not neither")


class Schedule(TimeWindow):
    """A time-of-day policy: between start and end, use a fixed preset or tighter bounds and SLOs."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_PRESET_OR_OVERRIDES, _WINDOW_RULE]})

    priority: int = Field(default=0, ge=-1000, le=1000)
    """When windows overlap, the highest priority wins; on a tie, the earlier entry in the list. A window that only overrides bounds or slo says nothing of the knobs: an open preset window it outranks keeps its preset."""
    knobs: Preset | None = None
    """A fixed preset used for the whole window. When it closes, the knobs the traffic policy would choose for the traffic then (a tier's, a config Adaptive measured best for it) where a usable window tells, else the knobs from before the window; but when a window that replaces those knobs (another preset, bounds that leave them out, this window again) begins its pre-roll within the rollout lead (status.rolloutSeconds plus a margin), the preset stays until then, rather than restart the pods twice in a row."""
    bounds: Bounds | None = Field(default=None, json_schema_extra={OVERLAY: True})
    """Bounds in force during the window, field by field over spec.bounds (a field left out is spec.bounds'); the traffic policy keeps running inside them."""
    slo: SLO | None = Field(default=None, json_schema_extra={OVERLAY: True})
    """SLO in force during the window, field by field over spec.slo (a field left out is spec.slo's)."""
    pre_roll: Duration | None = None
    """How long before the window start the change begins, so new pods are Ready when it opens. Default: the last rolling restart's duration (status.rolloutSeconds) plus a margin, or 5m before one was timed."""

    @model_validator(mode="after")
    def _preset_or_overrides(self) -> Self:
        _refuse((self.knobs is not None) == (self.bounds is not None or self.slo is not None), _PRESET_OR_OVERRIDES)
        return self

    @field_serializer("bounds", "slo")
    def _as_given(self, value: SpecModel | None, info: SerializationInfo) -> Any:
        """The fields of an overlay a person gave, and no default: written out, a default would take the place
        of the spec's field beneath it."""
        if value is None:
            return None
        return value.model_dump(mode=info.mode, by_alias=info.by_alias, exclude_none=info.exclude_none,
                                exclude_unset=True)


class RolloutSpec(SpecModel):
    """Guardrails on changes: each change is a rolling restart of the vLLM pods and costs capacity."""

    cooldown: Duration = "15m"
    """Least time between the end of one rollout and the start of the next traffic-driven change."""
    max_rollouts_per_day: int = Field(default=8, ge=0, le=288)
    """Most rollouts in any 24 hours, schedule changes and rollbacks included (a traffic change keeps room for its own rollback; at 1, a rollback may be the one past it; a schedule change counts the last 23 hours, so that it keeps its wall-clock time on the day clocks go forward); 0 forbids changes."""
    min_improvement_percent: float = Field(default=5.0, ge=0, le=1000)
    """Least expected SLO-goodput gain, net of the capacity a rolling restart costs, for a traffic-driven change."""
    max_step_factor: float = Field(default=2.0, ge=1.1, le=16)
    """Largest factor by which one change of the Adaptive search may raise a knob, or lower it below the requests running. Tiers go straight to the matching tier's knobs."""
    settle_time: Duration = "2m"
    """Time after a rollout before metrics of the new config count (warm-up, queue drain)."""
    progress_deadline: ProgressDeadline = "10m"
    """A rollout that makes no progress for this long (no pod of the new config created or become available; time paused does not count), or whose pods crash-loop, is rolled back and its config recorded as failed. The deadline in force is never shorter than what the Deployment itself gives a pod: its progressDeadlineSeconds (600s by default), its minReadySeconds plus 2m, nor, while vLLM loads in a new pod, the vLLM container's startupProbe budget (initialDelaySeconds + failureThreshold x periodSeconds + timeoutSeconds) plus 2m; when the strategy stops old pods first (maxSurge 0, Recreate), an old pod's terminationGracePeriodSeconds is added to the longest, loading or not (a rollout with no pod of its template created yet is not recorded as failed); a verdict names the deadline it was taken at and where it came from."""
    rollback_on_regression: bool = True
    """After settling, compare with the window before the change and roll back a measured regression. Adaptive's changes only: a tier's or a schedule's knobs are a person's choice for other traffic or another hour, with no window of the same traffic under the old knobs to compare with."""
    regression_tolerance_percent: float = Field(default=10.0, ge=0, le=100)
    """How much worse SLO goodput may be after a change before it counts as a regression (and two points of
    attainment more: window-to-window noise)."""
    freezes: Annotated[list[TimeWindow], AfterValidator(_unique_names)] = _named_list(16)
    """Change freezes (a business peak, a release): no change starts while one is open, nor so shortly before one opens that its rolling restart would still run in it (the last rolling restart's duration plus a margin, or 5m), schedule windows' changes included; they wait for its end. A rollback of the operator's own failed or regressed change still runs."""


class EngineSpec(SpecModel):
    """Facts about the vLLM engine the operator cannot always read from the pod spec."""

    vllm_version: str | None = Field(default=None, max_length=64,
                                     pattern=r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([-.+][0-9A-Za-z.+-]+)?$")
    """vLLM version, used to pick the table of default knob values when the flags are absent, e.g. 0.11.0, v0.11.0-cu128 or a build's 0.10.2.dev5+g1234567. Default: read from the image tag, else the newest table."""
    gpu_memory_gib: int | None = Field(default=None, ge=1, le=4096)
    """Memory of one GPU in GiB, used to pick vLLM's default knob values when the flags are absent. Default: read from the labels of the pod template's nodeSelector or of the node a pod runs on: nvidia.com/gpu.memory (GPU Feature Discovery), else cloud.google.com/gke-gpu-partition-size (GKE's multi-instance GPU partitions: a 1g.10gb slice has about 10 GiB), else cloud.google.com/gke-accelerator (GKE: nvidia-l4, nvidia-h100-80gb, ...) or karpenter.k8s.aws/instance-gpu-memory (Karpenter on EKS); else assumed >= 70 GiB (and below 160 GiB)."""


class VllmTuningSpec(SpecModel):
    """Desired tuning of one vLLM Deployment."""

    target_ref: TargetRef
    """The Deployment that runs vLLM, in this namespace."""
    mode: Mode = Mode.AUTO
    """Auto: apply changes. Recommend: compute and report only (status and Events), never patch. Paused: observe and report only."""
    prometheus: PrometheusSpec = PrometheusSpec()
    """Prometheus that scrapes the vLLM pods."""
    slo: SLO = SLO()
    """Latency objectives the tuned config must meet."""
    bounds: Bounds = Bounds()
    """Range each knob may take."""
    traffic: TrafficSpec = TrafficSpec()
    """Traffic observation and the traffic-driven policy."""
    schedules: Annotated[list[Schedule], AfterValidator(_unique_names)] = _named_list(16)
    """Time-of-day policies; outside every window the traffic policy applies."""
    rollout: RolloutSpec = RolloutSpec()
    """Guardrails on rollouts."""
    engine: EngineSpec = EngineSpec()
    """Facts about the engine used when the knobs are not set on the command line."""

    @model_validator(mode="after")
    def _bounds_with_defaults(self) -> Self:
        """spec.bounds is no overlay: the apiserver fills its defaults in before its rules run, and so does this
        (a maxNumSeqs.max of 4 is below the min of 8 a person left out)."""
        for found in (self.bounds.max_num_batched_tokens, self.bounds.max_num_seqs):
            _refuse(found.disordered(), _ORDERED)
        _refuse(self.bounds.seqs_unfit(), _SEQS_FIT)
        return self
