"""deploy/Dockerfile, deploy/compose.yaml and deploy/prometheus.yml, checked by parsing them and
against the real CLI parser and config model. No Docker engine runs here: these tests do not
build or start anything from these files."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from deploykit import REPO, parse_cli
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from popmq.config import BrokerAddress, load_config

DEPLOY = REPO / "deploy"


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}".strip() if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, rest = pending.partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def stages(instructions: list[tuple[str, str]]) -> list[tuple[str, list[tuple[str, str]]]]:
    result: list[tuple[str, list[tuple[str, str]]]] = []
    for keyword, rest in instructions:
        if keyword == "FROM":
            match = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", rest, re.IGNORECASE)
            assert match, rest
            result.append((match.group(2) or "", []))
        elif result:
            result[-1][1].append((keyword, rest))
    return result


INSTRUCTIONS = dockerfile_instructions(DEPLOY / "Dockerfile")
STAGES = stages(INSTRUCTIONS)
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PROMETHEUS = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())


def _interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with VAR unset (the only interpolation the file uses)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def service_env(service: dict[str, Any]) -> dict[str, str]:
    return {k: _interpolate(str(v)) for k, v in service.get("environment", {}).items()}


def by_command(command: str) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in SERVICES.items() if s.get("command", [None])[0] == command}


def flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


# --- Dockerfile ------------------------------------------------------------------------------


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    assert len(STAGES) >= 2
    names = [name for name, _ in STAGES]
    final = STAGES[-1][1]
    froms = [rest for kw, rest in INSTRUCTIONS if kw == "FROM"]
    assert all("slim" in f for f in froms), froms
    # The runtime copies the built venv from an earlier stage and installs nothing itself.
    copies = [rest for kw, rest in final if kw == "COPY"]
    assert any(re.match(rf"--from={re.escape(names[0])}\s", c) for c in copies), copies
    assert not any("pip install" in rest for kw, rest in final if kw == "RUN")
    users = [rest for kw, rest in final if kw == "USER"]
    assert users, "the runtime stage must switch user"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can check it"
    assert uid == str(yaml.safe_load((REPO / "helm/popmq/values.yaml").read_text())
                      ["podSecurityContext"]["runAsUser"])  # fmt: skip
    installs = [m for kw, rest in STAGES[0][1] if kw == "RUN"
                for m in re.findall(r"pip install \"?\.(?:\[([^\]]*)\])?", rest)]  # fmt: skip
    assert installs, "the build stage installs the package"
    # Regression: the image installed `.` alone, so tracing.otlp_endpoint could not work in it.
    extras = {e.strip() for found in installs for e in found.split(",") if e.strip()}
    assert "otel" in extras, installs
    known = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras <= set(known), extras - set(known)


def test_dockerfile_entrypoint_and_default_command_parse_with_the_cli() -> None:
    final = STAGES[-1][1]
    entrypoint = json.loads(next(rest for kw, rest in final if kw == "ENTRYPOINT"))
    cmd = json.loads(next(rest for kw, rest in final if kw == "CMD"))
    assert entrypoint == ["popmq"]
    exposed = {int(p) for kw, rest in final if kw == "EXPOSE" for p in rest.split()}
    assert exposed == {8081, 9090, 10911}
    args = parse_cli(cmd)
    assert args.command == "serve"
    assert args.host == "0.0.0.0" and args.port == 8081


def test_build_context_keeps_the_package_and_drops_local_state() -> None:
    ignore = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, pattern) for pattern in ignore)

    for local in (".git", ".venv", ".venv-client", "data", "tests"):
        assert ignored(local), f"{local} would be sent to the image build"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    # setup.py maps the installed packages onto these top-level folders.
    folders = ["popmq", "broker", "proxy"]
    assert all((REPO / folder / "__init__.py").is_file() for folder in folders)
    for needed in [*folders, "setup.py", "pyproject.toml", project["project"]["readme"]]:
        assert not ignored(needed), f"{needed} is needed by `pip install .`"


# --- compose.yaml ----------------------------------------------------------------------------


def test_compose_has_three_brokers_two_proxies_and_prometheus() -> None:
    assert len(by_command("broker")) == 3
    assert len(by_command("proxy")) == 2
    assert "prometheus" in SERVICES
    for name in [*by_command("broker"), *by_command("proxy")]:
        service = SERVICES[name]
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        assert service["read_only"] is True and service["user"].split(":")[0] != "0"


def test_compose_broker_commands_parse_and_own_a_volume() -> None:
    volumes_seen: set[str] = set()
    names: set[str] = set()
    for service in by_command("broker").values():
        args = parse_cli(service["command"])
        assert args.host == "0.0.0.0" and args.port == 10911
        assert args.flush in {"sync", "async"}
        names.add(args.name)
        (volume,) = service["volumes"]
        source, target = volume.split(":")
        assert source in COMPOSE["volumes"] and source not in volumes_seen
        assert Path(args.data_dir).is_relative_to(target)
        volumes_seen.add(source)
        load_config(environ=service_env(service))  # every POPMQ_* name is a real field
    assert len(names) == 3


def test_compose_proxies_reach_every_broker_and_publish_distinct_ports() -> None:
    brokers = {
        parse_cli(s["command"]).name: (name, parse_cli(s["command"]).port)
        for name, s in by_command("broker").items()
    }
    host_ports = set()
    for service in by_command("proxy").values():
        argv = service["command"]
        addresses = [BrokerAddress.parse(text) for text in flag_values(argv, "--broker")]
        assert sorted(a.name for a in addresses) == sorted(brokers)
        for address in addresses:
            service_name, port = brokers[address.name]
            assert address.address == f"{service_name}:{port}"
            assert service_name in service["depends_on"]
        args = parse_cli(argv)
        config = load_config(environ=service_env(service), overrides={"proxy.port": args.port})
        (published,) = service["ports"]
        host_ip, host_port, container_port = published.split(":")
        assert host_ip == "127.0.0.1" and int(container_port) == args.port
        # No advertised address: routes echo whichever address the client used.
        assert config.proxy.advertise_host is None
        host_ports.add(host_port)
    assert len(host_ports) == 2


def test_prometheus_scrapes_every_proxy_metrics_port() -> None:
    expected = set()
    for name, service in by_command("proxy").items():
        metrics_port = flag_values(service["command"], "--metrics-port")
        assert metrics_port, f"{name} serves no metrics"
        expected.add(f"{name}:{metrics_port[0]}")
    job = next(j for j in PROMETHEUS["scrape_configs"] if j["job_name"] == "popmq-proxy")
    assert job["metrics_path"] == "/metrics"
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    assert targets == expected
    mount = SERVICES["prometheus"]["volumes"][0].split(":")
    assert (DEPLOY / mount[0]).resolve() == (DEPLOY / "prometheus.yml").resolve()
    assert any(arg == f"--config.file={mount[1]}" for arg in SERVICES["prometheus"]["command"])


@pytest.fixture
def health_server() -> Any:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(None)


@pytest.mark.subprocess
def test_compose_health_checks_work_against_a_grpc_health_server(health_server: Any) -> None:
    """The `popmq health` checks, run for real against grpc.health.v1."""
    servicer, port = health_server
    checks = {name: s["healthcheck"]["test"] for name, s in SERVICES.items() if "healthcheck" in s}
    assert len(checks) == 5
    for name, test in checks.items():
        assert test[:3] == ["CMD", "popmq", "health"], name
        endpoint = test[test.index("--endpoint") + 1]
        command = parse_cli(SERVICES[name]["command"])
        assert endpoint == f"127.0.0.1:{command.port}", f"{name} checks another port"
    probe = checks["proxy-1"][1:]
    probe[probe.index("--endpoint") + 1] = f"127.0.0.1:{port}"
    for status, code in ((health_pb2.HealthCheckResponse.SERVING, 0),
                         (health_pb2.HealthCheckResponse.NOT_SERVING, 1)):  # fmt: skip
        servicer.set("", status)
        result = subprocess.run(
            [sys.executable, "-m", *probe], cwd=REPO, timeout=30, capture_output=True
        )
        assert result.returncode == code, result.stderr.decode()
