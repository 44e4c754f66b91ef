"""Locates the tritonserver that the `nvidia-pytriton` wheel ships and runs it on a model repository.

The wheel carries tritonserver 2.51, the Python backend and one backend stub per Python version. The stub for
the running interpreter is copied next to `libtriton_python.so` in place, where the binaries' built-in library
paths resolve. The stub runs models in the interpreter found first on PATH, so this venv's `bin/` goes first.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tritonllm.common.tracing import OTLP_TRACES_ENDPOINT_ENV
from tritonllm.launcher import decoupled_mode
from tritonllm.launcher.allocator import with_allocator
from tritonllm.launcher.model_set import renamed_config
from tritonllm.wire.api_key import API_KEY_HEADER
from tritonllm.wire.triton_names import TritonNames


class ServerError(RuntimeError):
    pass


# tritonserver's log lines about each model's load (model_lifecycle.cc)
_LOADING = re.compile(r"loading: ([\w.-]+):\d+")
_LOADED = re.compile(r"successfully loaded '([\w.-]+)'")
_FAILED = re.compile(r"failed to load '([\w.-]+)' version \d+: (.*)")


class ModelLoads:
    """Which models tritonserver is loading, has loaded, or failed to load (with its error), from its log."""

    def __init__(self) -> None:
        self.loading: list[str] = []
        self.failed: dict[str, str] = {}

    def note(self, line: str) -> None:
        if match := _LOADING.search(line):
            self.loading.append(match.group(1))
        elif match := _LOADED.search(line):
            self._done(match.group(1))
        elif match := _FAILED.search(line):
            self._done(match.group(1))
            self.failed[match.group(1)] = match.group(2).strip()

    def _done(self, name: str) -> None:
        if name in self.loading:
            self.loading.remove(name)

    def failures(self) -> str:
        return "".join(f"\n  {name}: {error}" for name, error in self.failed.items())


def pytriton_root() -> Path:
    try:
        import pytriton
    except ImportError as e:
        raise ServerError("nvidia-pytriton is not installed: run `make install`") from e
    return Path(pytriton.__file__).parent / "tritonserver"


def prepare_backends() -> Path:
    """Puts the Python backend stub for this interpreter in place; returns the backend directory."""
    root = pytriton_root()
    python_backend = root / "backends" / "python"
    stub = python_backend / "triton_python_backend_stub"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    source = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not source.exists():
        raise ServerError(f"nvidia-pytriton ships no Python backend stub for Python {version}")
    if not stub.exists() or stub.stat().st_size != source.stat().st_size:
        shutil.copy2(source, stub)
    return root / "backends"


def server_binary() -> Path:
    return pytriton_root() / "bin" / "tritonserver"


def library_dirs() -> list[str]:
    """Libraries the binaries may need beyond their own rpath: the wheel's bundle and this libpython."""
    import pytriton

    bundled = Path(pytriton.__file__).parent.parent / "nvidia_pytriton.libs"
    return [str(bundled), sysconfig.get_config_var("LIBDIR") or ""]


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*library_dirs(), env.get("LD_LIBRARY_PATH", "")])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra or {})
    return with_allocator(env)


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# What a poll of a port gets from a server that is not (yet) there: a refused or reset connection, or, when the
# port lies in the ephemeral range and nothing listens, a TCP self-connect (the kernel hands the client that very
# port as its source) that reads back its own request as a malformed status line.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)
# The ports tests and `serve` may pick: below Linux's ephemeral range (32768-60999 by default), so no client
# socket is ever given one as its source, and above the well-known and registered ones most services use.
PICKED_PORTS = range(20000, 32768)


def ephemeral_ports() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(low, high + 1)


def free_port(host: str = "127.0.0.1") -> int:
    """A free port outside the ephemeral range (see PICKED_PORTS), so that polling it can never self-connect."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` different free ports (as free_port picks them), for one server's several listeners: picked by
    separate free_port calls, two could be the same port, and the second listener would then fail to bind."""
    ephemeral = ephemeral_ports()
    candidates = [p for p in PICKED_PORTS if p not in ephemeral]
    ports = []
    for port in random.sample(candidates, min(200 + count, len(candidates))):
        if port_is_free(host, port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise OSError(f"no {count} free ports in {PICKED_PORTS} on {host}")


# Every API Triton can restrict but health, which probes need (Kubernetes' and `serve`'s own readiness poll).
RESTRICTED_APIS = (
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)


@dataclass
class TritonServer:
    model_repository: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)
    log_file: Path | None = None
    llm_instances: int = 1  # engines in the llm model (instance_group count), each with its own KV pool
    without_models: tuple[str, ...] = ()  # models of the repository this server does not load
    extra_models: tuple[Path, ...] = ()  # model folders from outside the repository it loads too
    # several LLMs (model_set.py): each one's Triton names and model folder; empty: the repository's one LLM
    llms: list[tuple[TritonNames, Path]] = field(default_factory=list)
    # TensorRT-LLM's decoupled_mode for tensorrt_llm and the ensemble: false answers unary infer, refuses
    # streaming (launcher/decoupled_mode.py); llm stays decoupled either way
    decoupled: bool = True
    # Triton's explicit model control: only these models load at start, the others when a client asks
    # (the repository API); None: every model loads at start and the repository cannot be changed
    load_at_start: tuple[str, ...] | None = None
    # When set, every HTTP and gRPC API but health needs the header `triton-api-key: <api_key>` (Triton's
    # restricted APIs), so that nobody reaches inference or the model repository past the shim's key.
    api_key: str | None = None
    # On stop, how long running requests may take to finish. In-flight ensemble requests cannot finish once
    # shutdown refuses their next step, so the default does not wait long.
    exit_timeout_s: int = 10
    # OTLP/HTTP endpoint of Triton's own OpenTelemetry traces (every request, the client's traceparent continued),
    # and of the models' spans ($TRITONLLM_OTLP_TRACES_ENDPOINT); None: nothing traced
    traces_endpoint: str | None = None
    process: subprocess.Popen | None = None
    # The stubs seen once the server was ready (pid -> shared-memory region): a crashed server's stubs are no
    # longer its children, and live on.
    _stubs: dict[int, str | None] = field(default_factory=dict, init=False, repr=False)
    _stub_models: dict[int, str] = field(default_factory=dict, init=False, repr=False)
    _loads: ModelLoads = field(default_factory=ModelLoads, init=False, repr=False)
    _staged: Path | None = field(default=None, init=False, repr=False)

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        return [
            str(server_binary()),
            f"--model-repository={(self._staged or self.model_repository).resolve()}",
            f"--backend-directory={prepare_backends()}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            "--allow-gpu-metrics=false",
            "--log-verbose=0",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            # The configs are complete. Auto-completion would start a Python stub per model only to import its
            # model.py (torch, transformers) and ask it for a config, before the stub that serves imports it again.
            "--disable-auto-complete-config",
            *self.restriction(),
            *self.model_control(),
            *self.tracing(),
        ]

    def traced_env(self) -> dict[str, str]:
        return {OTLP_TRACES_ENDPOINT_ENV: self.traces_endpoint} if self.traces_endpoint else {}

    def tracing(self) -> list[str]:
        if self.traces_endpoint is None:
            return []
        return [
            "--trace-config=mode=opentelemetry",
            "--trace-config=rate=1",
            "--trace-config=level=TIMESTAMPS",
            f"--trace-config=opentelemetry,url={self.traces_endpoint}",
            "--trace-config=opentelemetry,resource=service.name=tritonserver",
        ]

    def model_control(self) -> list[str]:
        if self.load_at_start is None:
            return []
        return ["--model-control-mode=explicit", *(f"--load-model={name}" for name in self.load_at_start)]

    def restriction(self) -> list[str]:
        if not self.api_key:
            return []
        if not re.fullmatch(r"[\x21-\x7e]+", self.api_key) or "," in self.api_key:
            raise ServerError("the API key must be printable ASCII without spaces or commas to guard Triton's ports")
        guarded = f"{','.join(RESTRICTED_APIS)}:{API_KEY_HEADER}={self.api_key}"
        return [f"--http-restricted-api={guarded}", f"--grpc-restricted-protocol={guarded}"]

    def start(self, timeout: float | None = None, progress: Callable[[str], None] | None = None) -> None:
        """Starts the server and waits while its models load, however long that takes (`timeout`: at most so
        many seconds); `progress` hears every half minute which models are still loading. A model that fails
        raises ServerError with the model's own error."""
        busy = [p for p in (self.http_port, self.grpc_port, self.metrics_port) if not port_is_free(self.host, p)]
        if busy:
            raise ServerError(f"port(s) {busy} on {self.host} are in use; pick others (--http-port ...)")
        if self.llm_instances != 1 or self.without_models or self.llms or self.extra_models or not self.decoupled:
            self._staged = stage_repository(
                self.model_repository,
                self.llm_instances,
                self.without_models,
                self.llms,
                self.extra_models,
                self.decoupled,
            )
        self.process = subprocess.Popen(
            self.command(),
            env=server_env({**self.env, **self.traced_env()}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._loads = ModelLoads()
        threading.Thread(target=self._follow_log, args=(self.process.stdout,), daemon=True).start()
        self.wait_ready(timeout, progress)
        self._stubs = {pid: _stub_shm_region(pid) for pid in _children(self.process.pid)}
        self._stub_models = {pid: _stub_model(pid) for pid in self._stubs}

    def _follow_log(self, stream) -> None:
        """Copies the server's output to the log file (or this process's stdout) and notes the models' loads."""
        sink = open(self.log_file, "ab") if self.log_file else sys.stdout.buffer  # noqa: SIM115 - lives as long
        for line in stream:
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):  # the console went away: keep draining, or the server blocks on its pipe
                pass
            self._loads.note(line.decode(errors="replace"))
        if self.log_file:
            sink.close()

    def wait_ready(self, timeout: float | None = None, progress: Callable[[str], None] | None = None) -> None:
        started = time.monotonic()
        told = started
        while timeout is None or time.monotonic() - started < timeout:
            if self.process is not None and self.process.poll() is not None:
                failures, code = self._loads.failures(), self.process.returncode
                self.stop()  # the stubs it started, and their shared memory
                raise ServerError(f"tritonserver exited with code {code}{failures or self._log_hint()}")
            try:
                with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except TRANSPORT_ERRORS:  # not ready yet; only the process exiting or the timeout ends the wait
                pass
            if progress is not None and time.monotonic() - told >= 30:
                told = time.monotonic()
                waiting = ", ".join(self._loads.loading) or "the server"
                progress(f"still loading after {told - started:.0f}s: {waiting}")
            time.sleep(0.05)
        self.stop()
        raise ServerError(f"tritonserver not ready after {timeout:.0f}s{self._loads.failures() or self._log_hint()}")

    def exit_report(self, lines: int = 60) -> str | None:
        """If the server has exited, its exit code (negative: the signal) and the end of its log; else None."""
        if self.process is None or self.process.poll() is None:
            return None
        shm = shutil.disk_usage("/dev/shm")
        report = (
            f"tritonserver exited with code {self.process.returncode}"
            f" (/dev/shm: {shm.used >> 20} MiB used of {shm.total >> 20} MiB)"
        )
        if self.log_file and self.log_file.exists():
            tail = self.log_file.read_text(errors="replace").splitlines()[-lines:] if lines > 0 else []
            report += f"; the last {len(tail)} lines of {self.log_file}:\n" + "\n".join(tail)
        return report

    def _log_hint(self) -> str:
        return f"; see {self.log_file}" if self.log_file else ""

    def stubs_of(self, model: str) -> list[int]:
        """The process ids of the Python stubs that serve `model` now."""
        if self.process is None or self.process.poll() is not None:
            return []
        return [pid for pid in _children(self.process.pid) if _stub_model(pid) == model]

    def dead_parts(self) -> list[str]:
        """What of the running server has died: the server itself, or the Python stubs (by model) of the models
        it serves, those loaded at start and later ones; empty while everything lives (or nothing was started).
        A model's stubs that end because it was unloaded are not missed."""
        if self.process is None:
            return []
        if self.process.poll() is not None:
            return [f"tritonserver (exit code {self.process.returncode})"]
        if self.load_at_start is not None:  # models come and go (explicit model control): watch the new stubs too
            for pid in _children(self.process.pid):
                if pid not in self._stubs:
                    self._stubs[pid], self._stub_models[pid] = _stub_shm_region(pid), _stub_model(pid)
        # a dead stub is gone, or a zombie with no command line, or its pid now someone else's
        gone = [pid for pid, region in self._stubs.items() if region and _stub_shm_region(pid) != region]
        if not gone:
            return []
        # tritonserver 2.51 keeps a model whose stub died READY; one being unloaded is not
        try:
            serving = self.ready_models()
        except TRANSPORT_ERRORS:  # asked again at the next look
            return []
        for pid in gone:
            if self._stub_models[pid] not in serving:
                del self._stubs[pid]
        return [f"the {self._stub_models[pid]} model's process" for pid in gone if pid in self._stubs]

    def ready_models(self) -> set[str]:
        """The models the server has READY (its repository index)."""
        headers = {API_KEY_HEADER: self.api_key} if self.api_key else {}
        request = urllib.request.Request(f"{self.http_url}/v2/repository/index", b"{}", headers, method="POST")
        with urllib.request.urlopen(request, timeout=5) as answer:
            return {m["name"] for m in json.load(answer) if m.get("state") == "READY"}

    def stop(self, timeout: float | None = None) -> None:
        """Stops the server and every stub it started, then removes the shared memory they leave."""
        proc, self.process = self.process, None
        if self._staged is not None:
            shutil.rmtree(self._staged, ignore_errors=True)
            self._staged = None
        if proc is None:
            return
        stubs = {**self._stubs, **{pid: _stub_shm_region(pid) for pid in _children(proc.pid)}}
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(self.exit_timeout_s + 20 if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid, region in stubs.items():
            # Stubs with live threads can outlive a crashed server and ignore SIGTERM. The region in its command
            # line tells that the pid is still the same stub.
            if region and _stub_shm_region(pid) == region:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if region:
                Path("/dev/shm", region).unlink(missing_ok=True)

    def __enter__(self) -> TritonServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def stage_repository(
    repository: Path,
    count: int,
    without: tuple[str, ...] = (),
    llms: list[tuple[TritonNames, Path]] = (),
    extra: tuple[Path, ...] = (),
    decoupled: bool = True,
) -> Path:
    """A copy of the model repository, made of links, without the models named in `without` and whose llm runs
    `count` instances: Triton reads instance counts only from config.pbtxt. With `llms` (names, model folder),
    the repository's LLM models once per LLM under its names, each config with its folder written in
    (model_set.py). `extra`: model folders from elsewhere (optional_models/) linked in. `decoupled` false:
    tensorrt_llm and the ensemble answer unary requests (decoupled_mode.py). (The models find the real
    repository through their version folders' links, model_config.ModelParameters.)"""
    if count < 1:
        raise ServerError(f"llm_instances must be >= 1, got {count}")
    repository = repository.resolve()
    staged = Path(tempfile.mkdtemp(prefix="tritonllm-repository-"))
    own = TritonNames().by_folder()
    written = llms or ([(TritonNames(), None)] if count > 1 or not decoupled else [])
    for model in repository.iterdir():
        if model.name not in without and not (written and model.name in own):
            (staged / model.name).symlink_to(model)
    for model in extra:
        (staged / model.name).symlink_to(model.resolve())
    for names, model_dir in written:
        for folder, name in names.by_folder().items():
            config = original = (repository / folder / "config.pbtxt").read_text()
            if model_dir is not None:
                config = renamed_config(config, names, model_dir)
            if folder == "llm":
                config = _with_instances(config, count)
            elif folder == "tensorrt_llm" and not decoupled:
                config = decoupled_mode.unary_face(config)
            elif folder == "ensemble" and not decoupled:
                config = decoupled_mode.unary_ensemble(config, names)
            if config == original:
                (staged / name).symlink_to(repository / folder)
            else:
                _staged_model(staged / name, repository / folder, config)
    return staged


def _staged_model(staged: Path, model: Path, config: str) -> None:
    """`model`'s folder as links, but for its config."""
    if staged.is_symlink():
        staged.unlink()
    staged.mkdir()
    for entry in model.iterdir():
        if entry.name != "config.pbtxt":
            (staged / entry.name).symlink_to(entry)
    (staged / "config.pbtxt").write_text(config)


def _with_instances(config: str, count: int) -> str:
    if count == 1:
        return config
    group = f"instance_group [ {{ count: {count}, kind: KIND_AUTO }} ]"
    config, found = re.subn(r"instance_group \[.*?\]", group, config)
    if not found:
        raise ServerError("llm/config.pbtxt has no instance_group to set")
    return config


def _children(pid: int) -> list[int]:
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return []
    return [int(p) for p in out.split()]


def _stub_model(pid: int) -> str:
    """The model a stub serves: its first argument is the model's `<model>/<version>/model.py`."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    return Path(args[1].decode()).parent.parent.name if len(args) > 1 else f"pid {pid}"


def _stub_shm_region(pid: int) -> str | None:
    """A Python backend stub's second argument names its shared-memory region in /dev/shm."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if len(args) > 2 and args[2].startswith(b"triton_python_backend_shm_region_"):
        return args[2].decode()
    return None
