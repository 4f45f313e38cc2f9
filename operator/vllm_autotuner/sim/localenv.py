"""The local environment: a real Kubernetes control plane, a real Prometheus and the simulated GPU fleet.

The operator's whole job is Kubernetes API calls and PromQL, so the tests, the
end-to-end runs and the demo talk to the real servers, started here on
loopback: ``bin/testenv`` (etcd, kube-apiserver, kube-controller-manager and
kube-scheduler; ``make testenv`` builds it) and Debian's ``prometheus``, plus
``vllm-autotuner sim fleet`` (:mod:`vllm_autotuner.sim.fleet`: GPU nodes and a
kubelet that runs vLLM pods on the simulator), and the operator itself as a
local process (``start_operator``, for ``make demo``). Every start picks
free ports and its own directory, so two test sessions can run side by side.

Prometheus finds its scrape targets in file-based service discovery files,
one per writer (the simulated GPU fleet has its own; see
:func:`write_targets`). The entries carry the pod's namespace, name and
labels as the ``__meta_kubernetes_*`` labels that Kubernetes service
discovery would give (and the container's name), and the generated
configuration relabels them exactly as a production Prometheus does, so the
series look as they would in a real cluster.

``vllm-autotuner sim up`` / ``down`` (:func:`up`, :func:`down`) keep one such
environment running in the background, with its state under ``.local/``.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[3]
BIN = ROOT / "bin"
TESTENV = BIN / "testenv"
KUBECTL = BIN / "kubectl"
PROMETHEUS = Path("/usr/bin/prometheus")
STATE_DIR = ROOT / ".local"
FLEET_POOLS = ("llama3-8b-h100:4", "llama3-8b-l4:2")
"""The simulated GPU nodes `sim up` starts: room for a rolling update of a
2-replica Deployment on H100s, and memory-tight L4s."""
FLEET_TIME_SCALE = 0.1
"""`sim up`'s vLLM pods start in a tenth of the real time."""
FLEET_COMMAND = ("-m", "vllm_autotuner.cli", "sim", "fleet")
"""How :func:`start_fleet` runs the fleet (after the Python interpreter)."""

T = TypeVar("T")


class StartError(RuntimeError):
    """A server did not come up; the message says why and where its log is."""


def wait_until(predicate: Callable[[], T], timeout: float, description: str, interval: float = 0.2) -> T:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    An exception raised by the predicate counts as "not yet" (a server that is
    still starting refuses connections), except :class:`StartError`, which
    says that waiting longer cannot help. When ``timeout`` seconds have passed,
    raise :class:`TimeoutError` naming ``description`` and the last value or
    exception seen, which is usually what tells why.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
        except StartError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported on timeout
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {description}; last seen: {last!r}")
        time.sleep(interval)


def free_port() -> int:
    """A loopback port that was free a moment ago (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A server process started here, and the log that tells about it.

    Each server leads its own process group (so a terminal's Ctrl-C reaches
    it only through :meth:`stop`), and whatever it spawns stays in that group,
    which is how :meth:`stop` makes sure nothing is left behind.
    """

    name: str
    pid: int
    log: Path
    # Only in the process that started it: used to reap the exit status.
    process: subprocess.Popen | None = field(default=None, kw_only=True, repr=False, compare=False)

    def alive(self) -> bool:
        return _in_group(self.pid, self.pid)

    def stop(self, timeout: float = 60) -> None:
        """Ask the leader to stop (it stops its children), then make sure the group is gone."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        try:
            wait_until(lambda: not _group_alive(self.pid), timeout, f"{self.name} (pid {self.pid}) to exit")
        except TimeoutError:
            _kill_group(self.pid)
            wait_until(lambda: not _group_alive(self.pid), 10, f"{self.name} (pid {self.pid}) to die")
        if self.process is not None:
            self.process.wait()
            return
        # Started by an earlier `sim up`, the server is now init's child and
        # stays a zombie until init reaps it; wait a little for that so that
        # `ps` right after `sim down` shows nothing, but a lazy init is no error.
        try:
            wait_until(lambda: not Path(f"/proc/{self.pid}").exists(), 5, "init to reap it")
        except TimeoutError:
            pass

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class ControlPlane(Server):
    kubeconfig: Path


@dataclass
class Prometheus(Server):
    url: str
    targets_file: Path
    fleet_targets_file: Path
    operator_targets_file: Path


@dataclass
class Fleet(Server):
    nodes: list[str]


@dataclass
class Operator(Server):
    url: str
    """Where its /healthz and /metrics are."""


def start_control_plane(workdir: Path, *, kubeconfig: Path | None = None, timeout: float = 300,
                        detach: bool = False) -> ControlPlane:
    """Run ``bin/testenv`` and return once it says READY.

    Its stderr goes to ``workdir/testenv.log``. ``kubeconfig`` is where the
    admin kubeconfig is written (default: testenv's own temporary directory).
    Without ``detach`` the server gets SIGTERM if this process dies, so a
    crashed test run leaves nothing behind.
    """
    if not TESTENV.exists():
        raise StartError(f"{TESTENV.relative_to(ROOT)} missing: run `make testenv`")
    workdir.mkdir(parents=True, exist_ok=True)
    out, log = workdir / "testenv.out", workdir / "testenv.log"
    args = [str(TESTENV), f"-timeout={int(timeout)}s"]
    if kubeconfig is not None:
        args.append(f"-kubeconfig={kubeconfig}")
    server = _spawn("testenv", args, workdir, stdout=out, log=log, detach=detach)
    line = _wait_for_ready_line(server, out, timeout + 10)
    return ControlPlane(server.name, server.pid, log, process=server.process,
                        kubeconfig=Path(line.split(" ", 1)[1]))


def start_fleet(workdir: Path, kubeconfig: Path, targets_file: Path, *, pools: Iterable[str] = FLEET_POOLS,
                time_scale: float = FLEET_TIME_SCALE, name_prefix: str = "sim", timeout: float = 120,
                detach: bool = False, command: Sequence[str] = FLEET_COMMAND) -> Fleet:
    """Run ``vllm-autotuner sim fleet`` (simulated GPU nodes and their kubelet)
    and return once its nodes are Ready.

    ``pools`` are ``PROFILE[:NODES[:GPUS]]``; ``time_scale`` shrinks vLLM's
    start-up times (0.1: about 10 s for an 8B model on an H100). Its log is
    ``workdir/fleet.log``. ``command`` (Python's arguments before the
    fleet's flags) runs another program that takes the same flags.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    out, log = workdir / "fleet.out", workdir / "fleet.log"
    args = [sys.executable, *command, f"--kubeconfig={kubeconfig}",
            f"--targets-file={targets_file}", f"--time-scale={time_scale:g}", f"--name-prefix={name_prefix}"]
    args += [f"--pool={pool}" for pool in pools]
    server = _spawn("fleet", args, workdir, stdout=out, log=log, detach=detach)
    line = _wait_for_ready_line(server, out, timeout)
    return Fleet(server.name, server.pid, log, process=server.process, nodes=line.split()[1:])


def _wait_for_ready_line(server: Server, out: Path, timeout: float) -> str:
    """The ``READY ...`` line ``server`` prints on its stdout (``out``) when it is ready."""
    def ready_line() -> str | None:
        if not server.alive():
            raise StartError(f"{server.name} exited before it was ready; end of {server.log}:\n{server.log_tail()}")
        for line in out.read_text().splitlines():
            if line.startswith("READY "):
                return line
        return None

    return _wait_or_stop(server, ready_line, timeout, f"{server.name}'s READY line")


def prometheus_config(targets_dir: Path, scrape_interval: float = 1.0, rules: Path | None = None) -> dict:
    """Scrape every target listed in the ``*.json`` files of ``targets_dir`` every ``scrape_interval`` seconds,
    and the operators listed in ``targets_dir/operator/*.json``; evaluate the rule file ``rules``, if any.

    One file per writer (the simulated fleet has its own), so that writers
    never replace each other's targets. Operators are scraped as the chart's
    ServiceMonitor has it, keeping the labels they export (``namespace``
    names a VllmTuning's namespace, not the operator's).

    One-second intervals (the default) let tests see a change within a few
    seconds; the scale benchmark scrapes every 15 s, as production does. The
    relabelling turns Kubernetes service discovery's meta labels into the
    ``namespace``, ``pod`` and pod-label labels that a production Prometheus
    attaches, which the operator's PromQL selects on.
    """
    return {
        "global": {"scrape_interval": f"{scrape_interval:g}s", "scrape_timeout": f"{min(scrape_interval, 10):g}s",
                   "evaluation_interval": f"{scrape_interval:g}s"},
        "rule_files": [str(rules)] if rules else [],
        "scrape_configs": [{
            "job_name": "vllm-autotuner",
            "honor_labels": True,
            "file_sd_configs": [{"files": [str(targets_dir / "operator" / "*.json")], "refresh_interval": "1s"}],
        }, {
            "job_name": "vllm",
            "file_sd_configs": [{"files": [str(targets_dir / "*.json")], "refresh_interval": "1s"}],
            "relabel_configs": [
                {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            ],
        }],
    }


def file_sd_target(address: str, namespace: str, pod: str, pod_labels: Mapping[str, str] | None = None,
                   container: str | None = None) -> dict:
    """One entry of the targets file: the pod (its ``container``) serving ``/metrics`` at ``address``.

    Label names are sanitised the way Kubernetes service discovery does it
    (``app.kubernetes.io/name`` becomes ``app_kubernetes_io_name``).
    """
    labels = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod}
    if container is not None:
        labels["__meta_kubernetes_pod_container_name"] = container
    for name, value in (pod_labels or {}).items():
        labels["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)] = value
    return {"targets": [address], "labels": labels}


def write_targets(path: Path, targets: Iterable[dict]) -> None:
    """Replace the targets file atomically, so Prometheus never reads half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(list(targets), indent=1))
    tmp.replace(path)


def start_prometheus(workdir: Path, *, port: int | None = None, timeout: float = 60, detach: bool = False,
                     scrape_interval: float = 1.0, rules: Path | None = None,
                     basic_auth: tuple[str, str, str] | None = None,
                     tls: tuple[Path, Path, Path] | None = None) -> Prometheus:
    """Run Prometheus on a loopback port (``port``, else a free one) with its data under ``workdir``,
    scraping every ``scrape_interval`` seconds and evaluating the rule file ``rules`` (the chart's alerts).

    Its web config (a Prometheus in front of which a platform team puts a
    login, or its own TLS) can ask for ``basic_auth`` (user name, password,
    the password's bcrypt hash), and serve HTTPS with ``tls`` (a CA bundle,
    a certificate it signed for 127.0.0.1, the certificate's key).

    It starts with three empty targets files in ``workdir/targets.d/``:
    ``targets.json`` for anyone, ``fleet.json`` for the simulated fleet and
    ``operator/operator.json`` for operators (``/metrics`` of ``vllm-autotuner run``).
    Its log is ``workdir/prometheus.log``. Started again on the same
    ``workdir`` and ``port``, it is the same server back from an outage: same
    URL, same stored series.
    """
    if not PROMETHEUS.exists():
        raise StartError(f"{PROMETHEUS} missing: run `make setup` (it installs Debian's prometheus package)")
    workdir.mkdir(parents=True, exist_ok=True)
    targets_dir = workdir / "targets.d"
    targets_dir.mkdir(exist_ok=True)
    (targets_dir / "operator").mkdir(exist_ok=True)
    targets, fleet_targets = targets_dir / "targets.json", targets_dir / "fleet.json"
    operator_targets = targets_dir / "operator" / "operator.json"
    for path in (targets, fleet_targets, operator_targets):
        write_targets(path, [])
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(targets_dir, scrape_interval, rules), sort_keys=False))
    address = f"127.0.0.1:{port or free_port()}"
    url = f"{'https' if tls else 'http'}://{address}"
    web: dict[str, object] = {}
    if basic_auth:
        web["basic_auth_users"] = {basic_auth[0]: basic_auth[2]}
    if tls:
        web["tls_server_config"] = {"cert_file": str(tls[1]), "key_file": str(tls[2])}
    (workdir / "web.yml").write_text(yaml.safe_dump(web))
    server = _spawn("prometheus", [
        str(PROMETHEUS),
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={address}",
        f"--web.config.file={workdir / 'web.yml'}",
    ], workdir, log=workdir / "prometheus.log", detach=detach)

    login = (basic_auth[0], basic_auth[1]) if basic_auth else None
    trusted = ssl.create_default_context(cafile=str(tls[0])) if tls else None
    _wait_or_stop(server, lambda: _answers(server, url + "/-/ready", login, trusted), timeout,
                  f"Prometheus at {url}/-/ready")
    return Prometheus(server.name, server.pid, server.log, process=server.process, url=url, targets_file=targets,
                      fleet_targets_file=fleet_targets, operator_targets_file=operator_targets)


def start_operator(workdir: Path, kubeconfig: Path, prometheus_url: str, namespace: str, *, timeout: float = 60,
                   detach: bool = False) -> Operator:
    """Run the operator (``vllm-autotuner run``) for ``namespace`` and return once its /healthz answers.

    It watches only that namespace and holds its leader Lease there, serves
    /healthz and /metrics on a free loopback port, and logs in text to
    ``workdir/operator.log``.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{free_port()}"
    args = [sys.executable, "-m", "vllm_autotuner.cli", "run", f"--prometheus-url={prometheus_url}",
            f"--namespace={namespace}", f"--lease-namespace={namespace}", "--http-host=127.0.0.1",
            f"--http-port={url.rsplit(':', 1)[1]}", "--log-format=text"]
    server = _spawn("operator", args, workdir, log=workdir / "operator.log", detach=detach,
                    env=dict(os.environ, KUBECONFIG=str(kubeconfig)))
    _wait_or_stop(server, lambda: _answers(server, url + "/healthz"), timeout, f"the operator's {url}/healthz")
    return Operator(server.name, server.pid, server.log, process=server.process, url=url)


def _answers(server: Server, url: str, login: tuple[str, str] | None = None,
             trusted: ssl.SSLContext | None = None) -> bool:
    """Whether ``url`` answers 200 (asked with basic auth ``login``, over TLS ``trusted``); StartError if
    ``server`` died meanwhile."""
    if not server.alive():
        raise StartError(f"{server.name} exited before it was ready; end of {server.log}:\n{server.log_tail()}")
    request = urllib.request.Request(url)
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(login).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=2, context=trusted) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


# --- `vllm-autotuner sim up` / `down` ------------------------------------------------------------


def up(state_dir: Path = STATE_DIR) -> str:
    """Start the environment in the background unless it already runs.

    Writes ``state_dir/env`` (KUBECONFIG, PROMETHEUS_URL, FLEET_TARGETS) and
    records each server as a ``name pid log`` line in ``state_dir/pids``, in start
    order, which is all :func:`down` needs. Returns what to tell the user.
    """
    state_dir = state_dir.resolve()
    env_file = state_dir / "env"
    if running(state_dir) is not None:
        names = ", ".join(s.name for s in _recorded(state_dir))
        return f"already up ({names}); settings in {env_file}:\n{env_file.read_text()}"
    if _recorded(state_dir):
        down(state_dir)  # a half-dead environment is restarted whole
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        cp = start_control_plane(state_dir / "testenv", kubeconfig=state_dir / "kubeconfig", detach=True)
        _record(state_dir, cp)
        prom = start_prometheus(state_dir / "prometheus", detach=True)
        _record(state_dir, prom)
        fleet = start_fleet(state_dir / "fleet", cp.kubeconfig, prom.fleet_targets_file, detach=True)
        _record(state_dir, fleet)  # recorded last: `down` stops it first, while the apiserver still answers
    except BaseException:
        down(state_dir)
        raise
    settings = {"KUBECONFIG": cp.kubeconfig, "PROMETHEUS_URL": prom.url, "FLEET_TARGETS": prom.fleet_targets_file}
    env_file.write_text("".join(f"{k}={shlex.quote(str(v))}\n" for k, v in settings.items()))
    return f"up; settings in {env_file} (`set -a; . {env_file}; set +a` exports them):\n{env_file.read_text()}"


def down(state_dir: Path = STATE_DIR) -> str:
    """Stop every server ``up`` recorded, last started first, and forget them."""
    servers = _recorded(state_dir)
    for server in reversed(servers):
        server.stop()
    for name in ("pids", "env"):
        (state_dir / name).unlink(missing_ok=True)
    if not servers:
        return "nothing was running"
    return "stopped " + ", ".join(s.name for s in reversed(servers))


def running(state_dir: Path = STATE_DIR) -> dict[str, str] | None:
    """The settings ``up`` wrote (KUBECONFIG, PROMETHEUS_URL, FLEET_TARGETS) if all its servers still run."""
    servers = _recorded(state_dir)
    env_file = state_dir / "env"
    if not servers or not all(s.alive() for s in servers) or not env_file.exists():
        return None
    return dict(shlex.split(line)[0].split("=", 1) for line in env_file.read_text().splitlines() if line)


def _record(state_dir: Path, server: Server) -> None:
    with (state_dir / "pids").open("a") as f:
        f.write(f"{server.name} {server.pid} {server.log}\n")


def _recorded(state_dir: Path) -> list[Server]:
    try:
        lines = (state_dir / "pids").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [Server(name, int(pid), Path(log)) for name, pid, log in (line.split(" ", 2) for line in lines)]


# --- processes -----------------------------------------------------------------------------------


def _spawn(name: str, args: list[str], workdir: Path, *, log: Path, stdout: Path | None = None,
           detach: bool, env: Mapping[str, str] | None = None) -> Server:
    # Both files are truncated: a READY line left from an earlier run must
    # not be taken for this one's.
    with log.open("wb") as err, (stdout.open("wb") if stdout else nullcontext(err)) as out:
        process = subprocess.Popen(
            args, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
            start_new_session=True, preexec_fn=None if detach else _die_with_parent,
        )
    return Server(name, process.pid, log, process=process)


def _wait_or_stop(server: Server, predicate: Callable[[], T], timeout: float, description: str) -> T:
    try:
        return wait_until(predicate, timeout, description)
    except TimeoutError as exc:
        server.stop()
        raise StartError(f"{exc}; end of {server.log}:\n{server.log_tail()}") from None
    except BaseException:
        server.stop()
        raise


def _die_with_parent() -> None:
    """In the child: ask Linux for SIGTERM when the parent exits."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _in_group(pid: int, pgid: int) -> bool:
    """Whether ``pid`` is alive (not a zombie) and in process group ``pgid``.

    Checking the group, not just the pid, keeps a recorded pid that the
    kernel has since given to some other process from counting as ours.
    """
    try:
        # The command name in parentheses may hold spaces: split after it.
        state, _ppid, pgrp = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:3]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z" and int(pgrp) == pgid


def _group_alive(pgid: int) -> bool:
    return any(_in_group(int(p.name), pgid) for p in Path("/proc").iterdir() if p.name.isdigit())


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
