"""docker-compose.yml, unchanged, in real containers: build, run, a red card that pauses a run;
then the same with docker-compose.victoriametrics.yml switched on, as .env.example shows.

Debian's docker-compose 1.29 drives podman (runc) through podman's Docker-compatible API, on
images built here from Debian's packages (tests/containers.py says why and how). The stack comes
up the way a new user starts it: no .env (for the VictoriaMetrics engine, one: its COMPOSE_FILE
line), no secret file, no password, nothing created first except the snapshot folder, which
belongs to an ordinary user (uid 1000, umask 022) as it would on a real machine. The only
settings are the test's own: free published ports on loopback, the snapshot folder, and the
documented GRPO_NOTIFY_URL pointing at a stand-in receiver. Each engine's stack is brought up
after the other's is gone (the module's `stack` fixture, one engine at a time).

Grafana cannot run here: no registry serves its image and no Debian package holds it. The
compose test starts every other service and checks what Grafana would be given (its password
file, made by init, readable by Grafana's uid); the dashboards and provisioning are covered by
tests/test_dashboards.py (typed models, every panel's PromQL against a real Prometheus) and
tests/test_compose.py (the mounts resolve).

`make test` installs podman, runc, debootstrap, iptables and docker-compose when missing; the
base images are cached between runs (tests/containers.py), so only a cold run pays debootstrap.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

import containers
from conftest import scrape, value
from containers import ANY_ERROR, Podman
from polling import wait_for
from grpo_monitor.contract.run_layout import PAUSE_RECORD
from grpo_monitor.tools import victoriametrics as vm
from grpo_monitor.tools.compose_init import EXPORTER_UID, user_has_acl
from grpo_monitor.tools.stack import free_port

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
USER_UID = USER_GID = 1000  # the ordinary user who runs the trainer
RECEIVER_ALIAS = "receiver"
# Which engine evaluates the cards: the services it adds (each published on a free port) and
# the .env line that switches it on (.env.example's, uncommented; none for the default).
ENGINES = {"prometheus": (["prometheus"], None),
           "victoriametrics": (["victoriametrics", "vmagent", "vmalert"],
                               "COMPOSE_FILE=docker-compose.yml:docker-compose.victoriametrics.yml")}
# Grafana is the one service left out of `up` (module docstring).
LEFT_OUT = {"grafana"}
# A plain `docker-compose up`'s choice of services, by docker-compose's own code (the services
# without a profile, with their dependencies; an error if one of those a profile disables).
PLAIN_UP = """\
import sys
from compose.cli.command import project_from_options
options = {"--env-file": sys.argv[1], "--file": sys.argv[2:] or None, "COMMAND": "up"}
project = project_from_options(".", options)
print(" ".join(s.name for s in project.get_services(None, include_deps=True)))
"""


def _as_user(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run as the ordinary user with the default umask: what a trainer on the host does."""
    return subprocess.run(argv, user=USER_UID, group=USER_GID, extra_groups=[], umask=0o022,
                          capture_output=True, text=True, timeout=60, check=True)


def _write_snapshots(path: Path, steps: range, loss: float) -> None:
    """Append one native record per step to ``path``, as the ordinary user."""
    lines = [json.dumps({"run": path.parent.name, "rank": 0, "world_size": 1, "step": s,
                         "time": time.time(), "metrics": {"loss": loss, "reward/mean": 0.5,
                                                          "kl/mean": 0.01}})
             for s in steps]
    script = ("import sys; p = sys.argv[1]; import os; os.makedirs(os.path.dirname(p), exist_ok=True); "
              "open(p, 'a').write(sys.stdin.read())")
    subprocess.run(["/usr/bin/python3", "-c", script, str(path)], input="\n".join(lines) + "\n",
                   user=USER_UID, group=USER_GID, extra_groups=[], umask=0o022, text=True,
                   capture_output=True, timeout=60, check=True)


def _dotenv_line(line: str) -> str:
    """``line`` as .env.example offers it, commented out: a user uncomments it."""
    assert f"#{line}\n" in (ROOT / ".env.example").read_text(), f".env.example lacks #{line}"
    return line


@dataclass
class Stack:
    podman: Podman
    engine: str
    project: str
    work: Path
    snapshots: Path
    inbox: Path
    ports: dict[str, int]
    dotenv: str = ""  # the .env a user would write: nothing, or the engine's one line
    services: list[str] = field(default_factory=list)  # what `up` starts: all but Grafana
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        # The caller's GRPO_*/COMPOSE_*/DOCKER_* never leak in; only what a user could set.
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("GRPO_", "GRAFANA_", "COMPOSE_", "DOCKER_"))}
        return {**base,
                "DOCKER_HOST": self.podman.docker_host,
                "COMPOSE_DOCKER_CLI_BUILD": "0", "DOCKER_BUILDKIT": "0",
                "COMPOSE_PROJECT_NAME": self.project,
                "GRPO_SNAPSHOT_DIR": str(self.snapshots),
                "GRPO_EXPORTER_ADDRESS": "127.0.0.1",
                **{f"GRPO_{name.upper()}_PORT": str(port) for name, port in self.ports.items()},
                "GRPO_NOTIFY_URL": f"slack+http://{RECEIVER_ALIAS}:8080/hooks/grpo",
                "CONTAINERS_CONF": str(self.podman.conf)}

    @property
    def env_file(self) -> Path:
        # Our own --env-file: a developer's .env must not change what the test proves.
        path = self.work / "test.env"
        path.write_text(self.dotenv + "\n" if self.dotenv else "")
        return path

    @property
    def files(self) -> list[str]:
        """-f flags: docker-compose.yml, unless the .env names the files (COMPOSE_FILE)."""
        return [] if "COMPOSE_FILE=" in self.dotenv else ["-f", str(COMPOSE)]

    def compose(self, *args: str, timeout: float = 600,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        # In the checkout, as a user: COMPOSE_FILE's paths are relative to it.
        return containers.run(["docker-compose", *self.files, "--project-directory", str(ROOT),
                               "--env-file", str(self.env_file), *args],
                              timeout=timeout, env=self.env, check=check, cwd=ROOT)

    def plain_up(self) -> set[str]:
        """The services a plain `docker-compose up` starts with this .env."""
        res = containers.run(["/usr/bin/python3", "-c", PLAIN_UP, str(self.env_file),
                              *self.files[1::2]], timeout=120, env=self.env, cwd=ROOT)
        return set(res.stdout.split())

    def container(self, service: str) -> str:
        cid = self.compose("ps", "-q", service).stdout.strip()
        assert cid, f"no container for {service}"
        return cid

    def logs(self) -> str:
        res = self.compose("logs", "--no-color", "--tail", "60", check=False, timeout=60)
        return res.stdout[-8000:] + res.stderr[-2000:]

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def prom(self, path: str, **params: Any) -> Any:
        """The Prometheus HTTP API of the service that answers queries, which bears the
        engine's name (prometheus, victoriametrics)."""
        r = requests.get(self.url(self.engine) + path, params=params, timeout=5)
        r.raise_for_status()
        return r.json()["data"]

    def exporter_metric(self, name: str, **labels: str) -> float | None:
        return value(scrape(self.url("exporter")), name, **labels)

    @property
    def long_running(self) -> list[str]:
        return [s for s in self.services if s in self.ports]

    def up(self, *extra: str) -> None:
        t0 = time.monotonic()
        for attempt in range(3):
            res = self.compose("up", "-d", *extra, *self.services, check=False)
            # podman 4.3's API races with a container that exits at once (init): it may answer
            # "read /proc/PID/cgroup: no such process" while init has in fact run. `up` is
            # idempotent, so it is asked again (a bounded number of times); anything else fails.
            # The host ports were free when picked, but another test's server may have taken
            # one since (the suite runs in parallel): the stack is taken down and brought up
            # on ports picked again.
            busy = "address already in use" in res.stderr
            if res.returncode == 0 or not (busy or "no such process" in res.stderr) or attempt == 2:
                break
            if busy:
                self.compose("down", "--remove-orphans", check=False, timeout=300)
                self.ports.update({name: free_port() for name in self.ports})
            self.timings["up retried"] = self.timings.get("up retried", 0) + 1
        assert res.returncode == 0, f"docker-compose up:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        self.timings["up" + ("+build" if "--build" in extra else "")] = time.monotonic() - t0
        for service in self.long_running:
            ready = self.url(service) + "/-/ready"
            wait_for(lambda url=ready: requests.get(url, timeout=2).status_code == 200, 120, 0.5,
                     what=f"{service} ready", diagnose=self.logs, retry_on=ANY_ERROR)


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    """podman's API service and the stand-in images, for every stack of the module."""
    missing = containers.missing_tools()
    if missing:
        pytest.fail(f"{', '.join(missing)} not on PATH: `make system-deps` installs them "
                    "(this test never skips)")
    assert os.geteuid() == 0, "rootful podman: the suite runs as root (or via make test's sudo)"
    podman = Podman()
    log = Path(tempfile.mkdtemp(prefix="grpo-podman-"))
    podman.start_service(log / "podman-service.log")
    try:
        t0 = time.monotonic()
        built = containers.ensure_base_images(podman, log=lambda m: print(m, file=sys.stderr))
        print(f"stand-in images (s): {json.dumps({k: round(v, 1) for k, v in built.items()})}, "
              f"checked in {time.monotonic() - t0:.1f}", file=sys.stderr)
        yield podman
    finally:
        # Layers of earlier builds of the exporter image, in the suite's own storage only.
        podman("image", "prune", "-f", check=False, timeout=120)
        podman.stop_service()
        shutil.rmtree(log, ignore_errors=True)


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, podman: Podman) -> Iterator[Stack]:
    """The stack of one engine (``request.param``), up as a user brings it up."""
    engine = request.param
    engine_services, line = ENGINES[engine]
    # A folder the ordinary user can reach (pytest's tmp folders are root's, mode 0700).
    work = Path(tempfile.mkdtemp(prefix=f"grpo-compose-{engine}-"))
    work.chmod(0o755)
    snapshots = work / "snapshots"
    inbox = work / "inbox"
    inbox.mkdir(mode=0o777)
    inbox.chmod(0o777)  # the stand-in receiver runs as uid 10001 in its container
    os.chown(work, USER_UID, USER_GID)
    _as_user(["mkdir", str(snapshots)])  # mode 0755, the user's: nothing else may write there
    project = f"grpotest{os.getpid()}{engine[:4]}"
    ports = {name: free_port() for name in ("exporter", "alertmanager", *engine_services)}
    s = Stack(podman, engine, project, work, snapshots, inbox, ports,
              dotenv=_dotenv_line(line) if line else "")
    t0 = time.monotonic()
    try:
        s.services = sorted(s.plain_up() - LEFT_OUT)
        # A run folder the user made before the stack existed: init must open it too.
        _as_user(["mkdir", str(snapshots / "exp-before")])
        s.up("--build")
        yield s
    finally:
        podman("rm", "-f", f"{project}-receiver", check=False, timeout=60)
        # Whatever got created, even by a failed `up`: containers, the network, the volumes.
        s.compose("down", "-v", "--remove-orphans", check=False, timeout=300)
        # A container caught in a restart loop (restart: unless-stopped) can slip past `down`.
        left = podman("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}",
                      check=False, timeout=60).stdout.split()
        if left:
            podman("rm", "-f", *left, check=False, timeout=120)
            s.compose("down", "-v", "--remove-orphans", check=False, timeout=300)
        s.timings["total"] = time.monotonic() - t0
        print(f"compose stack ({engine}) timings (s): "
              f"{json.dumps({k: round(v, 1) for k, v in s.timings.items()})}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)


# --- the exporter's image ------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ["prometheus"], indirect=True)
def test_exporter_image_runs_as_its_non_root_user_and_turns_healthy(stack: Stack) -> None:
    cid = stack.container("exporter")
    config = json.loads(stack.podman("inspect", cid).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    # The process itself, not just the image's metadata.
    ids = stack.podman("exec", cid, "id", "-u").stdout.strip()
    assert ids == str(EXPORTER_UID)
    assert config["Healthcheck"]["Test"][-1].endswith("/-/healthy', timeout=4).status != 200)")
    # podman schedules healthchecks with systemd timers, which this machine (no systemd) lacks:
    # run the image's own HEALTHCHECK the way the timer would, until podman records "healthy".
    wait_for(lambda: stack.podman("healthcheck", "run", cid, check=False).returncode == 0, 60, 0.5,
             what="exporter HEALTHCHECK passes", diagnose=stack.logs, retry_on=ANY_ERROR)
    state = json.loads(stack.podman("inspect", cid).stdout)[0]["State"]
    health = state.get("Health") or state.get("Healthcheck")
    assert health["Status"] == "healthy", health
    # For the record (shown with -s): the containers and their state.
    print(stack.compose("ps").stdout, file=sys.stderr)
    print(stack.podman("ps", "-a", "--format", "{{.Names}}\t{{.Image}}\t{{.Status}}").stdout,
          file=sys.stderr)


@pytest.mark.parametrize("stack", ["prometheus"], indirect=True)
def test_init_made_the_secrets_and_exited(stack: Stack) -> None:
    """No preparation: init created the token and Grafana's password, owned by their readers,
    and told the user where the password is."""
    init = stack.compose("ps", "-a", "-q", "init").stdout.strip()
    state = json.loads(stack.podman("inspect", init).stdout)[0]["State"]
    assert (state["Status"], state["ExitCode"]) == ("exited", 0)
    log = stack.compose("logs", "--no-color", "init").stdout
    assert "webhook token: created" in log and "Grafana admin password: created" in log
    assert "docker compose exec grafana cat /run/grpo/grafana/admin-password" in log
    for volume, name, uid in (("webhook-secret", "webhook-token", EXPORTER_UID),
                              ("grafana-secret", "admin-password", 472)):
        mount = Path(stack.podman("volume", "inspect", "--format", "{{.Mountpoint}}",
                                  f"{stack.project}_{volume}").stdout.strip())
        st = (mount / name).stat()
        assert (st.st_uid, st.st_mode & 0o777) == (uid, 0o440), (volume, st)
        assert len((mount / name).read_text().strip()) >= 32
    # What Grafana (uid 472, which cannot run here) would read through GF_SECURITY_ADMIN_PASSWORD__FILE.
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    path = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    res = stack.podman("run", "--rm", "--user", "472:0", "-v",
                       f"{stack.project}_grafana-secret:{Path(path).parent}:ro",
                       containers.PYTHON_IMAGE, "cat", path)
    assert len(res.stdout.strip()) >= 32


# --- Prometheus -----------------------------------------------------------------------------------

def _scrapes_the_exporter_and_loaded_every_rule(stack: Stack, scraper: str, ruler: str) -> None:
    """``scraper``'s target for the exporter is up, by its service name, and ``ruler`` has loaded
    every rule file of prometheus.yml where the compose files mount them, every committed alert
    among their rules and none in error. Prometheus answers both; vmagent and vmalert answer the
    same API."""
    def api(service: str, path: str) -> Any:
        r = requests.get(stack.url(service) + path, timeout=5)
        r.raise_for_status()
        return r.json()["data"]

    def exporter_up() -> dict[str, Any] | None:
        return next((t for t in api(scraper, "/api/v1/targets")["activeTargets"]
                     if t["labels"].get("job") == "grpo-exporter" and t["health"] == "up"), None)

    target = wait_for(exporter_up, 60, 0.5, what=f"{scraper}'s exporter target is up", diagnose=stack.logs,
                      retry_on=ANY_ERROR)
    assert target["scrapeUrl"] == "http://exporter:9400/metrics"
    prom_yml = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    groups = api(ruler, "/api/v1/rules")["groups"]
    loaded = {g["file"] for g in groups}
    assert loaded == {f"/etc/prometheus/{f}" for f in prom_yml["rule_files"]}
    committed = {r["alert"] for f in prom_yml["rule_files"]
                 for g in yaml.safe_load((ROOT / "prometheus" / f).read_text())["groups"]
                 for r in g["rules"] if "alert" in r}
    assert committed <= {r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"}
    assert all(r.get("health") != "err" for g in groups for r in g["rules"]), \
        [r for g in groups for r in g["rules"] if r.get("health") == "err"]


@pytest.mark.parametrize("stack", ["prometheus"], indirect=True)
def test_prometheus_scrapes_the_exporter_by_service_name_and_loads_every_rule_file(stack: Stack) -> None:
    _scrapes_the_exporter_and_loaded_every_rule(stack, "prometheus", "prometheus")


# --- VictoriaMetrics ------------------------------------------------------------------------------

def _interpolated(arg: str, env: dict[str, str]) -> str:
    """``arg`` as Compose interpolates ${NAME:-default} from ``env``."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), arg)


@pytest.mark.parametrize("stack", ["victoriametrics"], indirect=True)
def test_victoriametrics_stands_in_for_prometheus(stack: Stack) -> None:
    """With .env.example's COMPOSE_FILE line, a plain `up` starts victoria-metrics, vmagent and
    vmalert and not prometheus; each runs its image's entrypoint with the generated flags and
    passes its healthcheck; vmagent scrapes the exporter by service name into the store, and
    vmalert has loaded every committed rule file and alert, none in error."""
    assert "prometheus" not in stack.services and set(ENGINES["victoriametrics"][0]) <= set(stack.services)
    assert stack.podman("ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={stack.project}",
                        "--filter", "label=com.docker.compose.service=prometheus").stdout.split() == []
    commands = vm.compose_commands(yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text()))
    for service, argv in commands.items():
        cid = stack.container(service)
        config = json.loads(stack.podman("inspect", cid).stdout)[0]["Config"]
        binary, _ = containers.VICTORIAMETRICS_IMAGES[config["Image"]]
        assert config["Entrypoint"] == f"/{binary}-prod", config["Entrypoint"]
        assert config["Cmd"] == [_interpolated(a, stack.env) for a in argv], service
        # As for the exporter's: podman has no timer here to run it; run it until it passes.
        wait_for(lambda cid=cid: stack.podman("healthcheck", "run", cid, check=False).returncode == 0,
                 60, 0.5, what=f"{service} healthcheck passes", diagnose=stack.logs, retry_on=ANY_ERROR)

    _scrapes_the_exporter_and_loaded_every_rule(stack, "vmagent", "vmalert")
    wait_for(lambda: stack.prom("/api/v1/query", query='up{job="grpo-exporter"} == 1')["result"], 60, 1,
             what="the exporter's samples in victoria-metrics", diagnose=stack.logs, retry_on=ANY_ERROR)
    # The data lands in the named volumes, at the paths the flags give.
    for volume, made in (("victoriametrics-data", {"data", "indexdb"}),
                         ("vmagent-data", {"persistent-queue"})):
        mount = Path(stack.podman("volume", "inspect", "--format", "{{.Mountpoint}}",
                                  f"{stack.project}_{volume}").stdout.strip())
        assert made <= {p.name for p in mount.iterdir()}, (volume, list(mount.iterdir()))


# --- the red card -----------------------------------------------------------------------------------

@pytest.mark.parametrize("stack", list(ENGINES), indirect=True)
def test_a_nan_pauses_a_run_of_an_ordinary_user_and_reaches_a_person(stack: Stack) -> None:
    """Host file -> exporter -> Prometheus (or vmagent, victoria-metrics and vmalert) ->
    Alertmanager -> exporter webhook (bearer token) -> <run>/.grpo-control.json in a folder that
    uid 1000 made with umask 022; and the same card, relayed, at the stand-in receiver named by
    GRPO_NOTIFY_URL."""
    # The stand-in receiver joins the compose network under the name GRPO_NOTIFY_URL uses.
    script = ROOT / "tests" / "fixtures" / "standin_receiver.py"
    stack.podman("run", "-d", "--name", f"{stack.project}-receiver",
                 "--network", f"{stack.project}_default", "--network-alias", RECEIVER_ALIAS,
                 "--user", f"{EXPORTER_UID}:{EXPORTER_UID}", "--entrypoint", "python",
                 "-v", f"{script}:/receiver.py:ro", "-v", f"{stack.inbox}:/out:rw",
                 "grpo-monitor-exporter:0.1.0", "/receiver.py")
    run_dir = stack.snapshots / "exp-nan"
    _as_user(["mkdir", str(run_dir)])
    # The user's folder. Its mode reads 0775: with an ACL the group bits show the ACL's mask
    # (which lets uid 10001 in); the owning group itself keeps r-x, as umask 022 gave it.
    assert (run_dir.stat().st_uid, run_dir.stat().st_mode & 0o777) == (USER_UID, 0o775)
    # init's default ACL reached the new folder, and the folder made before the stack too.
    assert user_has_acl(run_dir, EXPORTER_UID) and user_has_acl(stack.snapshots / "exp-before", EXPORTER_UID)
    t0 = time.monotonic()
    _write_snapshots(run_dir / "rank-0.jsonl", range(1, 11), loss=0.5)
    _write_snapshots(run_dir / "rank-0.jsonl", range(11, 13), loss=float("nan"))
    control = run_dir / PAUSE_RECORD
    wait_for(control.exists, 180, 1, what="the pause record appears", diagnose=stack.logs,
             retry_on=ANY_ERROR)
    stack.timings["nan->pause"] = time.monotonic() - t0
    record = json.loads(control.read_text())
    assert record["state"] == "paused" and record["alertname"] == "GRPONonFiniteValues"
    assert (record["run"], record["step"]) == ("exp-nan", 12)
    assert control.stat().st_uid == EXPORTER_UID and control.stat().st_mode & 0o777 == 0o644
    # The trainer's SDK, as the ordinary user (a trainer container with the package), sees it.
    probe = ("from grpo_monitor.sdk.writer import SnapshotWriter; "
             "print(SnapshotWriter('/snapshots', run='exp-nan', rank=0, world_size=1).should_pause())")
    res = stack.podman("run", "--rm", "--user", f"{USER_UID}:{USER_GID}", "--entrypoint", "python",
                       "-v", f"{stack.snapshots}:/snapshots:ro", "grpo-monitor-exporter:0.1.0",
                       "-c", probe)
    assert res.stdout.strip() == "True", res.stderr
    # The webhook took Alertmanager's bearer token; nobody was refused.
    assert (stack.exporter_metric("grpo_webhook_requests_total", outcome="paused") or 0) >= 1
    assert stack.exporter_metric("grpo_webhook_requests_total", outcome="unauthorized") == 0
    # ...and the person got a red card.
    def red_card() -> dict[str, Any] | None:
        for f in sorted(stack.inbox.glob("*.json")):
            post = json.loads(f.read_text())
            body = json.loads(post["body"])
            if "RED card" in body["text"] and "GRPONonFiniteValues" in body["text"]:
                return {"post": post, "body": body}
        return None

    got = wait_for(red_card, 60, 1, what="the red card reaches the stand-in receiver",
                   diagnose=stack.logs, retry_on=ANY_ERROR)
    stack.timings["nan->person"] = time.monotonic() - t0
    assert got["post"]["path"] == "/hooks/grpo"
    attachment = got["body"]["attachments"][0]
    assert attachment["color"] == "#d7191c"  # red
    assert "run exp-nan" in attachment["title"]
    assert "A training signal is NaN or infinite." in attachment["text"]
    assert "run=exp-nan" in attachment["text"] and "step=12" in attachment["text"]
    assert attachment["title_link"].endswith("docs/runbook.md#grpononfinitevalues")
    assert stack.exporter_metric("grpo_notifications_total", outcome="sent") >= 1
    print(f"pause record after {stack.timings['nan->pause']:.1f} s:\n{control.read_text()}",
          file=sys.stderr)
    # How the card travelled (for the record, with -s): delivery errors show here first.
    ruler, counters = (
        ("prometheus", ("prometheus_notifications_sent_total", "prometheus_notifications_errors_total",
                        "prometheus_notifications_dropped_total")) if stack.engine == "prometheus"
        else ("vmalert", ("vmalert_alerts_sent_total", "vmalert_alerts_send_errors_total")))
    sent = requests.get(stack.url(ruler) + "/metrics", timeout=5).text
    print("\n".join(line for line in sent.splitlines() if line.startswith(counters)), file=sys.stderr)
    am = requests.get(stack.url("alertmanager") + "/metrics", timeout=5).text
    print("\n".join(line for line in am.splitlines()
                    if line.startswith(("alertmanager_notifications_total{integration=\"webhook",
                                        "alertmanager_notifications_failed_total{integration=\"webhook",
                                        "alertmanager_alerts_received_total"))), file=sys.stderr)


@pytest.mark.parametrize("stack", ["prometheus"], indirect=True)
def test_down_and_up_keep_prometheus_data_and_the_pause_state(stack: Stack) -> None:
    control = stack.snapshots / "exp-nan" / PAUSE_RECORD
    before = control.read_text()
    assert json.loads(before)["state"] == "paused"
    token_volume = Path(stack.podman("volume", "inspect", "--format", "{{.Mountpoint}}",
                                     f"{stack.project}_webhook-secret").stdout.strip())
    token = (token_volume / "webhook-token").read_text()
    when = time.time()
    seen = stack.prom("/api/v1/query", query='grpo_step{run="exp-nan"}', time=when)["result"]
    assert seen and float(seen[0]["value"][1]) == 12
    old = {svc: stack.container(svc) for svc in stack.long_running}
    # The receiver is not the compose project's: it must leave the network before `down`.
    stack.podman("rm", "-f", f"{stack.project}-receiver", timeout=60)
    t0 = time.monotonic()
    stack.compose("down")
    stack.up()
    stack.timings["down+up"] = time.monotonic() - t0
    new = {svc: stack.container(svc) for svc in stack.long_running}
    assert all(old[s] != new[s] for s in old), "down and up must recreate the containers"
    # Prometheus' TSDB (prometheus-data) kept the samples scraped before `down`.
    kept = stack.prom("/api/v1/query", query='grpo_step{run="exp-nan"}', time=when)["result"]
    assert kept and float(kept[0]["value"][1]) == 12, kept
    # The pause state: the record, the token (init keeps what it made), nothing re-paused.
    assert (token_volume / "webhook-token").read_text() == token
    assert json.loads(control.read_text())["state"] == "paused"
    assert control.read_text() == before
    log = stack.compose("logs", "--no-color", "init").stdout
    assert "webhook token: kept" in log
