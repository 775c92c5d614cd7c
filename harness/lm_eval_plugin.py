"""oscar-eval as an lm-evaluation-harness model (lm-eval 0.4.13): `oscar_eval`, answering lm-eval's requests through
the project's runner and quantized KV cache.

    python -m harness.lm_eval_plugin --model oscar_eval --model_args model=smollm2-135m,quant=oscar --tasks ...

lm-eval 0.4.13 finds models only in its own registry: it reads no entry points and `--include_path` loads task
YAMLs, not models. So the command is lm-eval's own command line (`lm_eval ...`, every flag the same) started after
this module registered `oscar_eval`; `oscar-lm-eval` is the same as an installed script. From Python: import this
module, then `lm_eval.simple_evaluate(model="oscar_eval", model_args=...)`.

Requests, as lm-eval's own Hugging Face model (`hf`) answers them:
- loglikelihood: the (context, continuation) tokens are lm-eval's (its TemplateLM: the continuation's tokens are the
  tail of the whole text's), cut on the left to max_length + 1. The context is prefilled into a fresh cache of the
  method, then each continuation token is scored as its own decode step over the cache as stored: several tokens
  share a forward only where the method declares it exact (MethodConfig.exact_chunk, harness/scoring.py), and the
  log-probabilities are summed in float64. is_greedy: every continuation token is the argmax of its step.
- loglikelihood_rolling: lm-eval's rolling windows of max_length tokens (context_len=1, the prefix token first),
  each scored as above, summed.
- generate_until: greedy (a request asking do_sample=True is refused), max_gen_toks new tokens at most, the context
  left-cut to max_length - max_gen_toks tokens; the decoded answer is cut at the first `until` text or the end
  token's text, lm-eval's rule. Generation stops early only at end tokens and at `until` texts that are one token.

A request that fails stops the run with its task and document named; it is never answered with a made-up value.
"""

from __future__ import annotations

import logging
import sys

import lm_eval.models  # noqa: F401 - lm-eval's built-in models, registered before ours (an empty registry loads them)
import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import model_registry
from tqdm import tqdm

log = logging.getLogger(__name__)

# model_args lm-eval itself may pass that mean nothing here: auto batching is not offered, nothing remote loads, and
# `tokenizer` is read by RULER's data preparation (lm-eval's tasks/ruler), not by the model.
IGNORED_ARGS = frozenset({"max_batch_size", "trust_remote_code", "tokenizer"})


class RowFailed(RuntimeError):
    """Scoring request `index` of a `_loglikelihood_tokens` call failed (the caller names its document)."""

    def __init__(self, index: int, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.index = index


class OscarEvalLM(TemplateLM):
    """One registered oscar-eval model and KV-cache method behind lm-eval's LM interface."""

    def __init__(
        self,
        model: str | None = None,
        quant: str = "oscar",
        quant_options: str | None = None,
        model_path: str | None = None,
        weights: str = "real",
        seed: int = 0,
        batch_size: int | str = 1,
        device: str | None = None,
        dtype: str | None = None,
        device_map: str | None = None,
        kernels: str | None = None,
        max_length: int | None = None,
        max_gen_toks: int = 256,
        add_bos_token: bool | None = None,
        **extra,
    ):
        super().__init__()
        import quant as quant_lib
        from harness import models
        from harness.options import kernel_options
        from harness.runner import Runner

        unknown = sorted(set(extra) - IGNORED_ARGS)
        if unknown:
            raise TypeError(
                f"oscar_eval: unknown model_args {', '.join(unknown)}; docs/LM_EVAL.md lists the model_args"
            )
        if model is None:
            raise ValueError("oscar_eval: name the model: --model_args model=<oscar-eval list name>,quant=<preset>")
        if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's command passes --device cuda:0 unless told; its hf model then runs on the CPU too
            log.warning("oscar_eval: device %s asked, but this machine has no CUDA device: running on the CPU", device)
            device = "cpu"
        self.model_name = model
        self.method = quant_lib.get_method(quant, **quant_lib.parse_overrides((quant_options or "").replace(";", ",")))
        self.batch_size = positive_int(batch_size, "batch_size")
        self._max_length = positive_int(max_length, "max_length") if max_length is not None else None
        self._max_gen_toks = positive_int(max_gen_toks, "max_gen_toks")
        self.kernels = kernel_options(kernels)  # ';' separates options: lm-eval splits model_args on ','
        self.add_bos_token = add_bos_token
        self._warned_inputs = False
        models.check_weights(model, model_path, weights)  # before anything loads: the fix for missing weights
        self.adapter = models.load(
            model, model_path=model_path, device=device, dtype=dtype, device_map=device_map, weights=weights, seed=seed
        )
        self._device = self.adapter.device
        self.runner = Runner(self.adapter, self.method, self.kernels, models.traits_of(model))

    # ------------------------------------------------------------------------------------------------ tokens
    @property
    def tokenizer(self):
        return self.adapter.tokenizer

    @property
    def tokenizer_name(self) -> str:
        """Keys lm-eval's request cache when a chat template is applied."""
        return self.model_name

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and the first rolling window start with: BOS, else the end token (lm-eval's rule)."""
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        """model_args max_length, else the model config's context length as lm-eval reads it."""
        if self._max_length is not None:
            return self._max_length
        from lm_eval.models.utils import resolve_max_length

        return resolve_max_length(self.adapter.model.config, self.tokenizer)

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len=None, **kwargs):
        """The tokenizer's ids, special tokens as lm-eval's `hf` model adds them: add_special_tokens if given, else
        add_bos_token if given, else the tokenizer's default; never a second BOS before a text that starts with it."""
        if add_special_tokens is None:
            add_special_tokens = self.add_bos_token
            bos = self.tokenizer.decode(self.prefix_token_id)
            if bos and string.startswith(bos):
                add_special_tokens = False
        keywords = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        ids = self.tokenizer.encode(string, **keywords)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """`--apply_chat_template`: the tokenizer's chat template, as lm-eval's `hf` model applies it; a multimodal
        model's template is its processor's, which takes each message's text as a list of parts."""
        owner = self.tokenizer
        if not getattr(owner, "chat_template", None):
            owner = getattr(self.adapter, "processor", None)
            chat_history = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in chat_history]
        if owner is None or not getattr(owner, "chat_template", None):
            raise ValueError(f"oscar_eval: {self.model_name} has no chat template; run without --apply_chat_template")
        return owner.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    # ------------------------------------------------------------------------------------------------ scoring
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's own tokens of each (context, continuation) (TemplateLM), scored by _loglikelihood_tokens."""
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        except RowFailed as err:
            raise self._failed(requests[err.index], err) from err

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood over lm-eval's rolling windows of max_length tokens."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows, owners = [], []
        for i, request in enumerate(requests):
            (text,) = request.args
            pairs = get_rolling_token_windows(self.tok_encode(text), self.prefix_token_id, self.max_length, 1)
            for context, continuation in map(make_disjoint_window, pairs):
                windows.append((None, context, continuation))
                owners.append(i)
        try:
            scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        except RowFailed as err:
            raise self._failed(requests[owners[err.index]], err) from err
        out = [0.0] * len(requests)
        for i, (logprob, _) in zip(owners, scores):
            out[i] += logprob
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **unused) -> list[tuple[float, bool]]:
        """(log-probability, is_greedy) of each (key, context ids, continuation ids). Rows of one context and one
        continuation length share a forward, `batch_size` at a time (no padding); a batch that fails is retried row
        by row, and a row that fails alone raises RowFailed."""
        rows = [fit_window(context, continuation, self.max_length) for _, context, continuation in requests]
        shapes: dict[tuple[int, int], list[int]] = {}
        for i, (context, continuation) in enumerate(rows):
            shapes.setdefault((len(context), len(continuation)), []).append(i)
        batches = [
            members[start : start + self.batch_size]
            for members in shapes.values()
            for start in range(0, len(members), self.batch_size)
        ]
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        with tqdm(total=len(rows), disable=disable_tqdm, desc="oscar_eval loglikelihood") as bar:
            for batch in batches:
                for i, answer in self._score_rows(rows, batch):
                    out[i] = answer
                bar.update(len(batch))
        return out

    def _score_rows(self, rows, batch: list[int]):
        """[(row index, (log-probability, is_greedy))] of the rows `batch` names, one forward pass for them all."""
        try:
            ids = torch.tensor([rows[i][0] + rows[i][1] for i in batch], dtype=torch.long)
            logprob, greedy = score_tokens(self.runner, ids, len(rows[batch[0]][0]))
            return [(i, (lp, bool(g))) for i, lp, g in zip(batch, logprob.tolist(), greedy.tolist())]
        except Exception as err:  # noqa: BLE001 - retried row by row; a row that fails alone is named
            if len(batch) == 1:
                raise RowFailed(batch[0], err) from err
            return [answer for i in batch for answer in self._score_rows(rows, [i])]

    # ------------------------------------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy answers cut at their stop texts; `batch_size` prompts of one setting share a left-padded generate
        (each gets its batch-1 tokens, harness/runner.py), longest first as lm-eval's `hf` model orders them."""
        from lm_eval.models.utils import postprocess_generated_text

        asked = [self._request(r) for r in requests]
        order = sorted(range(len(asked)), key=lambda i: (asked[i][0].max_new_tokens, asked[i][0].stop, -asked[i][1]))
        out: list[str | None] = [None] * len(asked)
        with tqdm(total=len(asked), disable=disable_tqdm, desc="oscar_eval generate_until") as bar:
            for start in range(0, len(order), self.batch_size):
                part = order[start : start + self.batch_size]
                for i, response in zip(part, self.runner.run([asked[i][0] for i in part])):
                    if response.error:
                        raise self._failed(requests[i], RuntimeError(response.error))
                    self._check_inputs(response.input_tokens, asked[i][1])
                    text = self.tokenizer.decode(response.tokens, skip_special_tokens=True)
                    out[i] = postprocess_generated_text(text, asked[i][2], None)
                bar.update(len(part))
        return out

    def _request(self, request):
        """(Generate, the context's token count, the stop texts with the end token's) of one lm-eval request."""
        from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs

        from tasks.contract import Generate, Prompt

        context, gen_kwargs = request.args
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        if kwargs.get("do_sample"):
            raise ValueError(
                f"oscar_eval decodes greedily; task {request.task_name} asks do_sample=True: "
                "rerun with --gen_kwargs do_sample=false"
            )
        until = handle_stop_sequences(
            kwargs["until"], self.tokenizer.decode(self.eot_token_id, skip_special_tokens=False)
        )
        budget = kwargs["max_gen_toks"]
        room = self.max_length - budget
        if room <= 0:
            raise ValueError(f"oscar_eval: max_gen_toks {budget} leaves no room in max_length {self.max_length}")
        text, n_tokens = self._context_text(context, room)
        stops = single_token_stops(self.tokenizer, until)
        return Generate(Prompt(text, chat=False), budget, stop=stops), n_tokens, until

    def _context_text(self, context: str, room: int) -> tuple[str, int]:
        """The prompt text whose plain tokenization (the adapter's: no special tokens added) gives lm-eval's ids of
        `context`, left-cut to `room` tokens; and their number."""
        ids = self.tok_encode(context)
        if len(ids) > room:
            log.warning("oscar_eval: a context of %d tokens is cut on the left to %d", len(ids), room)
            return self.tokenizer.decode(ids[-room:], skip_special_tokens=False), room
        plain = self.tokenizer.encode(context, add_special_tokens=False)
        added = len(ids) - len(plain)
        if added > 0 and ids[added:] == plain:  # the special tokens the tokenizer puts first (BOS), as text
            return self.tokenizer.decode(ids[:added], skip_special_tokens=False) + context, len(ids)
        return context, len(ids)

    def _check_inputs(self, got: int, expected: int) -> None:
        if got != expected and not self._warned_inputs:
            self._warned_inputs = True
            log.warning(
                "oscar_eval: %s turned a context of %d lm-eval tokens into %d input tokens (its processor's "
                "tokenization differs); answers may differ from lm-eval's hf model",
                self.model_name,
                expected,
                got,
            )

    # ------------------------------------------------------------------------------------------------ misc
    def _failed(self, request, err: BaseException) -> RuntimeError:
        return RuntimeError(
            f"oscar_eval {self.model_name}/{self.method.name}: task {request.task_name} doc {request.doc_id} "
            f"failed ({type(err).__name__}: {err}); not answering it with a made-up value"
        )

    def get_model_info(self) -> dict:
        """What lm-eval's results record of the model (its `config`)."""
        spec = self.adapter.spec
        return {
            "oscar_eval": {
                "model": spec.name,
                "hub_id": spec.hub_id,
                "weights": getattr(self.adapter, "weights", "real"),
                "method": self.method.to_dict(),
                "kernels": self.kernels.to_dict(),
                "max_length": self.max_length,
            }
        }


def positive_int(value, name: str) -> int:
    """A model_arg that must be a positive integer (lm-eval's 'auto' batch sizes are not offered)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or str(number) != str(value).strip():
        raise ValueError(f"oscar_eval: {name} must be a positive integer, got {value!r}")
    return number


def fit_window(context: list[int], continuation: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """lm-eval's cut of a long request: the last max_length + 1 tokens of context + continuation; the continuation
    is never cut."""
    if len(continuation) > max_length:
        raise ValueError(f"a continuation of {len(continuation)} tokens is longer than max_length {max_length}")
    if not continuation:
        raise ValueError("an empty continuation has nothing to score")
    whole = (context + continuation)[-(max_length + 1) :]
    return whole[: len(whole) - len(continuation)], continuation


def score_tokens(runner, ids: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probability float64 [B], whether each token is its step's argmax bool [B]) of ids[:, context:] after
    ids[:, :context] (rows of one length, no padding), through a fresh cache of the runner's method: the context is
    prefilled, then the scored tokens are fed as decode steps, several to a forward only where the method declares
    that exact (harness/scoring.py: chunks)."""
    from harness.models.base import TEXT, cache_argument
    from harness.scoring import chunks

    adapter = runner.adapter
    ids = ids.to(adapter.device)
    # the runner's cache for a prompt, every position tagged text: lm-eval asks only text, and ids alone do not carry
    # what some adapters tag by (Qwen3-VL: the processor's mm_token_type_ids)
    cache = runner.prepared.make_cache(config=adapter.text_config, tokenizer=adapter.tokenizer)
    cache.set_modalities(torch.full_like(ids[:, :context], TEXT))
    model = adapter.generator
    with torch.inference_mode():
        out = model(input_ids=ids[:, :context], **cache_argument(cache), use_cache=True, logits_to_keep=1)
        logprob, greedy = step_scores(out.logits[:, -1:], ids[:, context : context + 1])
        cache.state.decode_chunks = True
        for first, stop in chunks(runner.method, context, ids.shape[1] - 1):
            out = model(input_ids=ids[:, first:stop], **cache_argument(cache), use_cache=True)
            more, same = step_scores(out.logits, ids[:, first + 1 : stop + 1])
            logprob, greedy = logprob + more, greedy & same
    return logprob.cpu(), greedy.cpu()


def step_scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, S, V], targets [B, S] -> (summed float64 log-probabilities [B], all targets argmax [B])."""
    logprob = torch.log_softmax(logits.double(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).sum(-1)
    return logprob, (logits.argmax(-1) == targets).all(-1)


def single_token_stops(tokenizer, until: list[str]) -> tuple[str, ...]:
    """The stop texts that are exactly one token alone: generation may end when that token comes, because its text
    is the stop text and the answer is cut there anyway. Longer stop texts only cut the decoded answer."""
    out = []
    for text in until:
        ids = tokenizer.encode(text, add_special_tokens=False) if text else []
        if len(ids) == 1 and tokenizer.decode(ids) == text:
            out.append(text)
    return tuple(out)


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line (`lm_eval ...`) with `oscar_eval` registered."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()


# A lazy entry ("module:class"): the same text from `python -m` (this file as __main__) and from the import it makes,
# so registering twice is no conflict.
model_registry.register("oscar_eval", target="harness.lm_eval_plugin:OscarEvalLM")

if __name__ == "__main__":
    from harness.lm_eval_plugin import main as registered_main  # the importable module, not this __main__ copy

    registered_main()
