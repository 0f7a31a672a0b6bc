"""The server launchers every benchmark uses: rodeco's and vLLM's servers started in their own process group,
waited for, stopped, and their argv; where a path is recorded, ``shown`` gives it relative to the repository, the
output or rodeco's cache (never this machine's absolute path). What asks them is ``serve_clients``."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rodeco.experiments.bench import REPO

log = logging.getLogger("serve_bench")


def shown(path: Path, out: Path | None = None) -> str:
    """``path`` as a record holds it: relative to ``out`` (the run's output), the repository, or rodeco's cache
    (``<rodeco cache>/...``); else its name."""
    from rodeco.core.loading import cache_dir

    path = Path(os.path.abspath(path))  # symlinks kept: a venv's python stays the venv's
    for base, label in ((out, ""), (REPO, ""), (cache_dir(), "<rodeco cache>/")):
        if base is not None and path != Path(base).resolve() and path.is_relative_to(Path(base).resolve()):
            return label + str(path.relative_to(Path(base).resolve()))
    return path.name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, ""


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    url: str
    log_path: Path
    started_s: float = 0.0  # seconds from launch to a healthy /health


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@contextlib.contextmanager
def launched(
    name: str,
    argv: list[str],
    port: int,
    log_dir: Path,
    timeout: float,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
) -> Iterator[Server]:
    """``argv`` as a subprocess in its own process group (this environment plus ``env``, less ``unset``), waited for
    on /health (at most ``timeout`` s), and its process group stopped at the end (SIGTERM, then SIGKILL), whatever
    happens."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    url = f"http://127.0.0.1:{port}"
    log.info("starting %s: %s", name, " ".join(argv))
    with open(log_path, "w") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=REPO,
            env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset},
        )
        server = Server(name, proc, url, log_path)
        try:
            end = t0 + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited ({proc.returncode}) before it answered /health; its log "
                        f"({log_path}) ends:\n{tail(log_path)}"
                    )
                with contextlib.suppress(OSError):
                    if http_get(f"{url}/health", timeout=2)[0] == 200:
                        break
                if time.monotonic() > end:
                    raise RuntimeError(
                        f"{name} did not answer /health within {timeout:.0f} s; its log ({log_path}) "
                        f"ends:\n{tail(log_path)}"
                    )
                time.sleep(0.5)
            server.started_s = time.monotonic() - t0
            log.info("%s is up on %s after %.1f s (pid %d)", name, url, server.started_s, proc.pid)
            yield server
        finally:
            stop(proc, name)


def stop(proc: subprocess.Popen, name: str, grace: float = 20.0) -> None:
    """SIGTERM to the process group, up to ``grace`` s for it to exit, then SIGKILL to whatever of the group is
    left (a server's workers too)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        log.warning("%s did not exit within %.0f s of SIGTERM: SIGKILL", name, grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    log.info("%s stopped (exit %s)", name, proc.returncode)


def model_dir(generator: str) -> Path:
    """The directory rodeco loads ``generator``'s weights from (the embedded GGUF, dequantized once and cached)."""
    import rodeco
    from rodeco.core.loading import weights

    g = rodeco.load_config([f"generator={generator}"]).generator
    src, gguf = weights(g.model, g.gguf_file)
    if gguf is not None or not (Path(src) / "config.json").is_file():
        sys.exit(f"generator={generator}: vLLM needs a local model directory, rodeco gives {src} ({gguf})")
    return Path(src)


def dtype_of(a: argparse.Namespace) -> str:
    from rodeco.common.hardware import cuda_available

    return a.dtype if a.dtype != "auto" else ("bfloat16" if cuda_available() else "float32")


def rodeco_exe(given: str | Path | None = None) -> Path:
    """The ``rodeco`` command: ``given``, else this interpreter's, else the checkout's ``.venv``'s."""
    exe = Path(given or Path(sys.executable).parent / "rodeco")
    return exe if exe.is_file() else REPO / ".venv" / "bin" / "rodeco"


def rodeco_argv(a: argparse.Namespace, port: int) -> list[str]:
    return [
        str(rodeco_exe(a.rodeco_bin)),
        "task=serve",
        "serve.host=127.0.0.1",
        f"serve.port={port}",
        f"generator={a.generator}",
        f"generator.dtype={dtype_of(a)}",
        f"reward={a.reward}",
        f"budget.kv_tokens={a.kv_tokens}",
        f"sampling.max_new_tokens={a.max_tokens}",
        f"sampling.top_k={a.top_k}",
        f"serve.max_tokens={max(512, a.max_tokens)}",
        f"serve.max_best_of={max(64, a.best_of)}",
        f"serve.max_queue={max(64, a.requests + a.warmup)}",
        f"serve.request_timeout_s={a.request_timeout}",
        "serve.drain_timeout_s=5",
        # the default offers fixed (alpha in [0, 0.95]) and none; --search adds its policy at its defaults
        *(
            [f"serve.policies=[{{name: fixed, alpha: [0.0, 0.95]}}, {{name: none}}, {{name: {a.search}}}]"]
            if a.search
            else []
        ),
        f"hydra.run.dir={a.out / 'hydra'}",
        *a.rodeco_arg,
    ]


def vllm_argv(a: argparse.Namespace, port: int, src: Path) -> tuple[list[str], dict[str, Any]]:
    """vLLM's server as rodeco's own vLLM engine sets it up (rodeco/engines/vllm.py): the dtype, KV blocks of 32 on
    CPU (16 on CUDA), a KV pool of ``--kv-tokens`` in whole blocks plus vLLM's null block, prefix caching,
    max_model_len the model's context or the pool if smaller."""
    from rodeco.common.hardware import cuda_available
    from rodeco.engines.vllm import default_block

    cfg = json.loads((src / "config.json").read_text())
    dtype = dtype_of(a)
    block = default_block(cuda_available())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = (
        2
        * cfg["num_hidden_layers"]
        * cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        * head_dim
        * (4 if dtype in ("float32", "float") else 2)
    )
    blocks = -(-a.kv_tokens // block)
    max_len = min(cfg.get("max_position_embeddings") or blocks * block, blocks * block)
    max_seqs = 512
    settings = {
        "dtype": dtype,
        "block_size": block,
        "kv_pool_tokens": blocks * block,
        "kv_cache_memory_bytes": (blocks + 1) * block * per_token,
        "max_model_len": max_len,
        "max_num_seqs": max_seqs,
        "max_num_batched_tokens": max(max_seqs * block, max_len, 8192),
        "enforce_eager": a.vllm_eager,
    }
    argv = [
        str(a.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(src),
        "--served-model-name",
        a.generator,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--block-size",
        str(block),
        "--kv-cache-memory-bytes",
        str(settings["kv_cache_memory_bytes"]),
        "--max-model-len",
        str(max_len),
        "--max-num-seqs",
        str(max_seqs),
        "--max-num-batched-tokens",
        str(settings["max_num_batched_tokens"]),
        "--seed",
        str(a.seed),
        "--enable-prefix-caching",
        "--disable-uvicorn-access-log",
        "--generation-config",
        "vllm",
        *(["--enforce-eager"] if a.vllm_eager else []),
        *a.vllm_arg,
    ]
    return argv, settings
