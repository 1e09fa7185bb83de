"""Real containers without Docker: podman (runc) behind its Docker-compatible API socket, driven
by Debian's docker-compose 1.29, and the base images built locally from Debian's packages.

Used by tests/test_compose_stack.py. Why each piece:

* podman, not Docker: no Docker engine can be installed on these machines; podman runs rootful
  containers with ``runc`` (``crun`` refuses the hybrid cgroup layout here) and, through
  ``CONTAINERS_CONF``, default ulimits this VM accepts (its own defaults cannot be set here).
* docker-compose 1.29 against ``podman system service``: the unchanged docker-compose.yml, read
  by a real Compose implementation, through the same API Docker serves. Classic builder
  (``COMPOSE_DOCKER_CLI_BUILD=0 DOCKER_BUILDKIT=0``): there is no docker CLI to delegate to.
* No registry is reachable, so the images docker-compose.yml names are built here: a Debian
  bookworm root filesystem (``debootstrap``) with Python 3.11 stands in for
  ``python:3.11.11-slim-bookworm`` (``python-is-python3`` gives the ``python`` that
  exporter/Dockerfile calls), and Debian's ``prometheus`` / ``prometheus-alertmanager``
  binaries on that root filesystem stand in for ``prom/prometheus:v2.53.2`` and
  ``prom/alertmanager:v0.27.0``, with the upstream images' entrypoints (/bin/prometheus,
  /bin/alertmanager), users (nobody) and data folders, and wget for the healthchecks. The
  versions differ (Debian has Prometheus 2.42, Alertmanager 0.25); the rest of the suite already
  proves the configuration on those versions, and the images are labelled with what they hold.
  Debian's ``victoria-metrics`` package (1.79.5, the version docker-compose.victoriametrics.yml
  pins) stands in for ``victoriametrics/victoria-metrics``, ``vmagent`` and ``vmalert``, laid out
  as upstream's images of that tag are (app/*/multiarch/Dockerfile there: alpine, root, working
  directory /, the binary at /<name>-prod as the entrypoint, no default command); wget is
  Debian's where upstream's is busybox's.
* The images live in a podman storage of their own (``GRPO_CONTAINER_CACHE``, default
  ``~/.cache/grpo-monitor/containers``), never in the machine's: images named like the official
  ones but holding something else must not leak into anybody's ``podman images``. They are the
  cache: each carries a label with the hash of its recipe (this file's recipe constants, the
  host's CA bundle; for the prom and VictoriaMetrics images also the Debian package versions)
  and is rebuilt only when that changes.
* The host's CA bundle goes into the base image: where outbound HTTPS passes through an
  intercepting proxy (as here), pip inside the exporter's image build must trust what the host
  trusts to reach PyPI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from polling import wait_for

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("GRPO_CONTAINER_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo-monitor" / "containers")

# docker.io names, exactly as Docker resolves the short names of exporter/Dockerfile and
# docker-compose.yml.
PYTHON_IMAGE = "docker.io/library/python:3.11.11-slim-bookworm"
PROMETHEUS_IMAGE = "docker.io/prom/prometheus:v2.53.2"
ALERTMANAGER_IMAGE = "docker.io/prom/alertmanager:v0.27.0"
# Image -> (the binary, named alike in Debian's package and upstream's image; its port).
VICTORIAMETRICS_IMAGES = {
    "docker.io/victoriametrics/victoria-metrics:v1.79.5": ("victoria-metrics", 8428),
    "docker.io/victoriametrics/vmagent:v1.79.5": ("vmagent", 8429),
    "docker.io/victoriametrics/vmalert:v1.79.5": ("vmalert", 8880),
}
VICTORIAMETRICS_PACKAGE = "victoria-metrics"
RECIPE_LABEL = "org.grpo-monitor.test-recipe"

SUITE = "bookworm"
MIRROR = os.environ.get("GRPO_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# python3-venv: `python -m venv` with pip; python-is-python3: `python`; ca-certificates: pip's
# TLS; wget: the prom images' healthchecks (busybox wget upstream).
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "wget")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

CONTAINERS_CONF = """\
# Written by tests/containers.py for the compose test's podman.
[engine]
# crun refuses this machine's hybrid cgroup layout; runc runs.
runtime = "runc"
[containers]
# podman's default limits cannot be set inside this VM.
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
"""

PROM_CONTAINERFILE = """\
FROM {base}
COPY {binary} /bin/{name}
# The package's data files at the paths Debian's build looks for them (Alertmanager's templates).
COPY share /usr/share/prometheus/{share}
# As upstream: the data folder belongs to nobody, who runs the server; a named volume mounted
# there starts as a copy of it (ownership included).
RUN mkdir -p /etc/{name} /{name} && chown nobody:nogroup /{name}
USER nobody
WORKDIR /{name}
EXPOSE {port}
ENTRYPOINT ["/bin/{name}"]
CMD {cmd}
"""

VM_CONTAINERFILE = """\
FROM {base}
# Upstream's layout: root, working directory /, the binary as /{name}-prod and the entrypoint,
# every flag given by the compose file's `command:`.
COPY {binary} /{name}-prod
EXPOSE {port}
ENTRYPOINT ["/{name}-prod"]
"""


def run(argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None,
        check: bool = True, input: str | None = None,  # noqa: A002
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                         input=input, cwd=cwd)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {res.returncode}\n"
                             f"stdout:\n{res.stdout[-4000:]}\nstderr:\n{res.stderr[-4000:]}")
    return res


# What a wait on podman and its containers retries: any error (a podman command failing, a
# container not up yet, a file half written) means "not yet".
ANY_ERROR: tuple[type[BaseException], ...] = (Exception,)


def missing_tools() -> list[str]:
    return [t for t in ("podman", "runc", "debootstrap", "docker-compose", "iptables")
            if shutil.which(t) is None]


class Podman:
    """podman with this suite's containers.conf and storage, and its API service."""

    def __init__(self, cache: Path = CACHE) -> None:
        self.cache = cache
        self.root = cache / "storage"
        self.runroot = cache / "run"
        self.conf = cache / "containers.conf"
        self.sock = cache / "podman.sock"
        self.cache.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(CONTAINERS_CONF)
        self.env = {**os.environ, "CONTAINERS_CONF": str(self.conf),
                    # HEALTHCHECK survives only in Docker-format images (OCI has no such field).
                    "BUILDAH_FORMAT": "docker"}
        self.service: subprocess.Popen[bytes] | None = None

    def argv(self, *args: str) -> list[str]:
        return ["podman", "--root", str(self.root), "--runroot", str(self.runroot),
                "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs", *args]

    def __call__(self, *args: str, timeout: float = 120, check: bool = True,
                 input: str | None = None) -> subprocess.CompletedProcess[str]:  # noqa: A002
        return run(self.argv(*args), timeout=timeout, env=self.env, check=check, input=input)

    # --- the Docker-compatible API ----------------------------------------------------------

    def _ping(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(str(self.sock))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
            return s.recv(4096).split(b"\r\n", 1)[0].endswith(b"200 OK")

    def start_service(self, log: Path) -> None:
        self.sock.unlink(missing_ok=True)
        with log.open("wb") as fh:
            # --time 0: no idle timeout; the test stops it.
            self.service = subprocess.Popen(
                self.argv("system", "service", "--time", "0", f"unix://{self.sock}"),
                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env)
        wait_for(self._ping, 60, 0.5, what="podman system service answers /_ping",
                 diagnose=lambda: log.read_text(errors="replace")[-3000:], retry_on=ANY_ERROR)

    def stop_service(self) -> None:
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(20)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait(10)

    @property
    def docker_host(self) -> str:
        return f"unix://{self.sock}"

    # --- images -----------------------------------------------------------------------------

    def label(self, image: str, name: str = RECIPE_LABEL) -> str | None:
        res = self("image", "inspect", "--format", "json", image, check=False)
        if res.returncode != 0:
            return None
        return (json.loads(res.stdout)[0].get("Labels") or {}).get(name)


def package_version(package: str) -> str:
    return run(["dpkg-query", "-W", "-f", "${Version}", package], timeout=30).stdout.strip()


def base_recipe_hash() -> str:
    """What the Python base image is made of; any change rebuilds it (debootstrap)."""
    h = hashlib.sha256()
    for part in (SUITE, MIRROR, *PACKAGES):
        h.update(part.encode() + b"\0")
    if HOST_CA_BUNDLE.is_file():
        h.update(HOST_CA_BUNDLE.read_bytes())
    return h.hexdigest()[:16]


def prom_recipe_hash(base: str) -> str:
    """What the Prometheus and Alertmanager images are made of: the base, the recipe and the
    Debian packages' versions (an upgrade rebuilds them, in seconds)."""
    h = hashlib.sha256()
    for part in (base, PROM_CONTAINERFILE, package_version("prometheus"),
                 package_version("prometheus-alertmanager")):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def vm_recipe_hash(base: str) -> str:
    """What the three VictoriaMetrics images are made of: the base, the recipe, the package's
    version."""
    h = hashlib.sha256()
    for part in (base, VM_CONTAINERFILE, package_version(VICTORIAMETRICS_PACKAGE)):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:16]


def ensure_base_images(podman: Podman, log: Callable[[str], None] = print) -> dict[str, float]:
    """Build the stand-in images unless the cache holds them for this recipe. Returns the
    seconds each step took (empty when everything was cached)."""
    key = base_recipe_hash()
    prom_key = prom_recipe_hash(key)
    timings: dict[str, float] = {}
    if podman.label(PYTHON_IMAGE) != key:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="grpo-rootfs-", dir=podman.cache) as tmp:
            rootfs = Path(tmp) / "rootfs"
            run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE,
                 str(rootfs), MIRROR], timeout=1200)
            if HOST_CA_BUNDLE.is_file():
                shutil.copyfile(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (rootfs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            tar = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."],
                                   stdout=subprocess.PIPE)
            imp = subprocess.run(
                podman.argv("import",
                            "--change", f"LABEL {RECIPE_LABEL}={key}",
                            "--change", "LABEL org.opencontainers.image.description="
                                        "Debian bookworm + python3.11, a local stand-in for the compose test",
                            "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                            "--change", 'CMD ["python3"]',
                            "-", PYTHON_IMAGE),
                stdin=tar.stdout, capture_output=True, text=True, timeout=600, env=podman.env)
            assert tar.stdout is not None
            tar.stdout.close()
            tar.wait(60)
            assert imp.returncode == 0 and tar.returncode == 0, imp.stderr
        timings["debootstrap+import"] = time.monotonic() - t0
        log(f"built {PYTHON_IMAGE} in {timings['debootstrap+import']:.0f} s")
    specs = [(PROMETHEUS_IMAGE, "prometheus", "prometheus", "web", 9090,
              '["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]'),
             (ALERTMANAGER_IMAGE, "alertmanager", "prometheus-alertmanager", "alertmanager", 9093,
              '["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"]')]
    for image, name, debian_binary, share, port, cmd in specs:
        if podman.label(image) == prom_key:
            continue
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="grpo-prom-", dir=podman.cache) as tmp:
            ctx = Path(tmp)
            binary = shutil.which(debian_binary)
            assert binary, f"{debian_binary} is not installed (Debian package)"
            shutil.copy2(binary, ctx / name)
            shutil.copytree(Path("/usr/share/prometheus") / share, ctx / "share", symlinks=True)
            (ctx / "Containerfile").write_text(PROM_CONTAINERFILE.format(
                base=PYTHON_IMAGE, binary=name, name=name, share=share, port=port, cmd=cmd))
            version = package_version("prometheus" if name == "prometheus" else "prometheus-alertmanager")
            podman("build", "--format", "docker", "--label", f"{RECIPE_LABEL}={prom_key}",
                   "--label", f"org.opencontainers.image.description=Debian {debian_binary} {version}, "
                              "a local stand-in for the compose test",
                   "-t", image, "-f", str(ctx / "Containerfile"), str(ctx), timeout=600)
        timings[name] = time.monotonic() - t0
        log(f"built {image} from Debian's {debian_binary} in {timings[name]:.0f} s")
    vm_key = vm_recipe_hash(key)
    vm_version = package_version(VICTORIAMETRICS_PACKAGE)
    for image, (name, port) in VICTORIAMETRICS_IMAGES.items():
        if podman.label(image) == vm_key:
            continue
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="grpo-vm-", dir=podman.cache) as tmp:
            ctx = Path(tmp)
            binary = shutil.which(name)
            assert binary, f"{name} is not installed (Debian package {VICTORIAMETRICS_PACKAGE})"
            shutil.copy2(binary, ctx / name)
            (ctx / "Containerfile").write_text(VM_CONTAINERFILE.format(
                base=PYTHON_IMAGE, binary=name, name=name, port=port))
            podman("build", "--format", "docker", "--label", f"{RECIPE_LABEL}={vm_key}",
                   "--label", f"org.opencontainers.image.description=Debian {VICTORIAMETRICS_PACKAGE} "
                              f"{vm_version}: {name}, a local stand-in for the compose test",
                   "-t", image, "-f", str(ctx / "Containerfile"), str(ctx), timeout=600)
        timings[name] = time.monotonic() - t0
        log(f"built {image} from Debian's {name} in {timings[name]:.0f} s")
    return timings
