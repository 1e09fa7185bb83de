"""The Docker side, checked without a Docker engine (these machines have the client alone).

docker-compose.yml through Debian's `docker-compose` (`config` validates and normalizes it), the
Dockerfile by reading it, prometheus-fleet.yml and its file_sd targets through `promtool check
config`, and the cardinality numbers of docs/scaling.md against a real exporter. `make test`
installs docker-compose and promtool (`system-deps`); without them these tests fail, never skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import containers
import pytest
import yaml
from polling import wait_for
from prometheus_harness import uncomment_example

from grpo_monitor.tools import victoriametrics as vm
from grpo_monitor.tools.stack import NativeStack, StackConfig

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "exporter" / "Dockerfile"
FLEET = ROOT / "prometheus" / "prometheus-fleet.yml"
SCALING = ROOT / "docs" / "scaling.md"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
VM_OVERRIDE = ROOT / "docker-compose.victoriametrics.yml"
LONG_RUNNING = {"exporter", "prometheus", "alertmanager", "grafana"}
DEFAULT_SERVICES = LONG_RUNNING | {"init"}  # init: one-shot, before the others
VM_SERVICES = {"victoriametrics", "vmagent", "vmalert"}
SNAPSHOT_SOURCE = "${GRPO_SNAPSHOT_DIR:-./snapshots}"


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not on PATH: install it with `make system-deps` "
                    f"(Debian package {package}); these checks need it and never skip")
    return path


def _compose(*args: str, env: dict[str, str] | None = None, tmp: Path,
             files: tuple[Path, ...] = (COMPOSE,)) -> subprocess.CompletedProcess[str]:
    """docker-compose on the project file, isolated from the caller's environment and from a
    local .env (an empty --env-file): nothing set, as for a user who prepared nothing."""
    binary = _tool("docker-compose", "docker-compose")
    empty = tmp / "empty.env"
    empty.write_text("")
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("GRPO_", "GRAFANA_", "COMPOSE_", "DOCKER_"))}
    full = {**base, **(env or {})}
    full = {k: v for k, v in full.items() if v is not None}
    flags = [a for f in files for a in ("-f", str(f))]
    return subprocess.run([binary, *flags, "--env-file", str(empty), *args],
                          check=False, cwd=ROOT, env=full, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compose")


@pytest.fixture(scope="module")
def config(tmp_module: Path) -> dict[str, Any]:
    """The normalized configuration `docker-compose config` prints (exit 0 required)."""
    res = _compose("config", tmp=tmp_module)
    assert res.returncode == 0, f"docker-compose config failed:\n{res.stderr}"
    return yaml.safe_load(res.stdout)


@pytest.fixture(scope="module")
def vm_config(tmp_module: Path) -> dict[str, Any]:
    """The same, with docker-compose.victoriametrics.yml over it."""
    res = _compose("config", tmp=tmp_module, files=(COMPOSE, VM_OVERRIDE))
    assert res.returncode == 0, f"docker-compose config failed:\n{res.stderr}"
    return yaml.safe_load(res.stdout)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _mounts(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(source, target, mode) of each volume entry of a normalized service."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):  # long syntax
            mode = "ro" if v.get("read_only") else "rw"
            out.append((str(v.get("source", "")), v["target"], mode))
            continue
        parts = v.split(":")
        src, dst = parts[0], parts[1]
        out.append((src, dst, parts[2] if len(parts) > 2 else "rw"))
    return out


def _is_bind(source: str) -> bool:
    return source.startswith(("/", "."))


def _split_image(image: str) -> tuple[str, str]:
    """(name, tag); the tag is '' when the reference has none (a digest counts as a tag)."""
    if "@sha256:" in image:
        return image.split("@", 1)[0], "@" + image.split("@", 1)[1]
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        return image.rsplit(":", 1)[0], image.rsplit(":", 1)[1]
    return image, ""


# --- docker-compose.yml ---------------------------------------------------------------------------

def test_compose_config_is_valid(config: dict[str, Any]) -> None:
    assert set(config["services"]) >= DEFAULT_SERVICES | {"demo"}


def test_compose_needs_no_preparation(config: dict[str, Any], raw: dict[str, Any]) -> None:
    """No variable is required and no repository file must be created first: init makes the
    secrets in named volumes, and every service that reads one waits for init to finish."""
    text = COMPOSE.read_text()
    assert ":?" not in text, "a required variable is a preparation step"
    services = config["services"]
    init = services["init"]
    assert init["command"] == ["compose-init"] and init["image"] == services["exporter"]["image"]
    assert init["restart"] == "no" and init["user"] == "0:0"
    for name in ("exporter", "alertmanager", "grafana"):
        assert services[name]["depends_on"]["init"]["condition"] == "service_completed_successfully", name
    secrets = {"webhook-secret", "grafana-secret"}
    assert secrets <= set(raw["volumes"])
    readers = {name: {src for src, _, _ in _mounts(s) if src in secrets} for name, s in services.items()}
    assert readers["exporter"] == readers["alertmanager"] == {"webhook-secret"}
    assert readers["grafana"] == {"grafana-secret"}
    assert readers["prometheus"] == set(), "Prometheus needs no secret"
    # Nothing from the repository's prometheus/secrets/ any more: it would have to be created.
    assert all("secrets" not in src for svc in services.values() for src, _, _ in _mounts(svc)
               if _is_bind(src))


def test_card_links_open_the_external_host(config: dict[str, Any], tmp_module: Path) -> None:
    """Prometheus' generatorURL and Alertmanager's own links are built from --web.external-url;
    without it they carry the container's id (http://8ca2c5336343:9090/graph...). One setting,
    GRPO_EXTERNAL_HOST, names the host for both, with their published ports."""
    def external(services: dict[str, Any], name: str) -> list[str]:
        return [a for a in services[name]["command"] if a.startswith("--web.external-url=")]

    services = config["services"]
    assert external(services, "prometheus") == ["--web.external-url=http://localhost:9090"]
    assert external(services, "alertmanager") == ["--web.external-url=http://localhost:9093"]
    res = _compose("config", tmp=tmp_module, env={"GRPO_EXTERNAL_HOST": "gpu-box-7",
                                                  "GRPO_ALERTMANAGER_PORT": "19093"})
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    assert external(services, "prometheus") == ["--web.external-url=http://gpu-box-7:9090"]
    assert external(services, "alertmanager") == ["--web.external-url=http://gpu-box-7:19093"]
    assert "GRPO_EXTERNAL_HOST" in (ROOT / ".env.example").read_text()


def test_demo_profile_config_is_valid(tmp_module: Path) -> None:
    res = _compose("--profile", "demo", "config", tmp=tmp_module)
    assert res.returncode == 0, res.stderr


def test_images_are_pinned(config: dict[str, Any], vm_config: dict[str, Any]) -> None:
    for name, svc in [*config["services"].items(), *vm_config["services"].items()]:
        assert "image" in svc, f"{name}: no image (a built service needs a pinned image: tag too)"
        _, tag = _split_image(svc["image"])
        assert tag, f"{name}: image {svc['image']} has no tag"
        assert tag != "latest", f"{name}: image {svc['image']} uses latest"


def test_config_mounts_are_read_only(config: dict[str, Any], vm_config: dict[str, Any]) -> None:
    """Every bind mount is read-only, except the snapshot folder of the services that write it."""
    # The exporter writes control records (the red-card pause) next to the runs' snapshots.
    writers = {"demo", "cli", "exporter", "init"}
    for name, svc in [*config["services"].items(), *vm_config["services"].items()]:
        for src, dst, mode in _mounts(svc):
            if not _is_bind(src):
                continue  # a named volume: the service's own state
            if dst == "/snapshots" and name in writers:
                assert "rw" in mode.split(","), f"{name} writes snapshots; its mount must be writable"
                continue
            assert "ro" in mode.split(","), f"{name}: {src}:{dst} is not read-only"


def test_mounted_files_exist(config: dict[str, Any], vm_config: dict[str, Any]) -> None:
    snapshots = str(ROOT / "snapshots")
    for name, svc in [*config["services"].items(), *vm_config["services"].items()]:
        for src, dst, _ in _mounts(svc):
            if not _is_bind(src) or src == snapshots:
                continue  # named volume; the snapshot folder is the user's
            assert Path(src).exists(), f"{name} mounts {src} at {dst}, which is not in the repository"


def test_snapshot_folder_comes_from_grpo_snapshot_dir(raw: dict[str, Any], tmp_module: Path) -> None:
    for name in ("exporter", "demo", "cli", "init"):
        sources = [v.rsplit(":/snapshots", 1)[0] for v in raw["services"][name]["volumes"]
                   if ":/snapshots" in v]
        assert sources == [SNAPSHOT_SOURCE], f"{name}: snapshot mount {sources}"
    res = _compose("config", env={"GRPO_SNAPSHOT_DIR": "/data/grpo-snapshots"}, tmp=tmp_module)
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    for name in ("exporter", "demo", "cli"):
        mounts = {dst: (src, mode) for src, dst, mode in _mounts(services[name])}
        assert mounts["/snapshots"][0] == "/data/grpo-snapshots", name
    assert _mounts(services["exporter"])[0] == ("/data/grpo-snapshots", "/snapshots", "rw")


def test_gpus_are_one_switch_away(config: dict[str, Any], tmp_module: Path) -> None:
    """Default: no device reservation, so the stack starts without the NVIDIA toolkit. With
    docker-compose.gpu.yml (COMPOSE_FILE in .env), the exporter reserves every GPU for NVML."""
    assert "deploy" not in config["services"]["exporter"]
    res = _compose("config", tmp=tmp_module, files=(COMPOSE, GPU_OVERRIDE))
    assert res.returncode == 0, res.stderr
    gpu = yaml.safe_load(res.stdout)["services"]
    devices = gpu["exporter"]["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    dev = devices[0]
    assert dev["driver"] == "nvidia"
    assert dev["count"] == "all"
    assert set(dev["capabilities"]) == {"gpu", "utility"}
    # The override changes nothing else.
    def normal(svc: dict[str, Any]) -> dict[str, Any]:  # merging may reorder the volumes
        return {**{k: v for k, v in svc.items() if k != "deploy"}, "volumes": sorted(svc["volumes"])}

    assert normal(gpu["exporter"]) == normal(config["services"]["exporter"])
    # The switch is COMPOSE_FILE, which Compose reads from .env: documented where users look.
    switch = "COMPOSE_FILE=docker-compose.yml:docker-compose.gpu.yml"
    for doc in (ROOT / "README.md", COMPOSE, ROOT / ".env.example"):
        assert switch in doc.read_text(), doc
    res = _compose("config", tmp=tmp_module, env={"COMPOSE_FILE": f"{COMPOSE}:{GPU_OVERRIDE}"},
                   files=())
    assert res.returncode == 0, res.stderr
    assert "deploy" in yaml.safe_load(res.stdout)["services"]["exporter"]


# --- docker-compose.victoriametrics.yml -------------------------------------------------------------

def _enabled(config: dict[str, Any]) -> set[str]:
    """The services a plain `up` starts: those without a profile."""
    return {n for n, s in config["services"].items() if not s.get("profiles")}


def test_victoriametrics_is_one_switch_away(config: dict[str, Any], vm_config: dict[str, Any],
                                            tmp_module: Path) -> None:
    """COMPOSE_FILE in .env adds the three VictoriaMetrics services and leaves prometheus out of
    `up`; nothing that starts depends on it, or Compose would refuse the project (1.29: "pulled in
    as a dependency ... not enabled by the active profiles"; v2: "depends on undefined service")."""
    assert _enabled(vm_config) == _enabled(config) - {"prometheus"} | VM_SERVICES
    assert vm_config["services"]["prometheus"]["profiles"] == ["prometheus"]
    for cfg in (config, vm_config):
        enabled = _enabled(cfg)
        for name in enabled:
            assert set(cfg["services"][name].get("depends_on", {})) <= enabled, name
    # Nothing else of the base services changes but Grafana's datasource (below).
    def normal(svc: dict[str, Any]) -> dict[str, Any]:  # merging may reorder the volumes
        return {**svc, "volumes": sorted(svc.get("volumes", []))}

    for name in _enabled(config) - {"prometheus", "grafana"}:
        assert normal(vm_config["services"][name]) == normal(config["services"][name]), name
    # The images the suite builds its stand-ins under (tests/containers.py) are the pinned ones,
    # at the version of the Debian package the stand-ins hold.
    images = {vm_config["services"][n]["image"] for n in VM_SERVICES}
    assert {f"docker.io/{i}" for i in images} == set(containers.VICTORIAMETRICS_IMAGES)
    version = containers.package_version(containers.VICTORIAMETRICS_PACKAGE).split("+")[0]
    assert {_split_image(i)[1] for i in images} == {f"v{version}"}, version
    switch = "COMPOSE_FILE=docker-compose.yml:docker-compose.victoriametrics.yml"
    for doc in (ROOT / "README.md", COMPOSE, VM_OVERRIDE, ROOT / ".env.example"):
        assert switch in doc.read_text(), doc
    res = _compose("config", tmp=tmp_module, env={"COMPOSE_FILE": f"{COMPOSE}:{VM_OVERRIDE}"}, files=())
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(res.stdout) == vm_config


def test_victoriametrics_flags_are_generated(vm_config: dict[str, Any]) -> None:
    """vmagent's scrape configs and the services' commands are what victoriametrics.py makes of
    the committed Prometheus configs (`make docs` writes them): a change to prometheus.yml, its
    fleet variant or the flags fails here until they are written again."""
    for path, text in vm.generated().items():
        assert path.read_text() == text, f"{path.name} is stale: run `make docs`"
    commands = vm.compose_commands(yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text()))
    for name, argv in commands.items():  # as Compose reads them, nothing set: ${NAME:-default}
        defaults = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", a) for a in argv]
        assert vm_config["services"][name]["command"] == defaults, name


def test_vmagent_accepts_the_generated_scrape_configs(tmp_path: Path) -> None:
    """vmagent itself (Debian's, the version the images pin) parses both; it refuses what
    Prometheus accepts and it does not know (file_sd's refresh_interval)."""
    binary = _tool("vmagent", "victoria-metrics")
    shutil.copytree(ROOT / "prometheus" / "file_sd", tmp_path / "file_sd")
    for name in vm.SCRAPE_CONFIGS:
        shutil.copy(ROOT / "prometheus" / name, tmp_path / name)
        res = subprocess.run([binary, f"-promscrape.config={tmp_path / name}", "-promscrape.config.dryRun"],
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0 and "is ok" in res.stderr, res.stderr[-2000:]


@pytest.mark.parametrize("config_name", ["prometheus.yml", "prometheus-fleet.yml"])
def test_victoriametrics_sees_its_configs_rules_and_targets(config_name: str, tmp_module: Path) -> None:
    """GRPO_PROMETHEUS_CONFIG picks vmagent's scrape config made from that Prometheus config,
    its file_sd folder resolves beside it, and vmalert's rule files are the committed ones."""
    res = _compose("config", env={"GRPO_PROMETHEUS_CONFIG": config_name}, tmp=tmp_module,
                   files=(COMPOSE, VM_OVERRIDE))
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    agent = services["vmagent"]
    flag = next(a for a in agent["command"] if a.startswith("-promscrape.config="))
    container_cfg = flag.split("=", 1)[1]
    host_cfg = _container_path(_mounts(agent), container_cfg)
    assert host_cfg is not None and host_cfg.is_file(), f"{container_cfg} is not mounted"
    prom = yaml.safe_load((ROOT / "prometheus" / config_name).read_text())
    assert yaml.safe_load(host_cfg.read_text()) == vm.scrape_config(prom)
    base = PurePosixPath(container_cfg).parent
    for sc in prom["scrape_configs"]:
        for sd in sc.get("file_sd_configs", []):
            for pattern in sd["files"]:
                folder = _container_path(_mounts(agent), str((base / pattern).parent))
                assert folder is not None and list(folder.glob(PurePosixPath(pattern).name)), pattern
    ruler = services["vmalert"]
    rules = [a.split("=", 1)[1] for a in ruler["command"] if a.startswith("-rule=")]
    hosts = [_container_path(_mounts(ruler), r) for r in rules]
    assert hosts == [ROOT / "prometheus" / f for f in prom["rule_files"]]
    assert all(h is not None and h.is_file() for h in hosts)


def test_victoriametrics_card_links_open_the_external_host(tmp_module: Path) -> None:
    """vmalert's alert links (generatorURL) open its page on the host people reach, like
    Prometheus' (GRPO_EXTERNAL_HOST and its published port); every port on loopback."""
    res = _compose("config", tmp=tmp_module, files=(COMPOSE, VM_OVERRIDE),
                   env={"GRPO_EXTERNAL_HOST": "gpu-box-7", "GRPO_VMALERT_PORT": "18880"})
    assert res.returncode == 0, res.stderr
    services = yaml.safe_load(res.stdout)["services"]
    assert "-external.url=http://gpu-box-7:18880" in services["vmalert"]["command"]
    published = {name: [p.split(":") for p in services[name]["ports"]] for name in VM_SERVICES}
    assert all(ip == "127.0.0.1" for ports in published.values() for ip, _, _ in ports), published
    assert published["vmalert"] == [["127.0.0.1", "18880", "8880/tcp"]]


def test_exporter_is_built_from_the_dockerfile(config: dict[str, Any]) -> None:
    build = config["services"]["exporter"]["build"]
    assert Path(build["context"]) == ROOT
    assert (ROOT / build["dockerfile"]) == DOCKERFILE


def test_demo_profile_is_opt_in(config: dict[str, Any]) -> None:
    """docker-compose 1.29's `config --services` lists every service whatever the profiles, so
    the normalized `profiles` decide: a service with a profile only starts when it is enabled."""
    services = config["services"]
    default = {n for n, s in services.items() if not s.get("profiles")}
    assert default == DEFAULT_SERVICES
    demo = services["demo"]
    assert demo["profiles"] == ["demo"]
    argv = [*demo.get("entrypoint", []), *demo["command"]]
    assert argv[:2] == ["grpo-monitor", "simulate"]
    flags = " ".join(argv)
    for part in ("--snapshot.dir /snapshots", "--scenario kl_explosion", "--realtime",
                 "--step-seconds 1"):
        assert part in flags, f"demo command lacks {part}: {argv}"
    assert demo["image"] == services["exporter"]["image"]
    assert services["cli"]["profiles"] == ["tools"]


def test_grafana_anonymous_viewer_and_secret_password(config: dict[str, Any], raw: dict[str, Any]) -> None:
    env = config["services"]["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    # The password comes from the file init writes, never from the compose file or a default.
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env
    password = PurePosixPath(env["GF_SECURITY_ADMIN_PASSWORD__FILE"])
    mounts = {dst: (src, mode) for src, dst, mode in _mounts(config["services"]["grafana"])}
    assert mounts[str(password.parent)] == ("grafana-secret", "ro")
    init = {dst: src for src, dst, _ in _mounts(config["services"]["init"])}
    assert init[str(password.parent)] == "grafana-secret"
    assert mounts["/etc/grafana/provisioning"] == (str(ROOT / "grafana" / "provisioning"), "ro")
    assert mounts["/var/lib/grafana/dashboards"] == (str(ROOT / "grafana" / "dashboards"), "ro")


def test_long_running_services_restart_and_have_healthchecks(config: dict[str, Any],
                                                             vm_config: dict[str, Any]) -> None:
    for name in LONG_RUNNING | VM_SERVICES:
        svc = (config if name in config["services"] else vm_config)["services"][name]
        assert svc.get("restart") == "unless-stopped", name
        if name != "exporter":  # the exporter's HEALTHCHECK is in its image (Dockerfile)
            assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
            # busybox / alpine images: wget, not curl
            assert "curl" not in " ".join(svc["healthcheck"]["test"]), name


def test_alertmanager_mounts_its_secrets_read_only(config: dict[str, Any]) -> None:
    am = config["services"]["alertmanager"]
    assert ("webhook-secret", "/etc/alertmanager/secrets", "ro") in _mounts(am)
    creds = [hook["http_config"]["authorization"]["credentials_file"]
             for r in yaml.safe_load((ROOT / "prometheus" / "alertmanager.yml").read_text())["receivers"]
             for hook in r.get("webhook_configs", [])]
    assert creds and all(c.startswith("/etc/alertmanager/secrets/") for c in creds)
    # ...and the token is nowhere else: Prometheus gets its files one by one.
    for src, _, _ in _mounts(config["services"]["prometheus"]):
        assert src != str(ROOT / "prometheus"), "prometheus/ as a whole would expose secrets/"


def _container_path(mounts: list[tuple[str, str, str]], path: str) -> Path | None:
    """The host path a container path maps to through the bind mounts, if any."""
    p = PurePosixPath(path)
    for src, dst, _ in mounts:
        if p == PurePosixPath(dst) or PurePosixPath(dst) in p.parents:
            return Path(src) / p.relative_to(dst)
    return None


@pytest.mark.parametrize("config_name", ["prometheus.yml", "prometheus-fleet.yml"])
def test_prometheus_sees_its_config_rules_and_targets(config: dict[str, Any], config_name: str,
                                                      tmp_module: Path) -> None:
    """Each Prometheus config the compose can select, its rule files and its file_sd folder
    resolve through the mounts to files of the repository."""
    res = _compose("config", env={"GRPO_PROMETHEUS_CONFIG": config_name}, tmp=tmp_module)
    assert res.returncode == 0, res.stderr
    svc = yaml.safe_load(res.stdout)["services"]["prometheus"]
    mounts = _mounts(svc)
    flag = next(a for a in svc["command"] if a.startswith("--config.file="))
    container_cfg = flag.split("=", 1)[1]
    host_cfg = _container_path(mounts, container_cfg)
    assert host_cfg is not None and host_cfg.is_file(), f"{container_cfg} is not mounted"
    prom = yaml.safe_load(host_cfg.read_text())
    base = PurePosixPath(container_cfg).parent
    for rule in prom["rule_files"]:
        host = _container_path(mounts, str(base / rule))
        assert host is not None and host.is_file(), f"rule file {rule} is not mounted"
    for sc in prom["scrape_configs"]:
        for sd in sc.get("file_sd_configs", []):
            for pattern in sd["files"]:
                folder = _container_path(mounts, str((base / pattern).parent))
                assert folder is not None and list(folder.glob(PurePosixPath(pattern).name)), pattern


# --- exporter/Dockerfile ---------------------------------------------------------------------------

def _dockerfile_stages() -> list[list[tuple[str, str]]]:
    """Instructions (KEYWORD, arguments) per stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        assert stages, "instruction before FROM"
        stages[-1].append((keyword.upper(), args.strip()))
    return stages


def test_dockerfile_is_multi_stage_with_pinned_bases() -> None:
    stages = _dockerfile_stages()
    assert len(stages) >= 2, "build and runtime stages"
    for stage in stages:
        image = stage[0][1].split()[0]
        if any(image == s[0][1].split()[-1] for s in stages):  # FROM an earlier stage
            continue
        _, tag = _split_image(image)
        assert tag and tag != "latest", f"base image {image} not pinned"
    final = stages[-1]
    copies = [a for k, a in final if k == "COPY"]
    assert any(a.startswith("--from=") for a in copies), "the runtime stage copies the build's output"


def test_dockerfile_runs_as_non_root_with_healthcheck() -> None:
    final = _dockerfile_stages()[-1]
    users = [a for k, a in final if k == "USER"]
    assert users, "no USER in the runtime stage: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"USER {users[-1]}"
    healthchecks = [a for k, a in final if k == "HEALTHCHECK"]
    assert healthchecks and not healthchecks[-1].upper().startswith("NONE")
    assert "/-/healthy" in healthchecks[-1]
    entry = [a for k, a in final if k == "ENTRYPOINT"]
    assert entry and "grpo-monitor" in entry[-1]
    assert any(k == "EXPOSE" and "9400" in a for k, a in final)


def test_dockerignore_lets_in_only_what_the_build_copies() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*", "an allow-list keeps secrets and snapshots out of the build context"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    build = _dockerfile_stages()[0]
    sources = {src.rstrip("/") for k, a in build if k == "COPY" and not a.startswith("--from")
               for src in a.split()[:-1]}
    assert sources <= allowed, f"COPY needs {sources - allowed}, which .dockerignore keeps out"
    assert not any(a.startswith(("prometheus", "snapshots", ".")) for a in allowed)


# --- prometheus-fleet.yml --------------------------------------------------------------------------

def _promtool_check(config_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_tool("promtool", "prometheus"), "check", "config", str(config_file)],
                          check=False, capture_output=True, text=True, timeout=60)


def test_fleet_config_is_valid() -> None:
    res = _promtool_check(FLEET)
    assert res.returncode == 0, res.stdout + res.stderr


def test_fleet_examples_are_valid(tmp_path: Path) -> None:
    """The commented remote_write and target examples, uncommented, still pass promtool; the
    target file's groups are then more than the local exporter."""
    prom = tmp_path / "prometheus"
    shutil.copytree(ROOT / "prometheus", prom, ignore=shutil.ignore_patterns("secrets"))
    fleet = prom / FLEET.name
    fleet.write_text(uncomment_example(fleet.read_text(), "REMOTE_WRITE"))
    targets = prom / "file_sd" / "grpo-exporters.yml"
    targets.write_text(uncomment_example(targets.read_text(), "TARGETS"))
    res = _promtool_check(fleet)
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(yaml.safe_load(fleet.read_text())["remote_write"]) >= 2
    groups = yaml.safe_load(targets.read_text())
    assert len(groups) >= 2 and all(t.endswith(":9400") for g in groups for t in g["targets"])


def test_fleet_config_matches_the_single_node_one() -> None:
    """Same rules, Alertmanager and job name (the self-health rules select job="grpo-exporter");
    only the way targets are found differs."""
    single = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    fleet = yaml.safe_load(FLEET.read_text())
    assert fleet["rule_files"] == single["rule_files"]
    assert fleet["alerting"] == single["alerting"]
    for key in ("scrape_interval", "evaluation_interval"):
        assert fleet["global"][key] == single["global"][key]
    assert [sc["job_name"] for sc in fleet["scrape_configs"]] == \
        [sc["job_name"] for sc in single["scrape_configs"]]
    assert all("file_sd_configs" in sc and "static_configs" not in sc for sc in fleet["scrape_configs"])


# --- docs/scaling.md: the cardinality it states is the exporter's ----------------------------------

def _series_by_rank(tmp: Path) -> dict[str, int]:
    from grpo_monitor.runtime.app import Exporter
    from grpo_monitor.runtime.config import ExporterConfig

    snap = tmp / "snapshots"
    subprocess.run([sys.executable, "-m", "grpo_monitor.cli", "simulate", "--snapshot.dir",
                    str(snap), "--scenario", "healthy", "--ranks", "16", "--steps", "500"],
                   check=True, capture_output=True, timeout=120)
    exporter = Exporter(ExporterConfig(snapshot_dir=snap, listen_address="127.0.0.1:0",
                                       gpu_collector=False))
    with exporter:
        wait_for(exporter.watcher.ready.is_set, 60, what="exporter ready")
        text = exporter.metrics().decode()
        assert "grpo_exporter_partial_runs 0.0" in text, "a first read this small is whole"

    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.search(r'[{,]rank="([^"]*)"', line)
        key = m.group(1) if m else "-"
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_scaling_doc_cardinality_matches_the_exporter(tmp_path: Path) -> None:
    counts = _series_by_rank(tmp_path)
    perf_only = {counts[str(r)] for r in range(1, 16)}
    assert len(perf_only) == 1, counts
    doc = SCALING.read_text()
    stated = dict(re.findall(r"<!-- measured: (\w+)=(\d+) -->", doc))
    assert stated, "docs/scaling.md states no measured counts"
    assert int(stated["rank0"]) == counts["0"], f"rank 0 exports {counts['0']} series"
    assert int(stated["perf_rank"]) == perf_only.pop()


def _series_per_gpu(nvlink_links: int) -> int:
    from fake_pynvml import FakeDevice, FakeNVML
    from grpo_monitor.runtime.collectors.gpu import GPUCollector
    from prometheus_client import CollectorRegistry, generate_latest

    devices = [FakeDevice(uuid=f"GPU-{i:04d}", nvlink_links=nvlink_links,
                          nvlink={link: (0, 0, 0, 0) for link in range(nvlink_links)}) for i in range(2)]
    registry = CollectorRegistry()
    collector = GPUCollector(0.02, nvml=FakeNVML(devices), registry=registry)
    collector.start()
    try:
        wait_for(lambda: 'gpu="1"' in generate_latest(registry).decode(), 10, what="GPU collection")
        text = generate_latest(registry).decode()
    finally:
        collector.stop()
    return sum(1 for line in text.splitlines() if not line.startswith("#") and 'gpu="0"' in line)


def test_scaling_doc_gpu_series_match_the_collector() -> None:
    stated = dict(re.findall(r"<!-- measured: (\w+)=(\d+) -->", SCALING.read_text()))
    # H100 / H200 SXM: 18 NVLink links; a PCIe board: none (NVML answers NotSupported).
    assert int(stated["gpu_nvlink18"]) == _series_per_gpu(18)
    assert int(stated["gpu_no_nvlink"]) == _series_per_gpu(0)


def test_grafana_provisioning_resolves_inside_the_stack(config: dict[str, Any]) -> None:
    """The dashboard provider's folder is the mounted grafana/dashboards, and the datasources
    name compose services (host:port that the compose network resolves)."""
    svc = config["services"]["grafana"]
    mounts = _mounts(svc)
    providers = [p for f in sorted((ROOT / "grafana" / "provisioning" / "dashboards").glob("*.yml"))
                 for p in yaml.safe_load(f.read_text())["providers"]]
    assert providers
    for p in providers:
        host = _container_path(mounts, p["options"]["path"])
        assert host is not None and list(host.glob("*.json")), p["options"]["path"]
    ports = {name: {str(p["target"]) if isinstance(p, dict) else p.rsplit(":", 1)[-1].split("/")[0]
                    for p in s.get("ports", [])} for name, s in config["services"].items()}
    for f in (ROOT / "grafana" / "provisioning" / "datasources").glob("*.yml"):
        for ds in yaml.safe_load(f.read_text())["datasources"]:
            m = re.match(r"https?://([^:/]+):(\d+)", grafana_expand(ds["url"], svc["environment"]))
            assert m and m.group(2) in ports.get(m.group(1), set()), ds["url"]


def grafana_expand(value: str, env: dict[str, str]) -> str:
    """A provisioning value as Grafana reads it: $NAME and ${NAME} replaced from its environment
    (Go's os.ExpandEnv; an unset name, or ${NAME:-default}, which Go takes as one name, is "")."""
    return re.sub(r"\$\{([^}]*)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def _prometheus_datasource_url(env: dict[str, str],
                               provisioning: Path = ROOT / "grafana" / "provisioning") -> str:
    datasources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    [ds] = [d for d in datasources if d["type"] == "prometheus"]
    return grafana_expand(ds["url"], env)


def test_grafana_asks_the_engine_that_runs(config: dict[str, Any], vm_config: dict[str, Any],
                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboards' Prometheus datasource is Prometheus by default, victoria-metrics (which
    answers PromQL) under the override, each a service that runs there; `stack up` points it at
    its own engine's port."""
    for cfg, url in ((config, "http://prometheus:9090"), (vm_config, "http://victoriametrics:8428")):
        assert _prometheus_datasource_url(cfg["services"]["grafana"]["environment"]) == url
        host = re.match(r"http://([^:]+):", url).group(1)
        assert host in _enabled(cfg), f"{host} does not start"
    # `stack up`: the provisioning it hands grafana-server, with the environment it gives it.
    spawned: dict[str, Any] = {}
    monkeypatch.setattr(NativeStack, "_spawn", lambda self, name, argv, port, url, env=None:
                        spawned.update(env=env))
    native = NativeStack(StackConfig(tmp_path / "snapshots", tmp_path / "state", ROOT / "prometheus"))
    native._start_grafana("grafana-server", Path("/usr/share/grafana"), 18428, 19093)
    prov = tmp_path / "state" / "grafana-provisioning"
    assert _prometheus_datasource_url(spawned["env"], prov) == "http://127.0.0.1:18428"
