"""The ``vllm-autotuner`` command.

One entry point for everything a person or a script runs: the operator
itself (``run``), a one-shot ``recommend``, the CRD generator (``crd``) and
the local simulated environment (``sim ...``). Sub-commands import their
modules lazily so that ``vllm-autotuner crd`` does not pay for kopf or the
simulator.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _cmd_crd(args: argparse.Namespace) -> int:
    from vllm_autotuner.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _env_list(name: str) -> list[str]:
    return [v for v in os.environ.get(name, "").split(",") if v]


def _cmd_run(args: argparse.Namespace) -> int:
    from vllm_autotuner.controller.operator import RunOptions, run
    from vllm_autotuner.controller.reconcile import OperatorSettings

    if bool(args.tls_cert_file) != bool(args.tls_key_file):
        args.parser.error("give --tls-cert-file and --tls-key-file together")
    if args.tls_cert_file and not args.metrics_auth:
        args.parser.error("--tls-cert-file serves /metrics over HTTPS only with --metrics-auth")

    options = RunOptions(
        settings=OperatorSettings(prometheus_url=args.prometheus_url, **_prometheus_access(args),
                                  naive_queries=args.naive_queries,
                                  max_concurrent_rollouts=args.max_concurrent_rollouts,
                                  rollout_pool_label=args.rollout_pool_label,
                                  recommend_only=args.recommend_only),
        namespaces=tuple(args.namespace or _env_list("WATCH_NAMESPACES")),
        http_host=args.http_host,
        http_port=args.http_port,
        leader_election=not args.no_leader_election,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        metrics_auth=args.metrics_auth,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        log_format=args.log_format,
        verbose=args.verbose,
    )
    return asyncio.run(run(options))


#: ``recommend``'s flags for the operator's own Prometheus, which a tuning that names its own does not use.
_OPERATOR_PROMETHEUS_FLAGS = ("prometheus", "prometheus_header", "prometheus_bearer_token_file", "prometheus_ca_file")
#: ``recommend``'s flags that describe a tuning where no manifest (-f) does; one not given is the spec's default.
_RECOMMEND_SPEC_FLAGS = ("deployment", "ttft", "itl", "quantile", "window")


def _cmd_recommend(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from vllm_autotuner.controller.recommend import read_manifest, recommend, render
    from vllm_autotuner.controller.reconcile import OperatorSettings

    given = [f"--{name}" for name in _RECOMMEND_SPEC_FLAGS if getattr(args, name) is not None]
    if args.filename is not None:
        if given:
            args.parser.error(f"-f takes the target, SLO and window from the manifest: drop {', '.join(given)}")
        try:
            namespace, spec = read_manifest(args.filename, args.namespace)
        except (OSError, ValueError) as exc:
            args.parser.error(str(exc))
        own = [f"--{name.replace('_', '-')}" for name in _OPERATOR_PROMETHEUS_FLAGS if getattr(args, name)]
        if (spec.get("prometheus") or {}).get("url"):
            if own:
                args.parser.error(f"{args.filename} sets spec.prometheus.url, reached with spec.prometheus's own "
                                  f"headers and credentials as the operator would: drop {', '.join(own)}")
        elif not args.prometheus:
            args.parser.error(f"{args.filename} sets no spec.prometheus.url: give --prometheus")
    else:
        missing = [flag for flag in ("--namespace", "--deployment", "--prometheus")
                   if getattr(args, flag[2:]) is None]
        if missing:
            args.parser.error(f"give -f MANIFEST, or {', '.join(missing)}")
        from vllm_autotuner.api import SLO

        slo = SLO().model_dump()  # the targets a flag leaves alone
        for name in ("ttft", "itl"):
            given = {"seconds": getattr(args, name), "quantile": args.quantile}
            slo[name].update({key: value for key, value in given.items() if value is not None})
        window = {} if args.window is None else {"traffic": {"window": args.window}}
        namespace, spec = args.namespace, {"targetRef": {"name": args.deployment}, "slo": slo, **window}
    try:
        report = asyncio.run(recommend(namespace, spec,
                                       OperatorSettings(prometheus_url=args.prometheus, **_prometheus_access(args))))
    except ValidationError as exc:
        args.parser.error(f"not a valid VllmTuning spec: {exc}")
    sys.stdout.write(render(report))
    return 0 if report.decision is not None else 1


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {number}")
    return number


#: A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _add_prometheus_access(parser: argparse.ArgumentParser, url_flag: str) -> None:
    """The flags that reach the Prometheus at ``url_flag`` past a login or into a tenant (``_prometheus_access``)."""
    parser.add_argument("--prometheus-header", type=_header, action="append", metavar="NAME=VALUE",
                        help=f"HTTP header sent to {url_flag}, e.g. X-Scope-OrgID=team-a for a Mimir or Cortex "
                             "tenant (repeatable; a VllmTuning's spec.prometheus.headers go over them)")
    parser.add_argument("--prometheus-bearer-token-file", metavar="PATH",
                        help=f"file holding a bearer token for {url_flag}, read at each evaluation (a rotated "
                             "token is taken up), e.g. the pod's ServiceAccount token for OpenShift's Thanos "
                             "Querier; a VllmTuning's own credentials win")
    parser.add_argument("--prometheus-ca-file", metavar="PATH",
                        help=f"file holding the PEM CA bundle of {url_flag}'s certificate; a VllmTuning's "
                             "spec.prometheus.caSecretRef wins")


def _prometheus_access(args: argparse.Namespace) -> dict[str, Any]:
    """OperatorSettings' fields from the flags of ``_add_prometheus_access``."""
    return {"prometheus_headers": tuple(sorted(dict(args.prometheus_header or ()).items())),
            "prometheus_bearer_token_file": args.prometheus_bearer_token_file,
            "prometheus_ca_file": args.prometheus_ca_file}


def _header(text: str) -> tuple[str, str]:
    """``NAME=VALUE``: an HTTP header as spec.prometheus.headers takes one."""
    from pydantic import ValidationError

    from vllm_autotuner.api.spec import Headers

    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is no NAME=VALUE")
    try:
        Headers.validate_python({name: value})
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc.errors()[0]['msg']}") from None
    return name, value


def _label_key(value: str) -> str:
    """A node label key, or "" for none."""
    if value and (not _LABEL_KEY.match(value) or len(value.partition("/")[0]) > 253):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Kubernetes label key (e.g. karpenter.sh/nodepool)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-autotuner",
        description="Keeps vLLM's --max-num-batched-tokens and --max-num-seqs tuned to live traffic.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    crd = sub.add_parser("crd", help="print the VllmTuning CustomResourceDefinition (YAML)")
    crd.set_defaults(func=_cmd_crd)

    run = sub.add_parser("run", help="run the operator")
    run.add_argument("--prometheus-url", default=os.environ.get("PROMETHEUS_URL"),
                     help="Prometheus for VllmTunings that set no spec.prometheus.url (env PROMETHEUS_URL)")
    _add_prometheus_access(run, "--prometheus-url")
    run.add_argument("--namespace", action="append",
                     help="watch only this namespace (repeatable; env WATCH_NAMESPACES, comma-separated); default all")
    run.add_argument("--http-host", default=None,
                     help="address of /metrics and /healthz (default: every address, IPv4 and IPv6)")
    run.add_argument("--http-port", type=int, default=8080, help="port of /metrics and /healthz")
    run.add_argument("--metrics-auth", action="store_true",
                     help="serve HTTPS, and /metrics only to callers whose bearer token the apiserver authenticates "
                          "(TokenReview) and lets get the non-resource URL /metrics (SubjectAccessReview); "
                          "/healthz stays open")
    run.add_argument("--tls-cert-file", metavar="PATH",
                     help="PEM certificate of the HTTPS server (with --metrics-auth and --tls-key-file), e.g. "
                          "cert-manager's tls.crt; default: a self-signed one made at start")
    run.add_argument("--tls-key-file", metavar="PATH", help="PEM key of --tls-cert-file")
    run.add_argument("--no-leader-election", action="store_true", help="act without holding the leader Lease")
    run.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                     help="namespace of the leader Lease (env POD_NAMESPACE)")
    run.add_argument("--lease-name", default="vllm-autotuner", help="name of the leader Lease")
    run.add_argument("--max-concurrent-rollouts", type=_non_negative, default=0, metavar="N",
                     help="at most N rollouts of tuned Deployments in progress at once, the operator's or anyone's: "
                          "changes (not rollbacks) wait for a slot, the longest waiting first; "
                          "0 (default) means no limit")
    run.add_argument("--rollout-pool-label", type=_label_key, default="", metavar="LABEL",
                     help="node label naming the node pools (e.g. karpenter.sh/nodepool, "
                          "cloud.google.com/gke-nodepool): --max-concurrent-rollouts then holds per pool, the one a "
                          "target's pod template pins its pods to (nodeSelector, or required node affinity In one "
                          "value); a template that pins none shares the slots of every pool. Default: one pool")
    run.add_argument("--recommend-only", action="store_true",
                     help="every VllmTuning in mode Auto acts as in mode Recommend: recommendations in the status and "
                          "Events, no change to any Deployment (a rollback of the operator's own earlier change still "
                          "runs: it restores service). For a first install, or to stop all changes at once")
    run.add_argument("--log-format", choices=["json", "text"], default="json", help="log line format")
    run.add_argument("--verbose", action="store_true", help="debug logging")
    run.add_argument("--naive-queries", action="store_true",
                     help="one query per metric per tuning instead of shared ones (benchmark baseline only)")
    run.set_defaults(func=_cmd_run, parser=run)

    rec = sub.add_parser("recommend", help="print one recommendation from live data; changes nothing",
                         description="Evaluate once, as a VllmTuning in mode Recommend would, and print what it "
                                     "would do and why: for a VllmTuning manifest before it is applied (-f), or for "
                                     "a Deployment and SLO given as flags. Reads the Deployment with your "
                                     "kubeconfig's credentials (and any Secret the manifest names for Prometheus); "
                                     "writes nothing.")
    rec.add_argument("-f", "--filename", type=Path, help="a VllmTuning manifest, evaluated as written in mode "
                                                         "Recommend (its namespace, else --namespace)")
    rec.add_argument("--prometheus", help="Prometheus base URL (with -f: for a manifest that sets no "
                                          "spec.prometheus.url)")
    _add_prometheus_access(rec, "--prometheus")
    rec.add_argument("--namespace", help="namespace of the vLLM Deployment")
    rec.add_argument("--deployment", help="name of the vLLM Deployment (without -f)")
    rec.add_argument("--ttft", type=float, help="TTFT target in seconds (without -f; default 2.0)")
    rec.add_argument("--itl", type=float, help="inter-token latency target in seconds (without -f; default 0.1)")
    rec.add_argument("--quantile", type=float, help="SLO quantile (without -f; default 0.95)")
    rec.add_argument("--window", help="observation window (without -f; default 5m)")
    rec.set_defaults(func=_cmd_recommend, parser=rec)

    from vllm_autotuner.sim import cli as sim_cli

    sim_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
