"""Does the drift probe's estimator see mhc-bf16? A small random-weight torch model on the
GPU, its hyper-connection mixes computed by the REAL hc_pre_torch_impl, upstream (fp32
GEMM) and patched (mhc-bf16: bf16 GEMM), on the two paths a server has:

* prefill: the whole sequence at once (causal SDPA, hc_pre on T tokens);
* decode: one token at a time against a KV cache (hc_pre on 1 token), the way a decode
  server produces the logprob of each token it samples.

Measured with the probe's own code (isolate/measure/driftstats.py, exp(r) - 1 - r per token):

1. prefill vs decode with fp32 mixes, and with bf16 mixes (the probe's default mode);
2. A/B: the same tokens replayed as prefill with fp32 mixes and with bf16 mixes (the
   probe's --against mode), against the noise: the same replay twice, and once batched
   next to another sequence (a different GEMM shape: what batching does to a server).

Random weights are fine (the question is whether the estimator separates the two
precisions, not what a trained model does with them).

    python bench/kernels/prepare_src.py --wheel sglang-0.5.14-...whl    # CPU, once
    python bench/kernels/drift_gpu.py --json bench/kernels/results/drift-h200-DATE.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import torch                                               # noqa: E402
import torch.nn.functional as F                            # noqa: E402

from patchset.isolate.measure.driftstats import Verdict, compare  # noqa: E402

N_STREAMS, WIDTH, LAYERS, HEADS, VOCAB = 4, 1024, 8, 8, 8192


def load_hc_pre(which: str):
    path = HERE / "_src" / which / "mhc_fns.py"
    spec = importlib.util.spec_from_file_location(f"mhc_fns_{which}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.hc_pre_torch_impl


class Model:
    """Residual streams in bf16 (as DeepSeek-V4 keeps them), mixes from hc_pre, a causal
    attention and an MLP per layer, fp32 logits; fixed random weights."""

    def __init__(self, hc_pre, seed: int = 0) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)

        def w(*shape: int, scale: float) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device="cuda") * scale
        self.hc_pre = hc_pre
        d, n = WIDTH, N_STREAMS
        self.embed = w(VOCAB, d, scale=1.0).bfloat16()
        self.layers = [{"hc_fn": w(2 * n, n * d, scale=1 / math.sqrt(n * d)),
                        "qkv": w(3 * d, d, scale=1 / math.sqrt(d)).bfloat16(),
                        "out": w(d, d, scale=1 / math.sqrt(d)).bfloat16(),
                        "up": w(4 * d, d, scale=1 / math.sqrt(d)).bfloat16(),
                        "down": w(d, 4 * d, scale=1 / math.sqrt(4 * d)).bfloat16()}
                       for _ in range(LAYERS)]
        self.head = w(VOCAB, d, scale=1 / math.sqrt(d))

    def _mix(self, layer: dict, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, mixes = self.hc_pre(x, layer["hc_fn"])                   # [T, 1, 2n] fp32
        pre = torch.sigmoid(mixes[..., :N_STREAMS]).squeeze(1)
        post = torch.sigmoid(mixes[..., N_STREAMS:]).squeeze(1)
        h = (pre.unsqueeze(-1) * x.float()).sum(1)                  # [T, d]
        return h, post

    def _attn_in(self, layer: dict, h: torch.Tensor):
        q, k, v = F.linear(F.rms_norm(h, (WIDTH,)).bfloat16(), layer["qkv"]).chunk(3, -1)
        shape = (-1, HEADS, WIDTH // HEADS)
        return q.view(shape).transpose(0, 1), k.view(shape).transpose(0, 1), \
            v.view(shape).transpose(0, 1)

    def _rest(self, layer: dict, x, h, post, att) -> torch.Tensor:
        h = h + F.linear(att.transpose(0, 1).reshape(-1, WIDTH), layer["out"]).float()
        h = h + F.linear(F.gelu(F.linear(F.rms_norm(h, (WIDTH,)).bfloat16(), layer["up"])),
                         layer["down"]).float()
        return (x.float() + post.unsqueeze(-1) * h.unsqueeze(1)).bfloat16()

    def _logprobs(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float().mean(1)
        return torch.log_softmax(F.linear(F.rms_norm(h, (WIDTH,)), self.head), -1)

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> tuple[torch.Tensor, list]:
        """Log-probabilities after every position (row t: the next token's), the cache."""
        x = self.embed[ids].unsqueeze(1).repeat(1, N_STREAMS, 1)
        cache = []
        for layer in self.layers:
            h, post = self._mix(layer, x)
            q, k, v = self._attn_in(layer, h)
            cache.append((k, v))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = self._rest(layer, x, h, post, att)
        return self._logprobs(x), cache

    @torch.no_grad()
    def step(self, token: int, cache: list) -> torch.Tensor:
        x = self.embed[torch.tensor([token], device="cuda")].unsqueeze(1).repeat(1, N_STREAMS, 1)
        for i, layer in enumerate(self.layers):
            h, post = self._mix(layer, x)
            q, k, v = self._attn_in(layer, h)
            k_all, v_all = torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1)
            cache[i] = (k_all, v_all)
            att = F.scaled_dot_product_attention(q, k_all, v_all)
            x = self._rest(layer, x, h, post, att)
        return self._logprobs(x)[0]


def generate(model: Model, prompt: torch.Tensor, n: int, seed: int):
    """Sampled tokens and each one's DECODE-path logprob (the first from the prefill, as
    a server's first token)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    lps, cache = model.prefill(prompt)
    row, out, decode = lps[-1], [], []
    for _ in range(n):
        token = int(torch.multinomial(row.exp(), 1, generator=g))
        out.append(token)
        decode.append(float(row[token]))
        row = model.step(token, cache)
    return out, decode


def replay(model: Model, prompt: torch.Tensor, out: list[int], partner=None) -> list[float]:
    """Prefill logprobs of the output tokens; `partner`: batched with another sequence
    (concatenated through the GEMMs, attention kept per sequence by a block mask)."""
    ids = torch.cat([prompt, torch.tensor(out, device="cuda")])
    if partner is None:
        lps, _ = model.prefill(ids)
    else:
        lps = _prefill_batched(model, ids, partner)
    start = len(prompt)
    return [float(lps[start - 1 + i, t]) for i, t in enumerate(out)]


def _prefill_batched(model: Model, ids: torch.Tensor, partner: torch.Tensor) -> torch.Tensor:
    both = torch.cat([ids, partner])
    n = len(ids)
    mask = torch.zeros(len(both), len(both), dtype=torch.bool, device="cuda")
    mask[:n, :n] = torch.ones(n, n, device="cuda").tril().bool()
    m = len(partner)
    mask[n:, n:] = torch.ones(m, m, device="cuda").tril().bool()
    x = model.embed[both].unsqueeze(1).repeat(1, N_STREAMS, 1)
    for layer in model.layers:
        h, post = model._mix(layer, x)
        q, k, v = model._attn_in(layer, h)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = model._rest(layer, x, h, post, att)
    return model._logprobs(x)[:n]


def figures(a: list[float], b: list[float], start: int) -> dict:
    c = compare(a, b, start)
    return {"mean": c.overall.mean, "p90": c.overall.p90, "p99": c.overall.p99,
            "tokens": c.overall.tokens, "values": [v for _, v in c.points]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    models = {"fp32": Model(load_hc_pre("upstream")), "bf16": Model(load_hc_pre("patched"))}
    g = torch.Generator(device="cuda").manual_seed(1234)
    rows: dict[str, list[float]] = {k: [] for k in (
        "pd fp32", "pd bf16", "ab fp32 vs bf16", "noise same replay", "noise batched fp32",
        "noise batched bf16")}
    for s in range(args.sequences):
        prompt = torch.randint(2, VOCAB, (args.prompt,), generator=g, device="cuda")
        partner = torch.randint(2, VOCAB, (args.prompt // 2,), generator=g, device="cuda")
        out, decode32 = generate(models["fp32"], prompt, args.output, s)
        pre32 = replay(models["fp32"], prompt, out)
        # the bf16 model decodes the same tokens (teacher-forced) for its own pd figure
        lps, cache = models["bf16"].prefill(prompt)
        row, dec16 = lps[-1], []
        for t in out:
            dec16.append(float(row[t]))
            row = models["bf16"].step(t, cache)
        pre16 = replay(models["bf16"], prompt, out)
        start = len(prompt)
        rows["pd fp32"] += figures(pre32, decode32, start)["values"]
        rows["pd bf16"] += figures(pre16, dec16, start)["values"]
        rows["ab fp32 vs bf16"] += figures(pre16, pre32, start)["values"]
        rows["noise same replay"] += figures(replay(models["fp32"], prompt, out), pre32,
                                             start)["values"]
        rows["noise batched fp32"] += figures(replay(models["fp32"], prompt, out, partner),
                                              pre32, start)["values"]
        rows["noise batched bf16"] += figures(replay(models["bf16"], prompt, out, partner),
                                              pre16, start)["values"]
    noise = rows["noise batched fp32"]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "model": {"streams": N_STREAMS, "width": WIDTH, "layers": LAYERS,
                        "heads": HEADS, "vocab": VOCAB},
              "prompt": args.prompt, "output": args.output, "sequences": args.sequences,
              "seconds": round(time.monotonic() - started, 1), "rows": {}}
    print(f"{'comparison':<22} {'tokens':>7} {'mean':>10} {'p90':>10} {'p99':>10}  verdict vs "
          "batched-fp32 noise")
    for name, values in rows.items():
        v = Verdict.judge(values, noise, repeats=(0.0, 0.0)) if values else None
        mean = sum(values) / len(values)
        ordered = sorted(values)
        p90, p99 = ordered[int(0.9 * len(values)) - 1], ordered[int(0.99 * len(values)) - 1]
        above = None if v is None else v.above
        result["rows"][name] = {"tokens": len(values), "mean": mean, "p90": p90, "p99": p99,
                                "above_noise": above}
        print(f"{name:<22} {len(values):>7} {mean:>10.3g} {p90:>10.3g} {p99:>10.3g}  "
              f"{'above' if above else 'within'}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
