"""Every file under deploy/ parses, and every command in it is one the tools accept.

Commands are checked against the real click commands of ``dask scheduler`` / ``dask worker``
(``distributed.cli``) and against the ``kelr`` CLI contract below (and the real ``kelr`` click
group once ``kelr_dist.edges.cli`` exists). A file type this module cannot parse fails the test.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import dask.config
import numpy as np
import pytest
import xarray as xr
import yaml
from conftest import free_port
from distributed.cli.dask_scheduler import main as dask_scheduler_cli
from distributed.cli.dask_worker import main as dask_worker_cli

from kelr_dist import estimate_response
from kelr_dist.edges.cli import main as cli_main
from kelr_dist.models.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
FILES = sorted(
    path for path in DEPLOY.rglob("*") if path.is_file() and "__pycache__" not in path.parts
)
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Subcommand:
    """One ``kelr`` subcommand of the CLI contract: arguments and ``--option: takes a value``."""

    arguments: int
    options: dict[str, bool] = field(default_factory=dict)
    first_argument: frozenset[str] | None = None


KELR_CLI = {
    "simulate": Subcommand(
        2,
        {"--samples": True, "--chains": True, "--seed": True, "--chunk": True, "--scheduler": True},
        frozenset({"triple-well", "langevin-morse", "ou"}),
    ),
    "info": Subcommand(1),
    "estimate": Subcommand(
        2,
        {
            "--basis": True,
            "--order": True,
            "--max-order": True,
            "--max-lag": True,
            "--max-time": True,
            "--exact": False,
            "--kde": False,
            "--scheduler": True,
            "--workers": True,
            "--memory-limit": True,
            "--quiet": False,
        },
    ),
    "run": Subcommand(1, {"--scheduler": True}),
    "report": Subcommand(1, {"--figures": True}),
}
DASK_CLI = {"scheduler": dask_scheduler_cli, "worker": dask_worker_cli}
WRAPPERS = {"exec", "nohup", "time", "env", "srun", "tini", "/usr/bin/tini", "--"}
# dask-jobqueue >= 0.8 SLURMCluster keywords (job_extra/extra/env_extra/project were renamed).
SLURM_CLUSTER_KEYWORDS = {
    "cores", "memory", "processes", "queue", "account", "walltime", "job_cpu", "job_mem",
    "job_extra_directives", "job_directives_skip", "job_script_prologue", "worker_extra_args",
    "interface", "death_timeout", "local_directory", "log_directory", "name", "python",
    "shebang", "scheduler_options", "protocol", "security", "nanny", "config_name",
}  # fmt: skip


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


class Override(list):
    """A list tagged ``!override`` in a compose file: it replaces the base file's list."""


class ComposeLoader(yaml.SafeLoader):
    """Safe YAML plus Docker Compose's merge tags ``!override`` and ``!reset``."""


ComposeLoader.add_constructor(
    "!override", lambda loader, node: Override(loader.construct_sequence(node, deep=True))
)
ComposeLoader.add_constructor("!reset", lambda loader, node: None)


def load_yaml(text: str) -> list:
    """The documents of a YAML file of deploy/ (compose tags allowed)."""
    return list(yaml.load_all(text, Loader=ComposeLoader))  # SafeLoader + two tags


# --------------------------------------------------------------------------------------------
# extracting commands
# --------------------------------------------------------------------------------------------


def shell_statements(script: str) -> Iterator[list[str]]:
    """Simple commands of a POSIX shell script, split on ``; && || | &`` and newlines
    (a quoted string may not span lines; redirections are dropped)."""
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True  # words end at whitespace and ;&|<> only (keep tcp://a:1)
        statement: list[str] = []
        redirect = False
        for token in lexer:
            if redirect:  # the target of a redirection is no argument
                redirect = False
            elif token in {">", ">>", "<", ">&", "<&"}:
                redirect = True
            elif set(token) <= set(";&|"):
                if statement:
                    yield statement
                statement = []
            else:
                statement.append(token)
        if statement:
            yield statement


def command_word(argv: list[str]) -> list[str]:
    """``argv`` from its command word on: skip ``VAR=value``, wrappers and their options."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word) or word in WRAPPERS:
            index += 1
        elif index > 0 and argv[index - 1] in WRAPPERS and word.startswith("-"):
            index += 1  # an option of the wrapper (srun --kill-on-bad-exit=0)
        else:
            break
    return argv[index:]


def expand(argv: list[str]) -> Iterator[list[str]]:
    """Commands of an exec-form ``argv``; ``sh -c SCRIPT`` yields the script's commands."""
    argv = command_word(argv)
    if len(argv) >= 3 and argv[0] in {"sh", "bash", "/bin/sh", "/bin/bash"} and argv[1] == "-c":
        for statement in shell_statements(argv[2]):
            yield command_word(statement)
    elif argv:
        yield argv


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, rest = (pending + stripped).partition(" ")
        instructions.append((keyword, rest.strip()))
        pending = ""
    assert not pending, "Dockerfile ends inside a continued instruction"
    return instructions


def dockerfile_commands(path: Path) -> Iterator[list[str]]:
    instructions = dockerfile_instructions(path.read_text())
    exec_form: dict[str, list[str]] = {}
    for keyword, argument in instructions:
        if keyword == "RUN":
            for statement in shell_statements(argument):
                yield command_word(statement)
        elif keyword in {"ENTRYPOINT", "CMD"}:
            exec_form[keyword] = json.loads(argument)
    yield from expand(exec_form.get("ENTRYPOINT", []) + exec_form.get("CMD", []))


def container_commands(pod_spec: dict) -> Iterator[list[str]]:
    for container in pod_spec["containers"]:
        yield from expand(list(container.get("command", [])) + list(container.get("args", [])))


def compose_commands(path: Path) -> Iterator[list[str]]:
    for service in load_yaml(path.read_text())[0]["services"].values():
        command = service.get("command", [])
        yield from expand(shlex.split(command) if isinstance(command, str) else command)


def kubernetes_commands(path: Path) -> Iterator[list[str]]:
    for document in yaml.safe_load_all(path.read_text()):
        if document["kind"] == "DaskCluster":
            yield from cluster_spec_commands(document["spec"])
        elif document["kind"] == "DaskJob":
            yield from container_commands(document["spec"]["job"]["spec"])
            yield from cluster_spec_commands(document["spec"]["cluster"]["spec"])


def cluster_spec_commands(spec: dict) -> Iterator[list[str]]:
    yield from container_commands(spec["worker"]["spec"])
    yield from container_commands(spec["scheduler"]["spec"])


def all_commands() -> list[tuple[str, list[str]]]:
    """``(file, argv)`` for every command found in deploy/."""
    found = []
    for path in FILES:
        if path.name == "Dockerfile":
            commands = dockerfile_commands(path)
        elif path.name.startswith("compose") and path.suffix == ".yaml":
            commands = compose_commands(path)
        elif "kubernetes" in path.parts:
            commands = kubernetes_commands(path)
        elif path.suffix in {".sh", ".sbatch"}:
            commands = (command_word(s) for s in shell_statements(path.read_text()))
        else:
            continue
        found += [(relative(path), argv) for argv in commands if argv]
    return found


COMMANDS = all_commands()
TOOL_COMMANDS = [(name, argv) for name, argv in COMMANDS if argv[0] in {"dask", "kelr"}]


# --------------------------------------------------------------------------------------------
# every file parses
# --------------------------------------------------------------------------------------------


def parse_file(path: Path) -> None:
    """Parse one deploy file by its type; unknown types fail."""
    text = path.read_text()
    if path.suffix in {".yaml", ".yml"}:
        documents = [doc for doc in load_yaml(text) if doc is not None]
        assert documents, "no YAML document"
    elif path.suffix == ".py":
        compile(ast.parse(text, filename=str(path)), str(path), "exec")
    elif path.name == "Dockerfile":
        keywords = {keyword for keyword, _ in dockerfile_instructions(text)}
        known = {"FROM", "ENV", "RUN", "WORKDIR", "COPY", "USER", "VOLUME", "EXPOSE", "ENTRYPOINT"}
        assert keywords <= known | {"CMD", "ARG", "LABEL", "HEALTHCHECK", "ADD", "SHELL"}
    elif path.suffix in {".sh", ".sbatch"}:
        assert text.startswith("#!/bin/"), "shell scripts need a #!/bin/sh or #!/bin/bash line"
        shell = text.splitlines()[0][2:].split()[0]
        subprocess.run([shell, "-n", str(path)], check=True, capture_output=True)
        assert os.access(path, os.X_OK), "shell scripts must be executable"
    elif path.suffix == ".md":
        assert text.strip().startswith("#")
    else:
        pytest.fail(f"{relative(path)}: no parser for this file type in tests/test_deploy.py")


@pytest.mark.parametrize("path", FILES, ids=relative)
def test_every_deploy_file_parses(path):
    parse_file(path)


def test_deploy_tree_has_the_documented_files():
    names = {relative(path) for path in FILES}
    expected = {
        "deploy/Dockerfile",
        "deploy/compose.yaml",
        "deploy/compose.tls.yaml",
        "deploy/README.md",
        "deploy/kubernetes/daskcluster.yaml",
        "deploy/kubernetes/daskjob.yaml",
        "deploy/kubernetes/networkpolicy.yaml",
        "deploy/slurm/jobqueue_slurm.py",
        "deploy/slurm/kelr.sbatch",
        "deploy/tls/dask-tls.yaml",
        "deploy/tls/make-certs.sh",
    }
    assert expected <= names
    readme = (DEPLOY / "README.md").read_text()
    for name in names - {"deploy/README.md"}:
        assert name.removeprefix("deploy/") in readme, f"README.md does not explain {name}"


def test_no_private_keys_committed():
    for path in FILES:
        assert "PRIVATE KEY-----" not in path.read_text(), relative(path)
        assert path.suffix not in {".pem", ".key", ".crt"}, relative(path)


# --------------------------------------------------------------------------------------------
# every command is valid
# --------------------------------------------------------------------------------------------


def check_kelr_contract(argv: list[str]) -> None:
    """``argv = ["kelr", SUBCOMMAND, ...]`` against the CLI contract :data:`KELR_CLI`."""
    if argv[1:] == ["--help"]:
        return
    assert len(argv) > 1 and argv[1] in KELR_CLI, f"unknown kelr subcommand in {argv}"
    spec = KELR_CLI[argv[1]]
    arguments, rest = [], list(argv[2:])
    while rest:
        token = rest.pop(0)
        if not token.startswith("--"):
            arguments.append(token)
            continue
        name, has_inline, _ = token.partition("=")
        assert name in spec.options or name == "--help", f"kelr {argv[1]} has no {name}"
        if spec.options.get(name) and not has_inline:
            assert rest and not rest[0].startswith("--"), f"{name} needs a value in {argv}"
            rest.pop(0)
    assert len(arguments) == spec.arguments, f"kelr {argv[1]} takes {spec.arguments}: {argv}"
    if spec.first_argument is not None:
        assert arguments[0] in spec.first_argument, argv


def check_dask(argv: list[str]) -> None:
    """``argv = ["dask", "scheduler"|"worker", ...]`` parsed by distributed's click command.

    Shell and Kubernetes variables (``"$CERTS/ca.pem"``, ``$(DASK_WORKER_NAME)``) stand for
    values only known at run time: they are replaced by an existing file's path, so that
    options which must name a file still parse.
    """
    assert len(argv) > 1 and argv[1] in DASK_CLI, f"unknown dask subcommand in {argv}"
    if "--help" not in argv:
        args = [str(Path(__file__)) if "$" in arg else arg for arg in argv[2:]]
        context = DASK_CLI[argv[1]].make_context(f"dask {argv[1]}", args)
        context.close()


def test_deploy_files_run_the_tools():
    files_with_tools = {name for name, _ in TOOL_COMMANDS}
    for name in (
        "deploy/Dockerfile",
        "deploy/compose.yaml",
        "deploy/compose.tls.yaml",
        "deploy/kubernetes/daskcluster.yaml",
        "deploy/kubernetes/daskjob.yaml",
        "deploy/slurm/kelr.sbatch",
        "deploy/tls/start-tls-cluster.sh",
    ):
        assert name in files_with_tools, f"no dask/kelr command found in {name}"


@pytest.mark.parametrize(
    ("name", "argv"), TOOL_COMMANDS, ids=[f"{n}: {' '.join(a[:2])}" for n, a in TOOL_COMMANDS]
)
def test_command_is_valid(name, argv):
    if argv[0] == "dask":
        check_dask(argv)
    else:
        check_kelr_contract(argv)


def test_no_removed_console_scripts():
    for path in FILES:
        text = path.read_text()
        assert not re.search(r"\bdask-(scheduler|worker)\b", text), relative(path)
    for _, argv in COMMANDS:
        assert argv[0] not in {"dask-scheduler", "dask-worker"}


def test_kelr_commands_match_the_real_cli():
    """Every ``kelr`` command of the deploy files parses with the real click group."""
    group = cli_main
    assert isinstance(group, click.Group)
    for _, argv in TOOL_COMMANDS:
        if argv[0] != "kelr" or argv[1:] == ["--help"]:
            continue
        assert argv[1] in group.commands, f"kelr has no subcommand {argv[1]!r}"
        # resilient parsing: option names and argument counts are checked, paths need not exist
        context = group.commands[argv[1]].make_context(
            f"kelr {argv[1]}", list(argv[2:]), resilient_parsing=True
        )
        assert context.args == [], f"unexpected arguments {context.args} in {argv}"
        context.close()


# --------------------------------------------------------------------------------------------
# the formats each file claims
# --------------------------------------------------------------------------------------------


def test_dockerfile():
    instructions = dockerfile_instructions((DEPLOY / "Dockerfile").read_text())
    keywords = [keyword for keyword, _ in instructions]
    assert instructions[0] == ("FROM", "python:3.11-slim")
    runs = " ".join(argument for keyword, argument in instructions if keyword == "RUN")
    assert re.search(r"pip install \.(\s|$)", runs)
    copied = [argument.split()[0] for keyword, argument in instructions if keyword == "COPY"]
    assert "pyproject.toml" in copied and "kelr_dist" in copied
    users = [argument for keyword, argument in instructions if keyword == "USER"]
    assert users and users[-1] not in {"root", "0"}
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")
    entrypoint = json.loads(dict(instructions)["ENTRYPOINT"])
    assert Path(entrypoint[0]).name == "tini" and "tini" in runs
    assert isinstance(json.loads(dict(instructions)["CMD"]), list)


def test_compose():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"scheduler", "worker", "job"} <= set(services)
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        assert service.get("command"), name
    build = services["scheduler"]["build"]
    context = (DEPLOY / build["context"]).resolve()
    assert (context / "pyproject.toml").is_file()
    assert (context / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    images = {service.get("image") for service in services.values()}
    assert len(images) == 1, "scheduler, workers and job must run the same image"
    worker = services["worker"]["command"]
    assert worker[:3] == ["dask", "worker", "tcp://scheduler:8786"]
    assert "--nthreads" in worker and worker[worker.index("--nthreads") + 1] == "1"
    assert "--memory-limit" in worker
    assert services["worker"]["deploy"]["replicas"] >= 1
    job = [argv for argv in compose_commands(DEPLOY / "compose.yaml") if argv[0] == "kelr"]
    assert [argv[1] for argv in job][:1] == ["simulate"] and "estimate" in [a[1] for a in job]
    for argv in job:
        if argv[1] in {"simulate", "estimate"}:
            assert argv[argv.index("--scheduler") + 1] == "tcp://scheduler:8786"
    volumes = set(compose["volumes"])
    for name in ("worker", "job"):
        mounts = {mount.split(":")[0] for mount in services[name]["volumes"]}
        assert mounts & volumes, f"{name} must mount the shared store volume"


# --------------------------------------------------------------------------------------------
# nothing reachable that runs code for anyone: scheduler ports, TLS, NetworkPolicy
# --------------------------------------------------------------------------------------------

PORT = re.compile(
    r"^(?:(?P<ip>\[[^\]]*\]|[^:\[\]]*):)??(?:(?P<published>[0-9-]*):)?(?P<target>[0-9-]+)"
    r"(?:/(?P<protocol>tcp|udp))?$"
)
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def published_ports(service: dict) -> list[tuple[str, int]]:
    """``(host interface, container port)`` of each published port ("" = all interfaces)."""
    found = []
    for entry in service.get("ports") or []:
        if isinstance(entry, dict):  # long syntax
            host, target = str(entry.get("host_ip", "")), str(entry["target"])
        else:
            match = PORT.match(str(entry))
            assert match, f"cannot read the port mapping {entry!r}"
            host, target = match["ip"] or "", match["target"]
        first, _, last = target.partition("-")
        found += [(host, port) for port in range(int(first), int(last or first) + 1)]
    return found


def scheduler_endpoints(command: list[str]) -> tuple[int, bool, int | None]:
    """``(comm port, TLS?, dashboard port)`` of a ``dask scheduler`` command."""
    options = dict(zip(command[2::1], [*command[3:], ""], strict=True))
    tls = options.get("--host", "").startswith("tls://") or options.get("--protocol") == "tls"
    dashboard = options.get("--dashboard-address", ":8787")
    no_dashboard = "--no-dashboard" in command
    return (
        int(options.get("--port", 8786)),
        tls,
        None if no_dashboard else int(dashboard.rsplit(":", 1)[1]),
    )


def merged(base: dict, override: dict) -> dict:
    """Docker Compose's merge of two files' services, for the keys checked here: ``command``
    is replaced, ``ports`` are appended unless tagged ``!override``, mappings are merged."""
    services = {name: dict(service) for name, service in base["services"].items()}
    for name, service in override["services"].items():
        target = services.setdefault(name, {})
        for key, value in service.items():
            if key == "ports" and not isinstance(value, Override):
                target[key] = [*(target.get(key) or []), *value]
            else:
                target[key] = value
    return {**base, "services": services}


def mount_target(volume: str) -> str:
    """The container path of a short-syntax volume ``SOURCE:TARGET[:MODE]``."""
    for mode in (":ro", ":rw"):
        volume = volume.removesuffix(mode)
    return volume.rsplit(":", 1)[1]


def check_no_open_plain_scheduler(compose: dict, name: str) -> None:
    """Fail when a plain-TCP scheduler port, or any dashboard, is published on all interfaces
    (or the scheduler shares the host's network, where the port mapping does not apply)."""
    schedulers = 0
    for service_name, service in compose["services"].items():
        command = service.get("command") or []
        command = shlex.split(command) if isinstance(command, str) else list(command)
        command = command_word(command)
        if command[:2] != ["dask", "scheduler"]:
            continue
        schedulers += 1
        assert service.get("network_mode") != "host", f"{name}: {service_name} on the host network"
        comm, tls, dashboard = scheduler_endpoints(command)
        for host, port in published_ports(service):
            everyone = host not in LOOPBACK_HOSTS
            assert not (port == comm and everyone and not tls), (
                f"{name}: {service_name} publishes its plain-TCP scheduler port {port} on "
                f"{host or 'all interfaces'}: anyone who reaches it can run code on the workers"
            )
            assert not (port == dashboard and everyone), (
                f"{name}: {service_name} publishes its dashboard {port} on {host or 'all'}"
            )
    assert schedulers == 1, f"{name}: expected one dask scheduler service"


def test_compose_publishes_no_plain_tcp_scheduler_port_on_all_interfaces():
    base = load_yaml((DEPLOY / "compose.yaml").read_text())[0]
    check_no_open_plain_scheduler(base, "compose.yaml")
    ports = published_ports(base["services"]["scheduler"])
    assert ("127.0.0.1", 8786) in ports  # reachable from this host (kelr --scheduler)

    tls = merged(base, load_yaml((DEPLOY / "compose.tls.yaml").read_text())[0])
    check_no_open_plain_scheduler(tls, "compose.yaml + compose.tls.yaml")
    services = tls["services"]
    assert ("", 8786) in published_ports(services["scheduler"])  # TLS: open to other hosts
    assert scheduler_endpoints(command_word(services["scheduler"]["command"]))[1]
    assert services["worker"]["command"][2] == "tls://scheduler:8786"
    for argv in compose_commands(DEPLOY / "compose.tls.yaml"):
        if "--scheduler" in argv:
            assert argv[argv.index("--scheduler") + 1] == "tls://scheduler:8786", argv
    for name in ("scheduler", "worker", "job"):
        assert services[name]["environment"]["DASK_CONFIG"] == "/etc/kelr/dask"
        mounts = {mount_target(volume) for volume in services[name]["volumes"]}
        assert {"/etc/kelr/tls", "/etc/kelr/dask/dask-tls.yaml"} <= mounts, name
    config = yaml.safe_load((DEPLOY / "tls" / "dask-tls.yaml").read_text())
    assert config["distributed"]["comm"]["tls"]["ca-file"].startswith("/etc/kelr/tls/")

    # the check itself catches what it is for
    for ports in (["8786:8786"], ["0.0.0.0:8786:8786"], ["8786"], [{"target": 8786}]):
        opened = {"services": {"scheduler": {**base["services"]["scheduler"], "ports": ports}}}
        with pytest.raises(AssertionError, match="plain-TCP scheduler port 8786"):
            check_no_open_plain_scheduler(opened, "test")


def test_network_policies_admit_only_the_cluster_to_each_scheduler():
    documents = kubernetes_documents()
    policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
    clusters = {d["metadata"]["name"] for d in documents if d["kind"] in {"DaskCluster", "DaskJob"}}
    assert clusters == {"kelr", "kelr-estimate"}
    for policy in policies:
        assert policy["apiVersion"] == "networking.k8s.io/v1"
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    for cluster in clusters:
        for component in ("scheduler", "worker"):
            selected = [
                p for p in policies
                if p["spec"]["podSelector"]["matchLabels"]
                == {"dask.org/cluster-name": cluster, "dask.org/component": component}
            ]  # fmt: skip
            assert len(selected) == 1, f"no NetworkPolicy for the {component}s of {cluster}"
            for rule in selected[0]["spec"]["ingress"]:
                assert rule.get("from"), "an ingress rule without 'from' admits everyone"
                for peer in rule["from"]:
                    assert "ipBlock" not in peer
                    labels = peer["podSelector"]["matchLabels"]
                    if "namespaceSelector" in peer:  # the operator, on the dashboard only
                        assert labels == {"application": "dask-kubernetes-operator"}
                        assert [p["port"] for p in rule["ports"]] == [8787]
                        continue
                    assert labels["dask.org/cluster-name"] == cluster
                    if component == "scheduler":
                        assert labels["dask.org/component"] in {"worker", "job-runner"}
                        assert [p["port"] for p in rule["ports"]] == [8786]


def kubernetes_documents() -> list[dict]:
    return [
        document
        for path in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
        for document in load_yaml(path.read_text())
    ]


def check_pod_spec(pod_spec: dict, container_name: str | None = None) -> None:
    containers = pod_spec["containers"]
    assert containers and all({"name", "image"} <= set(c) for c in containers)
    if container_name is not None:  # the operator merges its settings into this container
        assert container_name in {c["name"] for c in containers}


def check_cluster_spec(spec: dict, cluster_name: str) -> None:
    """The operator's DaskCluster spec: worker.replicas/spec, scheduler.spec/service."""
    assert set(spec) <= {"worker", "scheduler", "idleTimeout"}
    assert {"worker", "scheduler"} <= set(spec)
    assert set(spec["worker"]) <= {"replicas", "spec", "metadata"} and "spec" in spec["worker"]
    assert isinstance(spec["worker"]["replicas"], int) and spec["worker"]["replicas"] >= 1
    check_pod_spec(spec["worker"]["spec"], "worker")
    scheduler = spec["scheduler"]
    assert set(scheduler) <= {"spec", "service", "metadata"}
    assert {"spec", "service"} <= set(scheduler)
    check_pod_spec(scheduler["spec"], "scheduler")
    service = scheduler["service"]
    assert service["selector"] == {
        "dask.org/cluster-name": cluster_name,
        "dask.org/component": "scheduler",
    }
    assert 8786 in {port["port"] for port in service["ports"]}
    port_names = {
        port["name"] for c in scheduler["spec"]["containers"] for port in c.get("ports", [])
    }
    assert {port["targetPort"] for port in service["ports"]} <= port_names


def test_kubernetes_manifests():
    documents = kubernetes_documents()
    for document in documents:
        assert {"apiVersion", "kind", "metadata"} <= set(document)
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", document["metadata"]["name"])
    kinds = {document["kind"]: document for document in documents}
    assert {"DaskCluster", "DaskJob", "PersistentVolumeClaim"} <= set(kinds)
    for kind in ("DaskCluster", "DaskJob"):
        assert kinds[kind]["apiVersion"] == "kubernetes.dask.org/v1"
    cluster = kinds["DaskCluster"]
    check_cluster_spec(cluster["spec"], cluster["metadata"]["name"])
    job = kinds["DaskJob"]
    assert set(job["spec"]) == {"job", "cluster"}
    check_pod_spec(job["spec"]["job"]["spec"])
    check_cluster_spec(job["spec"]["cluster"]["spec"], job["metadata"]["name"])
    claims = {
        document["metadata"]["name"]: document
        for document in documents
        if document["kind"] == "PersistentVolumeClaim"
    }
    used = re.findall(r"claimName: (\S+)", yaml.safe_dump(documents))
    assert used and set(used) <= set(claims)
    for claim in claims.values():
        assert "ReadWriteMany" in claim["spec"]["accessModes"]


def test_slurm_jobqueue_script():
    path = DEPLOY / "slurm" / "jobqueue_slurm.py"
    tree = ast.parse(path.read_text())
    imports = {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert ("dask_jobqueue", "SLURMCluster") in imports
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    cluster_calls = [
        c for c in calls if isinstance(c.func, ast.Name) and c.func.id == "SLURMCluster"
    ]
    assert len(cluster_calls) == 1
    keywords = {keyword.arg for keyword in cluster_calls[0].keywords}
    assert keywords <= SLURM_CLUSTER_KEYWORDS, keywords - SLURM_CLUSTER_KEYWORDS
    assert {"cores", "memory"} <= keywords
    estimates = [
        c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "estimate_response"
    ]
    assert len(estimates) == 1
    assert (
        isinstance(estimates[0].func.value, ast.Name) and estimates[0].func.value.id == "kelr_dist"
    )
    assert "client" in {keyword.arg for keyword in estimates[0].keywords}
    guards = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test)
    ]
    assert guards, "the script needs an `if __name__ == '__main__':` guard"


def test_estimate_response_accepts_a_client():
    """The Python API the SLURM script calls."""
    parameters = inspect.signature(estimate_response).parameters
    assert "client" in parameters


def test_sbatch_directives():
    text = (DEPLOY / "slurm" / "kelr.sbatch").read_text()
    directives = re.findall(r"^#SBATCH\s+(\S+)", text, flags=re.MULTILINE)
    assert directives
    known = {
        "--job-name", "--nodes", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--mem",
        "--mem-per-cpu", "--time", "--output", "--error", "--partition", "--account",
    }  # fmt: skip
    for directive in directives:
        assert directive.split("=")[0] in known, directive
    names = [argv[:2] for name, argv in COMMANDS if name == "deploy/slurm/kelr.sbatch"]
    assert ["dask", "scheduler"] in names and ["dask", "worker"] in names


def test_sbatch_cluster_speaks_tls_with_the_dashboard_on_loopback():
    text = (DEPLOY / "slurm" / "kelr.sbatch").read_text()
    commands = [argv for name, argv in COMMANDS if name == "deploy/slurm/kelr.sbatch"]
    (scheduler,) = [argv for argv in commands if argv[:2] == ["dask", "scheduler"]]
    (worker,) = [argv for argv in commands if argv[:2] == ["dask", "worker"]]
    options = dict(zip(scheduler[2::1], [*scheduler[3:], ""], strict=True))
    assert options["--host"].startswith("tls://")
    assert options["--dashboard-address"].startswith("127.0.0.1:")
    for argv, role in ((scheduler, "scheduler"), (worker, "worker")):
        assert {"--tls-ca-file", "--tls-cert", "--tls-key"} <= set(argv), argv
        assert argv[argv.index("--tls-cert") + 1].endswith(f"/{role}.pem")
    assert "--no-dashboard" in worker
    assert 'SCHEDULER="tls://' in text and "tcp://" not in text
    assert "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT" in text


def test_jobqueue_script_uses_tls_loopback_dashboard_and_write_result():
    tree = ast.parse((DEPLOY / "slurm" / "jobqueue_slurm.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    (cluster,) = [c for c in calls if isinstance(c.func, ast.Name) and c.func.id == "SLURMCluster"]
    keywords = {keyword.arg: keyword.value for keyword in cluster.keywords}
    assert ast.literal_eval(keywords["protocol"]) == "tls" and "security" in keywords
    options = ast.literal_eval(keywords["scheduler_options"])
    assert options["dashboard_address"].startswith("127.0.0.1:")
    (made,) = [c for c in calls if isinstance(c.func, ast.Name) and c.func.id == "Security"]
    security = {keyword.arg: keyword.value for keyword in made.keywords}
    assert ast.literal_eval(security["require_encryption"]) is True
    attributes = {c.func.attr for c in calls if isinstance(c.func, ast.Attribute)}
    assert "write_result" in attributes and "to_zarr" not in attributes


@pytest.mark.slow
def test_sbatch_recipe_runs_over_tls(tmp_path):
    """The recipe itself, run by bash on this machine (``srun`` replaced by a script that runs
    its command once): certificates from make-certs.sh, a TLS scheduler and worker, and kelr's
    info, estimate and report against them."""
    certs, bin_ = tmp_path / "certs", tmp_path / "bin"
    host = socket.gethostname()
    subprocess.run([str(DEPLOY / "tls" / "make-certs.sh"), str(certs), host, "localhost"],
                   check=True, capture_output=True)  # fmt: skip
    bin_.mkdir()
    srun = bin_ / "srun"
    srun.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n')
    srun.chmod(0o755)
    store, out = tmp_path / "ou.zarr", tmp_path / "response.zarr"
    simulate("ou", store, 20_000, chunk=5_000, seed=3, progress=False)
    env = os.environ | {
        "PATH": f"{bin_}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "KELR_TLS_CERTS": str(certs),
        "KELR_SCHEDULER_PORT": str(free_port()),
        "TMPDIR": str(tmp_path),
    }
    run = subprocess.Popen(
        ["bash", str(DEPLOY / "slurm" / "kelr.sbatch"), str(store), str(out)], env=env,
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = run.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # the worker srun started
    assert run.returncode == 0, stderr[-3000:]
    result = xr.open_zarr(out, consolidated=False)
    assert result.attrs["n_samples"] == 20_000
    assert (tmp_path / "response-figures").is_dir()


def flatten(mapping: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_tls_config_keys_exist_in_distributed():
    config = yaml.safe_load((DEPLOY / "tls" / "dask-tls.yaml").read_text())
    keys = flatten(config)
    for key in keys:
        assert dask.config.get(key, default="<missing>") != "<missing>", f"unknown key {key}"
    for role in ("scheduler", "worker", "client"):
        assert (
            keys[f"distributed.comm.tls.{role}.cert"] and keys[f"distributed.comm.tls.{role}.key"]
        )
    assert keys["distributed.comm.require-encryption"] is True
    tls_commands = [
        argv for name, argv in TOOL_COMMANDS if name == "deploy/tls/start-tls-cluster.sh"
    ]
    for argv in tls_commands:
        if argv[0] == "dask":
            assert {"--tls-ca-file", "--tls-cert", "--tls-key"} <= set(argv)
            assert any(arg.startswith("tls://") for arg in argv)


# --------------------------------------------------------------------------------------------
# the TLS recipe works: certificates from make-certs.sh, a real scheduler and worker
# --------------------------------------------------------------------------------------------


def read_scheduler_file(path: Path, process: subprocess.Popen, seconds: float = 60.0) -> dict:
    """The scheduler file's contents once the scheduler has written it whole: the file appears
    before its JSON is written, so an empty or partial file is waited on, not read."""
    deadline = time.monotonic() + seconds
    while True:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} was not written within {seconds} s"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            time.sleep(0.2)


def test_tls_cluster_runs_with_generated_certificates(tmp_path):
    """A TLS-only ``dask scheduler`` and ``dask worker`` with certificates from make-certs.sh
    run an estimate for ``kelr`` (``get_client`` with the TLS settings of the dask config); a
    plain-TCP client is refused."""
    from distributed import Client

    from kelr_dist.engine.cluster import get_client
    from kelr_dist.models.simulate import simulate

    store = tmp_path / "ou.zarr"
    simulate("ou", store, 20_000, chunk=5_000, seed=2, progress=False)

    certs = tmp_path / "certs"
    subprocess.run(
        [str(DEPLOY / "tls" / "make-certs.sh"), str(certs), "localhost"],
        check=True,
        capture_output=True,
    )
    assert (certs / "scheduler-key.pem").stat().st_mode & 0o077 == 0
    config = yaml.safe_load((DEPLOY / "tls" / "dask-tls.yaml").read_text())
    tls = config["distributed"]["comm"]["tls"]
    tls["ca-file"] = str(certs / "ca.pem")
    for role in ("scheduler", "worker", "client"):
        tls[role] = {"cert": str(certs / f"{role}.pem"), "key": str(certs / f"{role}-key.pem")}
    scheduler_file = tmp_path / "scheduler.json"
    dask_cli = str(BIN / "dask")
    flags = ["--tls-ca-file", str(certs / "ca.pem")]
    scheduler = subprocess.Popen(
        [dask_cli, "scheduler", "--host", "tls://127.0.0.1", "--port", "0",
         "--dashboard-address", ":0", "--scheduler-file", str(scheduler_file), *flags,
         "--tls-cert", str(certs / "scheduler.pem"), "--tls-key", str(certs / "scheduler-key.pem")],
        stdout=(tmp_path / "scheduler.log").open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    worker = None
    try:
        address = read_scheduler_file(scheduler_file, scheduler)["address"]
        assert address.startswith("tls://")
        worker = subprocess.Popen(
            [dask_cli, "worker", address, "--nthreads", "1", "--memory-limit", "1GiB",
             "--no-dashboard", "--local-directory", str(tmp_path), *flags,
             "--tls-cert", str(certs / "worker.pem"), "--tls-key", str(certs / "worker-key.pem")],
            stdout=(tmp_path / "worker.log").open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        with dask.config.set(flatten(config)), get_client(address) as client:
            client.wait_for_workers(1, timeout=60)
            assert client.submit(sum, [1, 2]).result(timeout=30) == 3
            ds = estimate_response(store, client=client, max_lag=40, max_order=40, progress=False)
            assert np.isfinite(ds["response"].values).all() and ds.attrs["n_samples"] == 20_000
        plain = address.replace("tls://", "tcp://")
        with pytest.raises((OSError, TimeoutError)):  # no TLS: the handshake fails, then a timeout
            Client(plain, timeout="3s", set_as_default=False)
    finally:
        for process in (worker, scheduler):
            if process is not None:
                os.killpg(process.pid, signal.SIGTERM)
                process.communicate(timeout=30)
