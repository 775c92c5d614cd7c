"""Code every multimodal adapter shares: offline weight lookup, processor assembly without a video
stack, modality tagging from input ids. The runner (harness/runner.py) generates with what an adapter builds.

A family adapter (llava.py, qwen3_vl.py, qwen3_omni.py) subclasses `MultimodalAdapter` and supplies
the model class, how a `Prompt` becomes processor inputs, which token ids mark which modality, and
(for Qwen3-Omni) which sub-model generates.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from harness.models.base import MODALITIES, TEXT, ModelLoadError, truncate_middle
from tasks.contract import Prompt

AUDIO_SAMPLE_RATE = 16_000


# ----------------------------------------------------------------------------- weights, offline
def resolve_weights(hub_id: str, model_path: str | None = None) -> str:
    """Directory holding the weights of `hub_id`, found without any network access.

    Order: `model_path`, then the MODEL_PATH environment variable, then a warm Hugging Face cache.
    Raises ModelLoadError naming the hub id and the two ways to point at a copy.
    """
    path = model_path or os.environ.get("MODEL_PATH")
    if path:
        if not Path(path).is_dir():
            raise ModelLoadError(
                f"{path!r} does not exist (or is not a folder). Point MODEL_PATH (or --model-path) at the local copy "
                f"of {hub_id}: the folder that holds config.json and the *.safetensors files."
            )
        if not (Path(path) / "config.json").is_file():
            raise ModelLoadError(
                f"{path!r} holds no config.json, so it is not a copy of {hub_id}. Point MODEL_PATH "
                f"(or --model-path) at the directory that contains config.json and the *.safetensors files."
            )
        return str(path)
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(hub_id, local_files_only=True)
    except Exception as err:  # LocalEntryNotFoundError, offline errors, a missing huggingface_hub
        raise ModelLoadError(
            f"weights for {hub_id} are not available offline ({type(err).__name__}). Either set "
            f"MODEL_PATH=/path/to/a/local/copy (or pass --model-path), or warm the Hugging Face cache on "
            f"a machine with network: `hf download {hub_id}` (HF_HOME must point at that "
            f"cache here)."
        ) from err


WEIGHTS = ("real", "random")


def check_weights(weights: str) -> None:
    if weights not in WEIGHTS:
        raise ValueError(
            f"weights {weights!r}: choose 'real' (the checkpoint's files) or 'random' (the published "
            f"architecture with seeded random weights, for speed and memory only)"
        )


def load_kwargs(dtype: Any = None, device_map: Any = None) -> dict[str, Any]:
    """from_pretrained keywords: dtype ("bfloat16", torch.bfloat16, "auto", None) and device_map
    ("auto" spreads a large model over every visible GPU through accelerate)."""
    kwargs: dict[str, Any] = {"dtype": parse_dtype(dtype) if dtype is not None else "auto"}
    if device_map is not None:
        kwargs["device_map"] = device_map
    return kwargs


def parse_dtype(dtype: Any):
    """ "bf16"/"bfloat16"/"fp16"/"float32"/"auto" or a torch.dtype -> what from_pretrained accepts."""
    if dtype is None or isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    names = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
    }
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(names)} or 'auto'")
    return names[dtype]


def check_device(device: str | None, backend: str | None = None, device_map: str | None = None) -> None:
    """Refuse, in one line and before any weight loads, a device this torch cannot use (a bad name, CUDA on a build or
    machine without it, a GPU index past the last) and a kernel backend that cannot run here: `cuda` needs a GPU,
    `triton` a GPU or Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    cuda = torch.cuda.is_available()
    if device is not None and device_map is None:
        try:
            parsed = torch.device(device)
        except (RuntimeError, ValueError):
            raise ValueError(f"--device {device!r} is not a device; use cpu, cuda or cuda:N") from None
        if parsed.type == "cuda" and not cuda:
            build = "this torch has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise ValueError(f"--device {device}: {build} (torch {torch.__version__}); use --device cpu")
        if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} GPU(s)")
    on_gpu = cuda if device is None else str(device).startswith("cuda")
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "cuda" and not on_gpu:
        raise ValueError("--backend cuda needs a CUDA GPU; on the CPU leave it out (the torch reference runs)")
    if backend == "triton" and not on_gpu and not interpreter:
        raise ValueError(
            "--backend triton needs a CUDA GPU (or Triton's CPU interpreter: TRITON_INTERPRET=1, for tests); "
            "on the CPU leave it out"
        )


def build_processor(processor_cls, path: str, **parts):
    """The model's real processor. `AutoProcessor`-style loading builds a video processor, and those
    need torchvision, which cannot be installed on our CPU machines; when that import fails we build
    the processor from its parts (tokenizer, image processor, feature extractor) without video.

    parts: attribute name -> class with `from_pretrained`, e.g. image_processor=Qwen2VLImageProcessorPil.
    """
    try:
        return processor_cls.from_pretrained(path)
    except ImportError:
        from transformers import AutoTokenizer

        loaded = {name: cls.from_pretrained(path) for name, cls in parts.items()}
        loaded["tokenizer"] = AutoTokenizer.from_pretrained(path)
        if "video_processor" in processor_cls.get_attributes():
            processor_cls = without_video(processor_cls)
            loaded["video_processor"] = None
        return processor_cls(**loaded, chat_template=chat_template(path, loaded["tokenizer"]))


def chat_template(path: str, tokenizer) -> str | None:
    """The processor's chat template: chat_template.jinja, else chat_template.json, else the tokenizer's."""
    import json

    jinja, js = Path(path) / "chat_template.jinja", Path(path) / "chat_template.json"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    if js.is_file():
        return json.loads(js.read_text(encoding="utf-8"))["chat_template"]
    return getattr(tokenizer, "chat_template", None)


def without_video(processor_cls):
    """A subclass of `processor_cls` that accepts `video_processor=None` (images/audio still work;
    asking it for video raises in the processor). The constructor is inherited unchanged: transformers
    reads the processor's parts from its signature."""

    class NoVideo(processor_cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

        def replace_multimodal_special_tokens(self, *args, **kwargs):
            # Qwen3-Omni's processor in transformers 5.17 reads the video processor's merge size even for prompts
            # without video (5.23 does not): lend it the image processor's for the call.
            if self.video_processor is not None:
                return super().replace_multimodal_special_tokens(*args, **kwargs)
            self.video_processor = SimpleNamespace(merge_size=self.image_processor.merge_size)
            try:
                return super().replace_multimodal_special_tokens(*args, **kwargs)
            finally:
                self.video_processor = None

    NoVideo.__name__ = NoVideo.__qualname__ = f"{processor_cls.__name__}NoVideo"
    return NoVideo


# ----------------------------------------------------------------------------- modality tags
def modality_tags(input_ids: torch.Tensor, token_modality: dict[int, int]) -> torch.Tensor:
    """Modality code per position (0 text, 1 image, 2 video, 3 audio; see base.MODALITIES).

    input_ids: LongTensor [B, S]; token_modality: placeholder token id -> modality code.
    Returns LongTensor [B, S]; every id not in the map (text, specials, bos/eos markers) is text.
    """
    tags = torch.full_like(input_ids, TEXT)
    for token_id, code in token_modality.items():
        tags[input_ids == token_id] = code
    return tags


def count_modalities(tags: torch.Tensor) -> dict[str, int]:
    """{"text": n, "image": n, ...} over all positions of tags [B, S]; zero counts are dropped."""
    counts = torch.bincount(tags.flatten().cpu(), minlength=len(MODALITIES))
    return {name: int(n) for name, n in zip(MODALITIES, counts.tolist()) if n}


def load_audio(audio: Any) -> "Any":
    """A mono float32 waveform at 16 kHz: arrays pass through (they must already be mono 16 kHz, as
    `Prompt.audios` says); a path is decoded and resampled with librosa (qwen-omni-utils' rule)."""
    import numpy as np

    if isinstance(audio, (str, os.PathLike)):
        import librosa

        wav, _ = librosa.load(str(audio), sr=AUDIO_SAMPLE_RATE, mono=True)
        return wav.astype(np.float32)
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"audio must be mono (1-D) at 16 kHz, got shape {wav.shape}; average the channels first")
    return wav


# ----------------------------------------------------------------------------- the adapter
class MultimodalAdapter:
    """Shared body of the family adapters. Subclasses set `model_class`, `processor_class`,
    `processor_parts` and implement `build_inputs(prompt) -> BatchFeature` and `token_modality()`."""

    model_class: Any = None
    processor_class: Any = None
    processor_parts: dict[str, Any] = {}
    load_options: dict[str, Any] = {}  # extra from_pretrained keywords (config overrides)

    def __init__(self, spec, model, processor, device=None):
        self.spec = spec
        self.model = model.eval()
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.weights = "real"  # "random": a shape-real model with seeded random weights (harness/models/synthetic.py)

    @classmethod
    def load(cls, spec, model_path=None, device=None, dtype=None, device_map=None, weights="real", seed=0):
        """Weights from `model_path` / MODEL_PATH / a warm HF cache (see resolve_weights). weights="random" (the
        published architecture with seeded random weights) is built by harness.models.load
        (harness/models/synthetic.py)."""
        check_weights(weights)
        path = resolve_weights(spec.hub_id, model_path)
        try:
            processor = build_processor(cls.processor_class, path, **cls.processor_parts)
            model = cls.model_class.from_pretrained(path, **load_kwargs(dtype, device_map), **cls.load_options)
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"could not load {spec.hub_id} from {path}: {err}") from err
        if device is not None and device_map is None:
            model = model.to(device)
        return cls(spec, model, processor, device=device)

    # --- what families provide
    def build_inputs(self, prompt: Prompt):
        raise NotImplementedError

    def token_modality(self) -> dict[int, int]:
        raise NotImplementedError

    @property
    def generator(self):
        """The module whose `generate` runs the text backbone (Qwen3-Omni: the thinker)."""
        return self.model

    @property
    def text_config(self):
        return self.generator.config.get_text_config()

    # --- shared behaviour
    def messages(self, prompt: Prompt) -> list[dict[str, Any]]:
        """Chat messages in the processors' content-list format; media come before the question."""
        content = [{"type": "image"} for _ in prompt.images] + [{"type": "audio"} for _ in prompt.audios]
        content.append({"type": "text", "text": prompt.text})
        msgs = [{"role": "system", "content": [{"type": "text", "text": prompt.system}]}] if prompt.system else []
        return msgs + [{"role": "user", "content": content}]

    def chat_text(self, prompt: Prompt) -> str:
        """The processor's input text: the prompt's text (cut in its middle to `max_tokens`) with its media in the
        chat template, or bare when the prompt asks for no template, then the answer prefix."""
        if prompt.max_tokens is not None:
            prompt = dataclasses.replace(prompt, text=truncate_middle(self.tokenizer, prompt.text, prompt.max_tokens))
        if not prompt.chat:
            if prompt.images or prompt.audios:
                raise ValueError(f"{self.spec.name}: a prompt with images or audio needs the chat template (chat=True)")
            return prompt.text + prompt.answer_prefix
        chat = self.processor.apply_chat_template(self.messages(prompt), add_generation_prompt=True, tokenize=False)
        return chat + prompt.answer_prefix

    def tags(self, inputs) -> torch.Tensor:
        return modality_tags(inputs["input_ids"], self.token_modality())

    def count_modalities(self, inputs) -> dict[str, int]:
        """Prompt positions per modality of one prompt's inputs."""
        return count_modalities(self.tags(inputs))

    def decode(self, tokens) -> str:
        """The answer's text: new token ids without special tokens, stripped."""
        return self.tokenizer.decode(tokens, skip_special_tokens=True).strip()

    @property
    def pad_token_id(self) -> int:
        """What a left-padded batch pads with: the tokenizer's pad token, else its end token."""
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    @property
    def eos_token_ids(self) -> set[int]:
        """The generator's end tokens (a row's answer ends at the first)."""
        eos = self.generator.generation_config.eos_token_id
        return set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
