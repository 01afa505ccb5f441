"""Static checks of the images and the single-host compose file in docker/, without Docker.

compose.yml is interpolated as Docker Compose does it and validated against the Compose
Specification's JSON schema (vendored in docker/), then the deployment's invariants are checked
on the result. The Dockerfiles are read with dockerfile-parse. Nothing here needs a Docker
engine or the network.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import os
import re
import runpy
import shlex
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from app.cli import main as blockq_cli
from app.cli.stack import WORKER_OPTIONS, process_commands
from domain.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yml"
SCHEMA_FILE = DOCKER / "compose-spec.schema.json"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
CPU_DOCKERFILES = ["api.Dockerfile", "worker.Dockerfile", "engine-emulated.Dockerfile"]

#: Services of third-party images, which run no blockq code.
THIRD_PARTY_SERVICES = {"postgres", "redis"}
#: Secrets compose must refuse to start without.
SECRETS = {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "BLOCKQ_WEBHOOK_SECRET", "FLOWER_BASIC_AUTH"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|AUTH|CREDENTIAL|_KEY\b")
#: Environment variables of blockq containers that are no blockq settings.
IMAGE_VARIABLES = {"ENGINE_QUEUE", "FLOWER_BASIC_AUTH"}
#: Settings that compose.yml sets itself; docker/settings.env must not try to.
COMPOSE_OWNED = {
    "DATABASE_URL",
    "REDIS_URL",
    "BLOCKQ_DATA_DIR",
    "BLOCKQ_API_HOST",
    "BLOCKQ_API_PORT",
    "BLOCKQ_WEBHOOK_SECRET",
}
#: Where the images put the repository (their WORKDIR), and their health check script.
IMAGE_ROOT = PurePosixPath("/app")
HEALTHCHECK_SCRIPT = str(IMAGE_ROOT / "docker" / "healthcheck.py")
ENGINE_QUEUE = re.compile(r"gpu\.[A-Za-z0-9_-]+")


# --- compose: interpolation as Docker Compose does it ------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(LookupError):
    """A `${NAME:?message}` whose variable is unset or empty."""


def _substitute(match: re.Match[str], env: Mapping[str, str]) -> str:
    if match["escaped"]:
        return "$"
    name, op, arg = match["name"] or match["bare"], match["op"] or "", match["arg"] or ""
    value = env.get(name)
    present = value is not None and not (op.startswith(":") and value == "")
    if op.endswith("-"):
        return value if present else arg
    if op.endswith("?"):
        if not present:
            raise MissingVariable(f"{name}: {arg}")
        return value
    if op.endswith("+"):
        return arg if present else ""
    return value or ""


def interpolate(node: Any, env: Mapping[str, str]) -> Any:
    """`node` with every ${...} in its string values replaced, as `docker compose` does."""
    if isinstance(node, str):
        return _VARIABLE.sub(lambda match: _substitute(match, env), node)
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    return node


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


@cache
def raw_compose() -> dict[str, Any]:
    """compose.yml as YAML gives it: anchors and merge keys resolved, nothing interpolated."""
    return yaml.safe_load(COMPOSE_FILE.read_text())


@cache
def variable_uses() -> tuple[tuple[str, str, str], ...]:
    """(name, operator, argument) of every ${...} in compose.yml's values."""
    return tuple(
        (match["name"] or match["bare"], match["op"] or "", match["arg"] or "")
        for text in strings(raw_compose())
        for match in _VARIABLE.finditer(text)
        if not match["escaped"]
    )


def required_variables() -> set[str]:
    return {name for name, op, _ in variable_uses() if op.endswith("?")}


@cache
def compose() -> dict[str, Any]:
    """compose.yml interpolated with placeholders for its required variables, defaults else."""
    env = {name: f"placeholder-{name.lower()}" for name in required_variables()}
    return interpolate(raw_compose(), env)


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def blockq_services() -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in services().items() if name not in THIRD_PARTY_SERVICES}


def environment(service: Mapping[str, Any]) -> dict[str, Any]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return dict(env)


def dockerfile_of(service: Mapping[str, Any]) -> Path:
    build = service["build"]
    return (DOCKER / build["context"] / build["dockerfile"]).resolve()


def engine_services() -> dict[str, dict[str, Any]]:
    return {
        name: svc for name, svc in blockq_services().items() if "ENGINE_QUEUE" in environment(svc)
    }


# --- Dockerfiles -------------------------------------------------------------------------------


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for kind, value in self.instructions if kind == instruction]


@cache
def dockerfile(path: Path) -> DockerfileParser:
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes()))


def stages(path: Path) -> list[Stage]:
    """The build stages of a Dockerfile, base images with their ARG defaults substituted."""
    parser = dockerfile(path)
    result: list[Stage] = []
    bases = iter(parser.parent_images)
    for item in parser.structure:
        kind, value = item["instruction"], item["value"]
        if kind == "FROM":
            words = value.split()
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else str(len(result))
            result.append(Stage(name, next(bases)))
        elif kind != "COMMENT" and result:
            result[-1].instructions.append((kind, value))
    return result


def exec_form(value: str) -> list[str]:
    value = value.strip()
    return json.loads(value) if value.startswith("[") else shlex.split(value)


def healthcheck_command(value: str) -> list[str]:
    _, _, command = re.split(r"(?:^|\s)(CMD)\s", value, maxsplit=1)
    return exec_form(command)


def copies(stage: Stage) -> Iterator[tuple[list[str], str]]:
    """(sources in the build context, absolute destination) of each COPY from the context."""
    workdir = "/"
    for kind, value in stage.instructions:
        if kind == "WORKDIR":
            workdir = value if value.startswith("/") else f"{workdir}/{value}"
        if kind != "COPY":
            continue
        words = exec_form(value)
        if any(word.startswith("--from") for word in words):
            continue
        *sources, dest = [word for word in words if not word.startswith("--")]
        yield sources, dest if dest.startswith("/") else f"{workdir}/{dest}"


def copied_paths(stage: Stage) -> dict[PurePosixPath, Path]:
    """Image path -> repository path of everything the stage copies from the build context."""
    result: dict[PurePosixPath, Path] = {}
    for sources, dest in copies(stage):
        into_folder = dest.endswith("/") or len(sources) > 1
        for source in sources:
            target = f"{dest}/{PurePosixPath(source).name}" if into_folder else dest
            result[PurePosixPath(os.path.normpath(target))] = ROOT / source
    return result


def repository_file(stage: Stage, image_path: str) -> Path:
    """The repository file the final image holds at `image_path`; fails if it holds none."""
    wanted = PurePosixPath(image_path)
    for in_image, in_repo in copied_paths(stage).items():
        if wanted == in_image or in_image in wanted.parents:
            path = in_repo / wanted.relative_to(in_image)
            assert path.exists(), f"{path.relative_to(ROOT)} does not exist"
            return path
    raise AssertionError(f"{image_path} is not copied into the image")


def shell_exec_line(script: Path) -> list[str]:
    """The words of the script's `exec ...` line (continuation lines joined)."""
    text = script.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("exec ")]
    assert len(lines) == 1, f"{script.name} should end in exactly one exec line"
    return shlex.split(lines[0])[1:]


def assert_in_image(module: str, stage: Stage) -> None:
    """The module exists in the repository and the stage copies it to where the image runs it."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, f"no module {module}"
    repository_file(stage, str(IMAGE_ROOT / Path(spec.origin).relative_to(ROOT)))


def assert_runs_blockq(command: list[str], stage: Stage) -> None:
    """The command starts a process of this project in the image the stage builds: the API, a
    Celery role, or the blockq CLI, directly or through a script of docker/."""
    program, args = command[0], command[1:]
    if program == "gunicorn":
        module, _, call = args[-1].partition(":")
        assert_in_image(module, stage)
        factory = getattr(importlib.import_module(module), call.removesuffix("()"), None)
        assert callable(factory), f"gunicorn target {args[-1]} does not exist"
        if "--config" in args:
            repository_file(stage, args[args.index("--config") + 1])
    elif program == "celery":
        assert args[:2] == ["-A", "workers"], f"celery should run the app `workers`: {command}"
        assert_in_image("workers.celery", stage)
        assert args[2] in {"worker", "beat", "flower"}, f"unknown celery command in {command}"
    elif program == "blockq":
        assert_in_image("app.cli", stage)
        assert args[0] in blockq_cli.commands, f"`blockq {args[0]}` is no blockq command"
        if args[0] == "migrate":
            repository_file(stage, str(IMAGE_ROOT / "alembic.ini"))
            repository_file(stage, str(IMAGE_ROOT / "migrations" / "env.py"))
    elif program == "sh":
        script = repository_file(stage, args[0])
        assert_runs_blockq(shell_exec_line(script), stage)
    else:
        raise AssertionError(f"{command} runs nothing of blockq")


def option(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


@cache
def healthcheck_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docker_healthcheck", DOCKER / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_known_healthcheck(command: list[str]) -> None:
    if HEALTHCHECK_SCRIPT in command:
        check = command[command.index(HEALTHCHECK_SCRIPT) + 1]
        assert check in healthcheck_module().CHECKS, f"healthcheck.py has no check {check!r}"


# --- .dockerignore -----------------------------------------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        elif pattern[i] in "*?":
            parts.append("[^/]*" if pattern[i] == "*" else "[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            parts.append(pattern[i : end + 1])
            i = end + 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts) + r"\Z")


@cache
def dockerignore_rules() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            rules.append((negated, _glob_regex(line.removeprefix("!").strip().strip("/"))))
    return tuple(rules)


def dockerignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its folders decides."""
    parts = PurePosixPath(path).parts
    candidates = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    ignored = False
    for negated, regex in dockerignore_rules():
        if any(regex.match(candidate) for candidate in candidates):
            ignored = not negated
    return ignored


def example_entries(path: Path, *, commented: bool) -> dict[str, str]:
    """NAME -> value of the NAME=value lines of an env file (also `# NAME=value` if commented)."""
    prefix = r"(?:#\s*)?" if commented else ""
    entry = re.compile(rf"^{prefix}([A-Z][A-Z0-9_]*)=(.*)$")
    matches = (entry.match(line.strip()) for line in path.read_text().splitlines())
    return {m[1]: m[2].split("#")[0].strip() for m in matches if m}


def settings_names() -> set[str]:
    return {Settings.env_name(name) for name in Settings.model_fields}


# === tests: compose file against the schema ====================================================


def test_vendored_schema_is_a_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


def schema_errors(document: Any) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    errors = sorted(validator.iter_errors(document), key=lambda error: list(error.path))
    return [f"{'.'.join(map(str, error.path))}: {error.message}" for error in errors]


def test_compose_file_matches_the_compose_spec() -> None:
    assert schema_errors(compose()) == []


def test_schema_rejects_what_compose_rejects() -> None:
    broken = json.loads(json.dumps(compose()))
    broken["services"]["api"]["healthcheck"] = {"interval": 5}
    broken["services"]["route"]["restart_policy"] = "always"
    errors = schema_errors(broken)
    assert any(error.startswith("services.api.healthcheck.interval") for error in errors)
    assert any(error.startswith("services.route") and "restart_policy" in error for error in errors)


def test_compose_refuses_to_start_without_the_secrets() -> None:
    assert SECRETS <= required_variables()
    with pytest.raises(MissingVariable):
        interpolate(raw_compose(), {})


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    cases = {
        "${SET:-d}": "x",
        "${EMPTY:-d}": "d",
        "${EMPTY-d}": "",
        "${UNSET-d}": "d",
        "$$SET": "$SET",
        "${SET:+alt}": "alt",
        "${EMPTY:+alt}": "",
        "a$SET": "ax",
    }
    assert {text: interpolate(text, env) for text in cases} == cases
    with pytest.raises(MissingVariable):
        interpolate("${EMPTY:?needed}", env)


# === tests: what the deployment relies on ======================================================


def test_blockq_services_run_images_built_from_our_dockerfiles() -> None:
    images: dict[Path, set[str]] = {}
    for name, service in blockq_services().items():
        assert "build" in service, f"{name} runs blockq code, so it builds one of our images"
        path = dockerfile_of(service)
        assert path in DOCKERFILES, f"{name} builds {path}, not a Dockerfile in docker/"
        assert (DOCKER / service["build"]["context"]).resolve() == ROOT, f"{name}: context"
        images.setdefault(path, set()).add(service["image"])
    assert all(len(names) == 1 for names in images.values()), f"one image per file: {images}"


def test_third_party_images_are_pinned() -> None:
    for name in THIRD_PARTY_SERVICES:
        image = services()[name]["image"]
        assert "build" not in services()[name]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), image


def test_ports_are_published_on_loopback_only() -> None:
    for name, service in services().items():
        assert service.get("network_mode") != "host", f"{name} would bypass port bindings"
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond 127.0.0.1"


def test_secrets_are_never_literal() -> None:
    required = re.compile(r"\$\{[A-Z][A-Z0-9_]*:?\?[^}]*\}")
    for name, service in raw_compose()["services"].items():
        for key, value in environment(service).items():
            if SECRET_NAME.search(key):
                assert value is None or required.fullmatch(str(value)), f"{name}: {key}"
    for text in strings(raw_compose()):
        for password in re.findall(r"://[^/\s:@]*:([^@\s]+)@", text):
            assert required.fullmatch(password), f"literal credentials in {text}"
        assert "whsec_" not in text, f"literal webhook secret in {text}"
    for variable, op, _ in variable_uses():
        if SECRET_NAME.search(variable):
            assert op.endswith("?"), f"${{{variable}}} must be required, with no default"


def test_env_example_names_every_required_variable_and_no_value() -> None:
    entries = example_entries(DOCKER / "env.example", commented=False)
    assert required_variables() <= entries.keys()
    assert all(entries[name] == "" for name in entries if SECRET_NAME.search(name))


def test_settings_example_names_only_settings_compose_leaves_open() -> None:
    names = example_entries(DOCKER / "settings.env.example", commented=True).keys()
    assert names and names <= settings_names() - COMPOSE_OWNED


def test_containers_get_settings_by_their_names() -> None:
    for name, service in blockq_services().items():
        env = environment(service)
        unknown = env.keys() - settings_names() - IMAGE_VARIABLES
        assert not unknown, f"{name}: {sorted(unknown)} are neither blockq settings nor known"
        if "DATABASE_URL" in env:
            files = [entry.get("path") for entry in service.get("env_file", [{}])]
            assert "settings.env" in files, f"{name} should read docker/settings.env"


def test_engine_workers_have_unique_queues_and_their_own_gpu() -> None:
    engines = engine_services()
    queues = [environment(svc)["ENGINE_QUEUE"] for svc in engines.values()]
    assert all(ENGINE_QUEUE.fullmatch(queue) for queue in queues), queues
    assert len(set(queues)) == len(queues), f"queues gpu.<k> must be unique: {queues}"
    gpu = {name: svc for name, svc in engines.items() if "gpu" in svc.get("profiles", [])}
    assert {"gpu0", "gpu1"} <= gpu.keys()
    device_ids = [device_ids_of(name, svc) for name, svc in gpu.items()]
    assert len(set(device_ids)) == len(device_ids), f"one GPU per engine: {device_ids}"
    for name, service in engines.items():
        kind, image = ("vllm", "engine-gpu") if name in gpu else ("emulated", "engine-emulated")
        assert environment(service)["BLOCKQ_ENGINE_KIND"] == kind, name
        assert dockerfile_of(service).name == f"{image}.Dockerfile", name


def device_ids_of(name: str, service: Mapping[str, Any]) -> str:
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1, f"{name} reserves one device"
    device = devices[0]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], name
    assert len(device["device_ids"]) == 1, f"{name} reserves exactly one GPU"
    return device["device_ids"][0]


def test_only_engines_are_behind_profiles() -> None:
    engines = engine_services()
    for name, service in services().items():
        profiles = set(service.get("profiles", []))
        if name in engines:
            assert len(profiles) == 1 and profiles <= {"gpu", "emulated"}, name
        else:
            assert not profiles, f"{name} should start in every profile"


def has_healthcheck(service: Mapping[str, Any]) -> bool:
    check = service.get("healthcheck")
    if check is not None:
        return not check.get("disable", False)
    path = dockerfile_of(service) if "build" in service else None
    return path is not None and bool(stages(path)[-1].values("HEALTHCHECK"))


def is_one_shot(service: Mapping[str, Any]) -> bool:
    return service.get("restart") == "no"


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in services().items():
        assert has_healthcheck(service) != is_one_shot(service), f"{name}: healthcheck"
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test[0] == "CMD":
            assert_known_healthcheck(test[1:])


def test_services_wait_for_what_they_use() -> None:
    for name, service in blockq_services().items():
        depends_on = service.get("depends_on", {})
        env = environment(service)
        expected = {"redis": "service_healthy"} if "REDIS_URL" in env else {}
        if "DATABASE_URL" in env:
            expected["postgres"] = "service_healthy"
            if not is_one_shot(service):
                expected["migrate"] = "service_completed_successfully"
        conditions = {dep: spec["condition"] for dep, spec in depends_on.items()}
        assert expected.items() <= conditions.items(), f"{name} waits for {conditions}"


def test_dependency_conditions_can_be_met() -> None:
    for name, service in services().items():
        for dependency, spec in service.get("depends_on", {}).items():
            target = services()[dependency]
            if spec["condition"] == "service_healthy":
                assert has_healthcheck(target), f"{name} waits for {dependency}'s health"
            else:
                assert spec["condition"] == "service_completed_successfully", name
                assert is_one_shot(target), f"{name} waits for {dependency} to finish"


def test_compose_commands_run_blockq() -> None:
    for service in blockq_services().values():
        if "command" in service:
            assert_runs_blockq(service["command"], stages(dockerfile_of(service))[-1])


def test_flower_is_installed_where_it_runs() -> None:
    for name, service in blockq_services().items():
        if "flower" in service.get("command", []):
            assert '"flower==' in dockerfile_of(service).read_text(), name


def test_worker_queues_and_names_match_the_local_stack() -> None:
    settings = Settings()
    stack = process_commands(settings)
    for name in ("predict", "route", "health", "batches", "webhooks"):
        # The local command may start with `nice -n 10`: compare from `celery` on.
        local = stack[name]
        ours, theirs = services()[name]["command"], local[next(
            i for i, word in enumerate(local) if word.endswith("celery")) + 1:]
        for flag in ("-Q", "-n", "--pool"):
            assert option(ours, flag) == option(theirs, flag), f"{name} {flag}"
    instance = settings.instance_ids[0]
    engine = [word.replace("$ENGINE_QUEUE", instance) for word in engine_script_command()]
    for flag in ("-Q", "-n", "--pool"):
        assert option(engine, flag) == option(stack[instance][1:], flag), f"engine {flag}"
    concurrency = Settings.model_fields["engine_concurrency"].default
    assert option(engine, "--concurrency") == f"${{BLOCKQ_ENGINE_CONCURRENCY:-{concurrency}}}"


def test_every_worker_runs_without_gossip_and_mingle_as_the_local_stack_does() -> None:
    """Gossip costs every idle worker a read of every other worker's heartbeat."""
    settings = Settings()
    stack = process_commands(settings)
    commands = {name: services()[name]["command"]
                for name in ("predict", "predict_bulk", "route", "health", "batches", "webhooks")}
    commands["engine"] = engine_script_command()
    commands["image default"] = json.loads(DockerfileParser(str(DOCKER / "worker.Dockerfile")).cmd)
    for name, command in {**commands, **{f"local {n}": c for n, c in stack.items()
                                         if "worker" in c}}.items():
        for flag in WORKER_OPTIONS:
            assert flag in str(command), f"{name} lacks {flag}"


def engine_script_command() -> list[str]:
    return shell_exec_line(DOCKER / "engine-worker.sh")


def test_beat_keeps_its_schedule_where_its_healthcheck_looks() -> None:
    beat = services()["beat"]
    schedule = PurePosixPath(option(beat["command"], "-s") or "")
    data_dir = PurePosixPath(environment(beat)["BLOCKQ_DATA_DIR"])
    assert schedule == data_dir / healthcheck_module().BEAT_SCHEDULE_NAME
    assert any(volume.endswith(f":{data_dir}") for volume in beat["volumes"])


def test_gunicorn_config_follows_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOCKQ_API_HOST", "0.0.0.0")
    monkeypatch.setenv("BLOCKQ_API_PORT", "8123")
    monkeypatch.setenv("BLOCKQ_API_WORKERS", "3")
    monkeypatch.setenv("BLOCKQ_API_CONNECTIONS", "4800")
    config = runpy.run_path(str(DOCKER / "gunicorn.conf.py"))
    assert (config["bind"], config["workers"], config["worker_connections"]) == (
        "0.0.0.0:8123", 3, 4800)


def test_gunicorn_config_matches_the_local_stack() -> None:
    """The image's API runs as `blockq serve` runs it: same workers, worker class, connections
    and grace."""
    config = runpy.run_path(str(DOCKER / "gunicorn.conf.py"))
    settings = Settings.load()
    api = process_commands(settings)["api"]
    for flag, key in (("--workers", "workers"), ("--worker-class", "worker_class"),
                      ("--worker-connections", "worker_connections"),
                      ("--graceful-timeout", "graceful_timeout"), ("--keep-alive", "keepalive")):
        assert api[api.index(flag) + 1] == str(config[key]), flag
    assert "--no-control-socket" in api and config["control_socket_disable"] is True


# === tests: Dockerfiles ========================================================================


@pytest.fixture(params=DOCKERFILES, ids=[path.name for path in DOCKERFILES])
def dockerfile_path(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_there_is_a_dockerfile_per_role() -> None:
    names = {path.name for path in DOCKERFILES}
    assert names == {
        "api.Dockerfile",
        "worker.Dockerfile",
        "engine-gpu.Dockerfile",
        "engine-emulated.Dockerfile",
    }


def test_base_images_are_pinned(dockerfile_path: Path) -> None:
    stage_names = set()
    for stage in stages(dockerfile_path):
        if stage.base not in stage_names:
            assert re.fullmatch(r"[\w./-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", stage.base)
            assert not stage.base.endswith(":latest"), stage.base
        stage_names.add(stage.name)


def test_runs_as_an_unprivileged_user(dockerfile_path: Path) -> None:
    users = stages(dockerfile_path)[-1].values("USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}


def test_has_a_healthcheck_of_ours(dockerfile_path: Path) -> None:
    final = stages(dockerfile_path)[-1]
    (check,) = final.values("HEALTHCHECK")
    command = healthcheck_command(check)
    assert command[:2] == ["python", HEALTHCHECK_SCRIPT]
    repository_file(final, command[1])
    assert_known_healthcheck(command)


def test_starts_a_process_of_blockq(dockerfile_path: Path) -> None:
    final = stages(dockerfile_path)[-1]
    entrypoint, cmd = final.values("ENTRYPOINT"), final.values("CMD")
    command = exec_form(entrypoint[-1]) if entrypoint else []
    command += exec_form(cmd[-1]) if cmd else []
    assert command, "the image needs a CMD or an ENTRYPOINT"
    assert_runs_blockq(command, final)


def test_copies_only_what_dockerignore_lets_in(dockerfile_path: Path) -> None:
    for stage in stages(dockerfile_path):
        for sources, _ in copies(stage):
            for source in sources:
                path = ROOT / source
                assert path.exists(), f"COPY {source}: no such file"
                files = [path] if path.is_file() else sorted(path.rglob("*.py"))
                for file in files:
                    relative = file.relative_to(ROOT).as_posix()
                    cached = "__pycache__" in file.parts
                    assert cached or not dockerignored(relative), f"{relative} is dockerignored"


def test_bakes_in_no_secret(dockerfile_path: Path) -> None:
    for stage in stages(dockerfile_path):
        for kind, value in stage.instructions:
            if kind in {"ENV", "ARG", "LABEL"}:
                names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", value)
                assert not [name for name in names if SECRET_NAME.search(name.upper())], value
                assert not {"DATABASE_URL", "REDIS_URL"} & set(names), value
    assert "whsec_" not in dockerfile_path.read_text()


def test_cpu_images_share_their_build_stages() -> None:
    """Identical deps and model stages: one build fills the layer cache of all three."""
    shared = [
        [stage for stage in stages(DOCKER / name) if stage.name in {"deps", "model"}]
        for name in CPU_DOCKERFILES
    ]
    assert all(len(stage_list) == 2 for stage_list in shared)
    assert all(stage_list == shared[0] for stage_list in shared[1:])


def test_dockerignore_keeps_local_state_and_secrets_out() -> None:
    for path in (
        ".venv/bin/python",
        ".blockq/models/x",
        ".git/HEAD",
        "docker/.env",
        "docker/settings.env",
        "app/__pycache__/x.pyc",
        ".pytest_cache/x",
        "tests/x.py",
    ):
        assert dockerignored(path), path
    for path in ("app/__init__.py", "workers/celery.py", "docker/healthcheck.py", "README.md"):
        assert not dockerignored(path), path


# === tests: the health check script ============================================================


def test_beat_check_wants_a_recently_written_schedule(tmp_path: Path) -> None:
    fresh = healthcheck_module().beat_schedule_fresh
    schedule = tmp_path / "celerybeat-schedule"
    assert not fresh(schedule)
    written = tmp_path / "celerybeat-schedule.db"
    written.write_bytes(b"")
    assert fresh(schedule)
    long_ago = time.time() - 3600
    os.utime(written, (long_ago, long_ago))
    assert not fresh(schedule, max_age_s=600)


def test_healthcheck_rejects_unknown_checks() -> None:
    assert healthcheck_module().main(["nonsense"]) == 2
