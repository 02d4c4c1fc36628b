"""Served as ``sglang.srt.managers.tokenizer_manager`` inside stand-in server processes.

The real module imports torch, zmq and transformers, so it cannot run here; what this one
keeps is what patchset observes of it:

* the module and the qualname ``TokenizerManager.generate_request`` (patchset's tracer
  watches that function as "this server took a generate request": deploy/units.py
  WORK_MARKERS), called once per chat request by the stand-in's handler;
* the request's first steps as 0.5.14's ``_create_tokenized_object`` takes them:
  ``sampling_params_class(**sampling_kwargs)``, ``.normalize(self.tokenizer)``,
  ``.verify(self.model_config.vocab_size)``, with the real ``SamplingParams`` imported
  from the served tree (``srt/sampling/sampling_params.py`` is standard library only).
  So a patch to that file runs per request in the server's main process, in the tree
  the server loaded at start, exactly as in SGLang; its ``ValueError`` is the 400 the
  real server answers.

The chat request's fields map to sampling parameters as ``ChatCompletionRequest.
to_sampling_params`` maps them (``max_completion_tokens`` over ``max_tokens``, ``min_tokens``
as ``min_new_tokens``). The tokenizer is the stand-in's: whitespace-separated words
(sglang_standin/chat.py), so ``stop`` strings are measured in the same "tokens".
"""

from __future__ import annotations

from typing import Any

from sglang.srt.sampling.sampling_params import SamplingParams

DEFAULT_VOCAB_SIZE = 129280          # DeepSeek-V4's config.json, when the model has none

_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
         "stop": "stop", "stop_token_ids": "stop_token_ids", "min_tokens": "min_new_tokens",
         "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
         "repetition_penalty": "repetition_penalty", "logit_bias": "logit_bias", "n": "n"}


class WordTokenizer:
    """The stand-in's tokenizer: a word is a token (what usage counts, chat.count_tokens)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [hash(word) & 0xFFFF for word in str(text).split()]


class _ModelConfig:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size


class TokenizerManager:
    sampling_params_class = SamplingParams

    def __init__(self, hf_config: dict) -> None:
        vocab = hf_config.get("vocab_size")
        self.model_config = _ModelConfig(vocab if isinstance(vocab, int) and vocab > 0
                                         else DEFAULT_VOCAB_SIZE)
        self.tokenizer = WordTokenizer()
        self.preferred_sampling_params: dict | None = None

    def generate_request(self, obj: dict, request: Any = None) -> SamplingParams:
        """One request's sampling parameters, checked as the real server checks them."""
        sampling_kwargs = dict(obj.get("sampling_params") or {})
        if self.preferred_sampling_params:
            sampling_kwargs = {**self.preferred_sampling_params, **sampling_kwargs}
        sampling_params = self.sampling_params_class(**sampling_kwargs)
        sampling_params.normalize(self.tokenizer)
        sampling_params.verify(self.model_config.vocab_size)
        return sampling_params


def sampling_kwargs(body: dict) -> dict:
    """A chat completion body's sampling fields, named as SamplingParams names them."""
    out = {dest: body[key] for key, dest in _KEYS.items() if body.get(key) is not None}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        out["max_new_tokens"] = max_tokens
    return out
