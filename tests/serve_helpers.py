"""Servers for the serve tests, on loopback only, each stopped by the test that started it.

- ``running(gen, overrides)``: ``rodeco task=serve``'s app over an in-memory generator, in a uvicorn thread on a free
  loopback port (fast; what most tests use).
- ``tiny_model_dir(tmp)``: the tiny random Llama saved as a model directory, so a subprocess
  (``rodeco task=serve generator=hf generator.model=DIR``) can load it.
- ``spawn(args)``: ``rodeco task=serve ...`` as a subprocess (its own process group), waited for on /health, killed by
  its process id at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BASE = ["reward=logprob", "sampling.max_new_tokens=16", "budget.kv_tokens=20000"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(gen: Any, overrides: list[str] = (), plugins: Any = None) -> Iterator[tuple[str, Any]]:
    """(base URL, the server's ``State``) of a server over ``gen``, stopped at the end."""
    import uvicorn

    from rodeco.compose import load_config
    from rodeco.serve import build_state
    from rodeco.serve.app import make_app

    cfg = load_config([*BASE, *overrides], plugins)
    state = build_state(cfg, plugins, generator=gen)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(state), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    end = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < end and th.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        th.join(10)
        state.scheduler.stop()


def client(url: str, key: str = "none", timeout: float = 60.0):
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=timeout)


def tiny_model_dir(tmp: Path, model: Any, tokenizer: Any) -> Path:
    d = tmp / "tiny-llama"
    if not (d / "config.json").exists():
        model.save_pretrained(d)
        tokenizer.save_pretrained(d)
    return d


@contextlib.contextmanager
def spawn(
    args: list[str], env: dict[str, str] | None = None, wait: bool = True, timeout: float = 120.0
) -> Iterator[tuple[subprocess.Popen, str]]:
    """``rodeco task=serve ARGS`` on a free loopback port (unless ARGS set serve.port), its log in a file."""
    port = free_port()
    argv = [str(Path(sys.executable).parent / "rodeco"), "task=serve", f"serve.port={port}", *args]
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"rodeco-serve-{port}.log", "w+")
    proc = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "HYDRA_FULL_ERROR": "1", **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if wait:
            wait_healthy(url, proc, log, timeout)
        yield proc, url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def wait_healthy(url: str, proc: subprocess.Popen, log: Any, timeout: float) -> None:
    import httpx2 as httpx

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            log.seek(0)
            raise AssertionError(f"the server exited ({proc.returncode}):\n{log.read()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    log.seek(0)
    raise AssertionError(f"the server did not answer /health in {timeout} s:\n{log.read()[-3000:]}")


def metric(text: str, name: str, labels: str = "") -> float:
    """A sample's value in /metrics' text (0 if absent)."""
    want = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


class SlowGen:
    """A generator whose sessions sleep ``delay`` seconds at each decode call (the loop calls it every
    ``serve.check_tokens`` tokens), so that a test can act while a request decodes. Everything else is ``gen``'s."""

    def __init__(self, gen: Any, delay: float) -> None:
        self.gen, self.delay = gen, delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self.gen, name)

    def open_session(self, spec: Any) -> Any:
        sess = self.gen.open_session(spec)
        decode = sess.decode

        def slow(until: int, pause: int | None = None) -> Any:
            time.sleep(self.delay)
            return decode(until, pause)

        sess.decode = slow
        return sess
