"""The oscar-eval adapters as lmms-eval model classes (entry point group `lmms_eval.models`).

    lmms-eval --model oscar_qwen3_vl --model_args model=qwen3-vl-8b,quant=oscar,model_path=/w/Qwen3-VL-8B \
        --tasks ocrbench

Model arguments: model (registry name, or tiny-*), quant (a preset of quant.list_methods()),
quant_options ("key=value;key=value" field overrides), model_path, device, dtype, device_map,
max_new_tokens (default 128, lmms-eval's OCRBench setting).

Two lmms-eval habits are neutralised here:
- `clean()` deletes every nn.Module attribute of the model object after a run. Our adapter is not a
  module (the weights sit inside it), and `clean()` releases it on purpose; the next request reloads it,
  so an object reused across runs keeps working.
- Many lmms-eval models catch exceptions and return "" as the answer, which silently lowers scores.
  We never do: a failing request raises with its task and doc id.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import numpy as np
import torch
from lmms_eval.api.model import lmms

from harness.models.source import RegistrySource
from tasks.contract import Prompt
from tasks.lmms import host

# lmms-eval loads this plugin through its entry point, in the process where the MMAU-Pro hooks
# (tasks/lmms/mmau_pro/utils.py) run: they may then name a registered model as the judge.
host.set_models(RegistrySource())


def parse_options(text: str | None) -> dict[str, Any]:
    """'group_size=64;token_norm=false' -> overrides (';' because lmms-eval splits model_args on ',')."""
    import quant

    return quant.parse_overrides((text or "").replace(";", ","))


def to_audio(visual: dict) -> np.ndarray:
    """An lmms-eval audio dict {"array", "sampling_rate"} -> mono float32 at 16 kHz."""
    wav = np.asarray(visual["array"], dtype=np.float32)
    if wav.ndim > 1:
        wav = wav.mean(axis=0 if wav.shape[0] < wav.shape[-1] else -1)
    rate = int(visual["sampling_rate"])
    if rate != 16_000:
        import librosa

        wav = librosa.resample(wav, orig_sr=rate, target_sr=16_000)
    return wav


def to_prompt(context: str, visuals: list) -> Prompt:
    """lmms-eval's context string plus its visuals (PIL images, audio dicts) -> a Prompt."""
    images, audios = [], []
    for v in visuals or []:
        if isinstance(v, dict) and "array" in v:
            audios.append(to_audio(v))
        elif hasattr(v, "convert"):
            images.append(v.convert("RGB"))
        else:
            raise ValueError(f"unsupported visual {type(v).__name__} (video paths are not supported by oscar-eval yet)")
    return Prompt(context, images=images, audios=audios)


def cut_at_stops(text: str, until) -> str:
    """Truncate the generation at the first stop string (lmms-eval's `until`)."""
    for stop in [until] if isinstance(until, str) else (until or []):
        if stop:
            text = text.split(stop)[0]
    return text


class OscarEvalLMM(lmms):
    """One oscar-eval adapter behind lmms-eval's simple-model API (generate_until)."""

    is_simple = True
    default_model: str | None = None

    def __init__(
        self,
        model: str | None = None,
        quant: str = "oscar",
        quant_options: str | None = None,
        model_path: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
        device_map: str | None = None,
        max_new_tokens: int = 128,
        batch_size: int = 1,
        **unused,
    ):
        super().__init__()
        import quant as quant_lib

        name = model or self.default_model
        if name is None:
            raise ValueError("pass the model name: --model_args model=<oscar-eval registry name>,quant=<preset>")
        self.model_name = name
        self.method = quant_lib.get_method(quant, **parse_options(quant_options))
        ranks = int(os.environ.get("WORLD_SIZE", "1"))
        if ranks > 1 and device_map is not None:
            raise ValueError(
                f"device_map={device_map!r} under {ranks} processes: each process holds a whole model on "
                "its own GPU; drop device_map, or run one process with device_map=auto"
            )
        if device is None and torch.cuda.is_available():  # accelerate launch: each process on its own GPU
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        self._device = torch.device(device or "cpu")
        self.load_options = {"model_path": model_path, "device": device, "dtype": dtype, "device_map": device_map}
        self.max_new_tokens = int(max_new_tokens)
        self.batch_size = int(batch_size)
        self._adapter = None
        self._runner = None

    @property
    def adapter(self):
        """The adapter, (re)loaded on first use and after `clean()`."""
        if self._adapter is None:
            from harness.models import load as load_adapter

            self._adapter = load_adapter(self.model_name, **self.load_options)
        return self._adapter

    @property
    def runner(self):
        """The method's runner over the adapter (harness/runner.py: the model prepared for the method, the default
        kernel options), made on first use and after `clean()`."""
        if self._runner is None:
            from harness.models import traits_of
            from harness.runner import Runner

            self._runner = Runner(self.adapter, self.method, traits=traits_of(self.model_name))
        return self._runner

    @property
    def tokenizer(self):
        return self.adapter.tokenizer

    @property
    def device(self) -> torch.device:
        """The process's device (lmms-eval reads it to count instances across processes)."""
        return self._device

    def generate_until(self, requests) -> list[str]:
        """Answers in request order; `batch_size` requests of one generation setting share a left-padded generate
        (each gets its batch-1 tokens, harness/runner.py)."""
        out = []
        for start in range(0, len(requests), self.batch_size):
            chunk = [r.args for r in requests[start : start + self.batch_size]]
            prompts, settings = [], []
            for context, gen_kwargs, doc_to_visual, doc_id, task, split in chunk:
                try:
                    visuals = doc_to_visual(self.task_dict[task][split][doc_id]) if doc_to_visual else []
                    prompts.append(to_prompt(context, visuals))
                except Exception as err:
                    raise self._failed(task, doc_id, err) from err
                settings.append(int(gen_kwargs.get("max_new_tokens", self.max_new_tokens)))
            answers = self._answer(prompts, settings, chunk)
            out += [cut_at_stops(g.text, args[1].get("until")) for g, args in zip(answers, chunk)]
        return out

    def _answer(self, prompts, settings, chunk):
        from tasks.contract import Generate

        responses = self.runner.run([Generate(p, n) for p, n in zip(prompts, settings)])
        for response, args in zip(responses, chunk):
            if response.error:
                raise self._failed(args[4], args[3], RuntimeError(response.error))
        return responses

    def _failed(self, task, doc_id, err) -> RuntimeError:
        return RuntimeError(
            f"oscar-eval {self.model_name}/{self.method.name}: task {task} doc {doc_id} "
            f"failed ({type(err).__name__}: {err}); not answering it with ''"
        )

    def loglikelihood(self, requests):
        raise NotImplementedError("oscar-eval models only generate (generate_until); pick a generation task")

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("oscar-eval models answer single-round requests only")

    def clean(self):
        """Release the weights (lmms-eval calls this after a run); the next request reloads them."""
        if self._runner is not None:
            self._runner.close()
        self._adapter = self._runner = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class OscarLlava(OscarEvalLMM):
    default_model = "llava-v1.6-7b"


class OscarQwen3VL(OscarEvalLMM):
    default_model = "qwen3-vl-8b"


class OscarQwen3Omni(OscarEvalLMM):
    default_model = "qwen3-omni-30b-a3b"


def manifests() -> list:
    """The entry point payload (list of lmms-eval ModelManifest): one model id per family plus a generic one.

    ModelManifest is imported here, not at the top: importing `lmms_eval.models` builds lmms-eval's
    registry, which loads this entry point, so a top-level import would ask for `manifests` while this
    module is still half-imported (lmms-eval then warns and drops every oscar model).
    """
    from lmms_eval.models.registry_v2 import ModelManifest

    here = __name__
    return [
        ModelManifest("oscar_eval", simple_class_path=f"{here}.OscarEvalLMM"),
        ModelManifest("oscar_llava", simple_class_path=f"{here}.OscarLlava"),
        ModelManifest("oscar_qwen3_vl", simple_class_path=f"{here}.OscarQwen3VL"),
        ModelManifest("oscar_qwen3_omni", simple_class_path=f"{here}.OscarQwen3Omni"),
    ]
