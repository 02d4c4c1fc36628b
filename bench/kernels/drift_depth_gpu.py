"""The drift probe's three-outcome decision (isolate/measure/driftdecide.py) on the GPU, by depth.

drift_gpu.py showed the old per-token test (driftstats.Verdict) calling mhc-bf16 `above`
at 8 layers and `within` at 16, 32 and 61: the batching noise grows with depth faster than
mhc-bf16's signal, and at 61 layers a few outlier tokens carry a sequence's mean. This bench
asks the same of the new decision (the sequence as the unit, an exact sign-flip
signed-rank test, a bootstrap upper bound, sequential looks), on the same kind of model: a
random-weight torch model whose hyper-connection mixes are computed by the REAL
hc_pre_torch_impl, upstream (fp32 GEMM, state A) and patched (mhc-bf16: bf16 GEMM, state B).

It mirrors what the probe does (isolate/measure/drift.py):

* a sequence is a prompt and its continuation, sampled from state A by a KV-cache decode;
  a round adds 6 sequences, 3 prompt sizes x 2 prompts (the probe's 3 sizes x 2 turns;
  here the second of each size is a fresh prompt, not a follow-up turn); rounds are added
  up to the budget (48 sequences: 8 rounds, the probe's DEFAULT_BUDGET);
* every replay is a prefill of the sequence's tokens under the noise the probe cannot
  control: **batched behind another request** of random length (uniform 1/8 to 1/2 of
  the sequence's, random tokens), concatenated through every GEMM and block-masked in
  attention, a fresh filler for every replay: the GEMMs see a different row count and
  the attention a different key offset each time. No replay runs alone, so any two are
  draws of the same process;
* per sequence, as `isolate.drift.a_b`: drift_i = mean over its output tokens of
  exp(r) - 1 - r between B's replay 0 and A's replay (compare(B0, A)); noise_i = the same
  between B's replay 1 and replay 0 (compare(B1, B0)); `Paired(name, drift_i, noise_i,
  tokens)`;
* same-state pairs (the null): the same construction with both "states" the same state
  (B for even trials, A for odd ones): drift_i = compare(S0, S'), noise_i = compare(S'',
  S0), S0 the state's replay above, S' and S'' two fresh replays. Trials of one group
  share its tokens and S0, and differ in fresh replays: given the tokens they are
  independent, so their false-`above` count is binomial.

drift_gpu.py's residual (x + post * h, h holding the layer's mixed input) doubles the
streams every layer: at 61 layers hc_pre's fp32 mean of squares overflows from layer ~56
(mixes exactly 0 in both states, the head's rms_norm inf, most rows' output uniform), so
the 61-layer figures of that model are artifacts. `--residual sublayer` adds only what
the layer computed (x + post * (h - mixed input)): the streams stay at RMS ~4.

The GPU run only measures (per-sequence numbers to JSON; it stops adding null trials at
--seconds); the decisions are taken here, on the CPU, with driftdecide.decide itself
(--analyze: bootstraps in pure Python are slow, and device time is scarce).

    python bench/kernels/prepare_src.py --wheel sglang-0.5.14-...whl            # CPU, once
    python bench/kernels/drift_depth_gpu.py --json OUT.json                      # GPU
    python bench/kernels/drift_depth_gpu.py --depths 61 --residual sublayer --json OUT2.json
    python bench/kernels/drift_depth_gpu.py --analyze OUT.json [--resample 100]  # CPU
    python bench/kernels/drift_depth_gpu.py --cpu --json /tmp/dry.json && \\
        python bench/kernels/drift_depth_gpu.py --analyze /tmp/dry.json          # dry run
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from patchset.isolate.measure import driftdecide  # noqa: E402
from patchset.isolate.measure.driftdecide import (DEFAULT_CONFIDENCE, DEFAULT_TOLERANCE,
                                                  Paired, decide)
from patchset.isolate.measure.driftstats import Verdict, compare  # noqa: E402

# the decision code this process decides with (read at import: what a report names)
DECIDE_SHA = hashlib.sha256(Path(driftdecide.__file__).read_bytes()).hexdigest()[:16]


@dataclass
class Config:
    depths: tuple[int, ...] = (8, 16, 32, 61)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    sizes: tuple[int, ...] = (256, 512, 1024)      # prompt tokens, one each per round, x2
    outputs: tuple[int, ...] = (64, 256)           # output tokens (a group per length)
    budget: int = 48                               # sequences at most (8 rounds of 6)
    null_sequences: int = 24                       # sequences per same-state trial
    streams: int = 4
    width: int = 1024
    heads: int = 8
    vocab: int = 8192
    seconds: float = 420.0                         # stop adding null trials after this
    device: str = "cuda"
    residual: str = "mixed"     # mixed: drift_gpu.py's x + post*h, h holding the mixed
    #                             input (grows ~2x a layer); sublayer: x + post*(h - input)
    noise: str = "batched"      # batched: every replay behind a random filler request;
    #                             alone: every replay by itself (the probe's own conditions)

    @property
    def per_round(self) -> int:
        return 2 * len(self.sizes)

    @property
    def looks(self) -> int:
        return max(1, self.budget // self.per_round)


TINY = dict(depths=(2, 3), seeds=(0, 1, 2), sizes=(16, 24, 32), outputs=(8, 16), budget=18,
            null_sequences=12, width=64, heads=4, vocab=512, seconds=40.0, device="cpu")


# ================================================================ the model (torch)

def load_hc_pre(which: str):
    path = HERE / "_src" / which / "mhc_fns.py"
    spec = importlib.util.spec_from_file_location(f"mhc_fns_{which}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.hc_pre_torch_impl


class Net:
    """drift_gpu.py's model at any depth: residual streams in bf16, mixes from hc_pre, a
    causal attention and an MLP per layer, fp32 logits; fixed random weights (one set per
    depth, shared by both states: only the hc_pre differs)."""

    def __init__(self, cfg: Config, layers: int, seed: int) -> None:
        import torch
        self.torch, self.cfg, self.dev = torch, cfg, torch.device(cfg.device)
        g = torch.Generator(device=self.dev).manual_seed(seed)

        def w(*shape: int, scale: float):
            return torch.randn(*shape, generator=g, device=self.dev) * scale
        d, n = cfg.width, cfg.streams
        self.embed = w(cfg.vocab, d, scale=1.0).bfloat16()
        self.layers = [{"hc_fn": w(2 * n, n * d, scale=1 / math.sqrt(n * d)),
                        "qkv": w(3 * d, d, scale=1 / math.sqrt(d)).bfloat16(),
                        "out": w(d, d, scale=1 / math.sqrt(d)).bfloat16(),
                        "up": w(4 * d, d, scale=1 / math.sqrt(d)).bfloat16(),
                        "down": w(d, 4 * d, scale=1 / math.sqrt(4 * d)).bfloat16()}
                       for _ in range(layers)]
        self.head = w(cfg.vocab, d, scale=1 / math.sqrt(d))

    def _layer(self, hc_pre, layer: dict, x, attend):
        F = self.torch.nn.functional
        n, d = self.cfg.streams, self.cfg.width
        x_flat, mixes = hc_pre(x, layer["hc_fn"])                    # [R, n*d], [R, 1, 2n]
        gates = self.torch.sigmoid(mixes.squeeze(1))
        pre, post = gates[:, :n], gates[:, n:]
        xs = x_flat.view(-1, n, d)
        h = h_in = (pre.unsqueeze(-1) * xs).sum(1)                   # [R, d] fp32
        qkv = F.linear(F.rms_norm(h, (d,)).bfloat16(), layer["qkv"])
        h = h + F.linear(attend(qkv), layer["out"]).float()
        h = h + F.linear(F.gelu(F.linear(F.rms_norm(h, (d,)).bfloat16(), layer["up"])),
                         layer["down"]).float()
        if self.cfg.residual == "sublayer":
            h = h - h_in
        return self.torch.addcmul(xs, post.unsqueeze(-1), h.unsqueeze(1)).bfloat16()

    def _embed(self, ids):
        return self.embed[ids].unsqueeze(1).repeat(1, self.cfg.streams, 1)

    def _logprobs(self, x):
        F = self.torch.nn.functional
        h = F.rms_norm(x.float().mean(1), (self.cfg.width,))
        return self.torch.log_softmax(F.linear(h, self.head), -1)

    def _split(self, qkv, batch: int, length: int):
        heads, dh = self.cfg.heads, self.cfg.width // self.cfg.heads
        return qkv.view(batch, length, 3, heads, dh).permute(2, 0, 3, 1, 4)   # q, k, v

    def _sdpa(self, q, k, v, mask):
        return self.torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    # ------------------------------------------------------------ replay: one prefill

    def replay(self, hc_pre, ids, start: int, filler):
        """Log-probabilities of ids[start:] given what precedes them, prefilled as the
        second request of a batch behind `filler` (token ids): one GEMM over both,
        attention block-masked per request."""
        torch = self.torch
        m, n = len(filler), len(ids)
        both = torch.cat([filler, ids])
        t = m + n
        pos = torch.arange(t, device=self.dev)
        seg = pos >= m
        mask = (pos[:, None] >= pos[None, :]) & (seg[:, None] == seg[None, :])
        d = self.cfg.width

        def attend(qkv):
            q, k, v = self._split(qkv, 1, t)
            return self._sdpa(q, k, v, mask)[0].transpose(0, 1).reshape(t, d)
        x = self._embed(both)
        with torch.no_grad():
            for layer in self.layers:
                x = self._layer(hc_pre, layer, x, attend)
            rows = x[m + start - 1: t - 1]
            lps = self._logprobs(rows)
            picked = lps.gather(1, ids[start:].unsqueeze(1)).squeeze(1)
        return picked.tolist()

    # ------------------------------------------------------------ generation: decode

    def generate(self, hc_pre, prompts: list, steps: int, gen) -> list:
        """Continuations of `steps` tokens sampled (temperature 1) by a batched KV-cache
        decode: prompts left-padded (the model has no positions), padding masked out."""
        torch = self.torch
        b, p = len(prompts), max(len(x) for x in prompts)
        total = p + steps
        heads, dh, d = self.cfg.heads, self.cfg.width // self.cfg.heads, self.cfg.width
        ids = torch.zeros(b, p, dtype=torch.long, device=self.dev)
        valid = torch.zeros(b, total, dtype=torch.bool, device=self.dev)
        for i, x in enumerate(prompts):
            ids[i, p - len(x):] = x
            valid[i, p - len(x):] = True
        valid[:, p:] = True
        cache = [(torch.zeros(b, heads, total, dh, dtype=torch.bfloat16, device=self.dev),
                  torch.zeros(b, heads, total, dh, dtype=torch.bfloat16, device=self.dev))
                 for _ in self.layers]
        causal = torch.ones(p, p, dtype=torch.bool, device=self.dev).tril()
        eye = torch.eye(p, dtype=torch.bool, device=self.dev)
        pmask = ((causal & valid[:, None, :p]) | eye).unsqueeze(1)   # [b, 1, p, p]

        def prefill_attend(i):
            def attend(qkv):
                q, k, v = self._split(qkv, b, p)
                cache[i][0][:, :, :p] = k
                cache[i][1][:, :, :p] = v
                return self._sdpa(q, k, v, pmask).transpose(1, 2).reshape(b * p, d)
            return attend

        out = []
        with torch.no_grad():
            x = self._embed(ids.reshape(-1))
            for i, layer in enumerate(self.layers):
                x = self._layer(hc_pre, layer, x, prefill_attend(i))
            row = self._logprobs(x.view(b, p, *x.shape[1:])[:, -1])
            for s in range(steps):
                token = torch.multinomial(row.exp(), 1, generator=gen).squeeze(1)
                out.append(token)
                if s + 1 == steps:
                    break
                at = p + s
                dmask = valid[:, None, None, :at + 1]

                def step_attend(i, at=at, dmask=dmask):
                    def attend(qkv):
                        q, k, v = self._split(qkv, b, 1)
                        cache[i][0][:, :, at] = k[:, :, 0]
                        cache[i][1][:, :, at] = v[:, :, 0]
                        o = self._sdpa(q, cache[i][0][:, :, :at + 1],
                                       cache[i][1][:, :, :at + 1], dmask)
                        return o.transpose(1, 2).reshape(b, d)
                    return attend
                x = self._embed(token)
                for i, layer in enumerate(self.layers):
                    x = self._layer(hc_pre, layer, x, step_attend(i))
                row = self._logprobs(x)
        return torch.stack(out, 1)                                   # [b, steps]


# ================================================================ measuring

def _mean(a: list[float], b: list[float], start: int) -> tuple[float, float, list[float]]:
    c = compare(a, b, start)
    values = [v for _, v in c.points]
    return c.overall.mean, max(values), values


def measure(cfg: Config, out_path: Path | None) -> dict:
    import torch
    started = time.monotonic()
    deadline = started + cfg.seconds
    hc = {"A": load_hc_pre("upstream"), "B": load_hc_pre("patched")}
    dev = torch.device(cfg.device)
    nets = {depth: Net(cfg, depth, seed=1000 + depth) for depth in cfg.depths}
    result = {"config": asdict(cfg), "torch": torch.__version__,
              "device": (torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"),
              "driftdecide_sha256": hashlib.sha256(
                  (ROOT / "isolate" / "driftdecide.py").read_bytes()).hexdigest()[:16],
              "noise": ("every replay alone (one request at a time: the probe's own "
                        "conditions, isolate/measure/drift.py)" if cfg.noise == "alone" else
                        "every replay batched behind a fresh random filler request "
                        "(length uniform 1/8..1/2 of the sequence's)"),
              "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
              "groups": [], "timing": {}, "null_trials": 0}
    groups: list[dict] = []
    keep: dict[int, dict] = {}              # group index -> tensors for the null phase
    rng = random.Random(20261203)

    def filler(n: int, gen):
        if cfg.noise == "alone":
            return torch.empty(0, dtype=torch.long, device=dev)
        m = rng.randint(max(1, n // 8), max(1, n // 2))
        return torch.randint(2, cfg.vocab, (m,), generator=gen, device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    # ---------------------------------------------------------------- phase 1: A/B
    replays = {d: [0, 0.0] for d in cfg.depths}
    gen_time = {d: 0.0 for d in cfg.depths}
    for seed in cfg.seeds:
        if seed != cfg.seeds[0] and time.monotonic() - started > 0.55 * cfg.seconds:
            print(f"phase 1: stopped before seed {seed} (time)", flush=True)
            break
        gen = torch.Generator(device=dev).manual_seed(seed)
        prompts = [torch.randint(2, cfg.vocab,
                                 (cfg.sizes[(j % cfg.per_round) // 2],), generator=gen,
                                 device=dev)
                   for _ in cfg.outputs for j in range(cfg.budget)]
        for depth in cfg.depths:
            net = nets[depth]
            t0 = time.monotonic()
            sampled = net.generate(hc["A"], prompts, max(cfg.outputs), gen)
            sync()
            gen_time[depth] += time.monotonic() - t0
            t0 = time.monotonic()
            for li, n_out in enumerate(cfg.outputs):
                group = {"depth": depth, "seed": seed, "output": n_out, "sequences": []}
                ids_list, refs = [], []
                drift_tok, noise_tok = [], []
                for j in range(cfg.budget):
                    k = li * cfg.budget + j
                    prompt = prompts[k]
                    ids = torch.cat([prompt, sampled[k, :n_out]])
                    start = len(prompt)
                    b0 = net.replay(hc["B"], ids, start, filler(len(ids), gen))
                    b1 = net.replay(hc["B"], ids, start, filler(len(ids), gen))
                    a0 = net.replay(hc["A"], ids, start, filler(len(ids), gen))
                    drift, dmax, dvals = _mean(b0, a0, start)      # a_b: compare(B0, A)
                    noise, nmax, nvals = _mean(b1, b0, start)      # compare(B1, B0)
                    drift_tok += dvals
                    noise_tok += nvals
                    group["sequences"].append({
                        "prompt": start, "tokens": len(dvals), "drift": drift,
                        "noise": noise, "drift_max": dmax, "noise_max": nmax,
                        "null": []})
                    ids_list.append((ids, start))
                    refs.append({"B": b0, "A": a0})
                old = Verdict.judge(drift_tok, noise_tok, repeats=(0.0, 0.0))
                group["old_verdict"] = {"above": old.above, "why": old.why}
                group["tokens"] = {"drift": _summary(drift_tok), "noise": _summary(noise_tok)}
                keep[len(groups)] = {"ids": ids_list, "refs": refs, "gen": gen}
                groups.append(group)
                replays[depth][0] += 3 * cfg.budget
            sync()
            replays[depth][1] += time.monotonic() - t0
            print(f"phase 1: seed {seed} depth {depth}: generated in "
                  f"{gen_time[depth]:.1f}s (cumulative), {time.monotonic() - started:.0f}s",
                  flush=True)
    result["groups"] = groups
    result["timing"] = {"phase1_s": round(time.monotonic() - started, 1),
                        "generate_s": {str(d): round(v, 1) for d, v in gen_time.items()},
                        "replay_ms": {str(d): round(1e3 * t / max(1, n), 2)
                                      for d, (n, t) in replays.items()}}
    _write(result, out_path)
    print(_raw_table(result), flush=True)

    # ---------------------------------------------------------------- phase 2: nulls
    trial = 0
    done = True
    while done:
        state = "B" if trial % 2 == 0 else "A"
        for gi, group in enumerate(groups):
            if time.monotonic() > deadline:
                done = False
                break
            net, kept = nets[group["depth"]], keep[gi]
            for j in range(min(cfg.null_sequences, len(group["sequences"]))):
                ids, start = kept["ids"][j]
                ref = kept["refs"][j][state]
                x = net.replay(hc[state], ids, start, filler(len(ids), kept["gen"]))
                y = net.replay(hc[state], ids, start, filler(len(ids), kept["gen"]))
                group["sequences"][j]["null"].append(
                    [compare(ref, x, start).overall.mean, compare(y, ref, start).overall.mean])
        if done:
            trial += 1
            result["null_trials"] = trial
            _write(result, out_path)
    # a trial cut short by the deadline is dropped: every group keeps `trial` of them
    for group in groups:
        for seq in group["sequences"]:
            del seq["null"][trial:]
    result["null_trials"] = trial
    result["timing"]["total_s"] = round(time.monotonic() - started, 1)
    _write(result, out_path)
    print(f"phase 2: {trial} same-state trials per group ({len(groups)} groups), "
          f"{result['timing']['total_s']}s in all", flush=True)
    return result


def _summary(values: list[float]) -> dict:
    ordered = sorted(values)

    def q(p: float) -> float:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]
    return {"tokens": len(values), "mean": statistics.fmean(values), "p50": q(0.5),
            "p90": q(0.9), "p99": q(0.99), "max": ordered[-1]}


def _write(result: dict, path: Path | None) -> None:
    if path is not None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(result, separators=(",", ":")) + "\n")
        tmp.replace(path)


def _raw_table(result: dict) -> str:
    """What the GPU measured, before any decision: per depth and output length, over every
    seed, the per-token figures and the per-sequence means."""
    lines = [f"{'layers':>6} {'out':>4} {'seqs':>5} {'tok drift':>10} {'tok noise':>10} "
             f"{'p90 drift':>10} {'p90 noise':>10} {'mean e_i':>10} {'e_i>0':>6} "
             f"{'old verdict':>12} {'replay ms':>9}"]
    for (depth, out), gs in _by_cell(result["groups"]).items():
        seqs = [s for g in gs for s in g["sequences"]]
        excess = [s["drift"] - s["noise"] for s in seqs]
        tok_d = statistics.fmean(g["tokens"]["drift"]["mean"] for g in gs)
        tok_n = statistics.fmean(g["tokens"]["noise"]["mean"] for g in gs)
        p90_d = statistics.median(g["tokens"]["drift"]["p90"] for g in gs)
        p90_n = statistics.median(g["tokens"]["noise"]["p90"] for g in gs)
        old = sum(bool(g["old_verdict"]["above"]) for g in gs)
        lines.append(f"{depth:>6} {out:>4} {len(seqs):>5} {tok_d:>10.3g} {tok_n:>10.3g} "
                     f"{p90_d:>10.3g} {p90_n:>10.3g} {statistics.fmean(excess):>10.3g} "
                     f"{sum(e > 0 for e in excess) / len(excess):>6.2f} "
                     f"{old:>4}/{len(gs)} above "
                     f"{result['timing']['replay_ms'][str(depth)]:>9}")
    return "\n".join(lines)


def _by_cell(groups: list[dict]) -> dict:
    cells: dict[tuple[int, int], list[dict]] = {}
    for g in groups:
        cells.setdefault((g["depth"], g["output"]), []).append(g)
    return dict(sorted(cells.items()))


# ================================================================ deciding (CPU)

def _pairs(seqs: list[dict], key=None) -> list[Paired]:
    if key is None:
        return [Paired(str(i), s["drift"], s["noise"], s["tokens"]) for i, s in enumerate(seqs)]
    return [Paired(str(i), s["null"][key][0], s["null"][key][1], s["tokens"])
            for i, s in enumerate(seqs)]


def sequential(pairs: list[Paired], per_round: int, looks: int, tolerances: dict[str, float]
               ) -> dict:
    """The probe's sequential measurement on `pairs` in order: a look after every round,
    each held to 1/looks of the error; for each tolerance, the first decided look. Also
    the first look that is `above` whatever the tolerance (decide() tests above first,
    so that look does not depend on it) and the decision at the last look."""
    out = {name: None for name in tolerances}
    first_above = None
    last, last_look = None, 0
    rounds = min(looks, len(pairs) // per_round)
    for r in range(1, rounds + 1):
        head = pairs[:r * per_round]
        d = decide(head, DEFAULT_TOLERANCE, DEFAULT_CONFIDENCE, 2, looks)
        if first_above is None and d.outcome == "above":
            first_above = _brief(d, r)
        for name, tol in tolerances.items():
            if out[name] is None:
                dd = d if tol == DEFAULT_TOLERANCE else decide(head, tol, DEFAULT_CONFIDENCE,
                                                               2, looks)
                if dd.outcome != "inconclusive":
                    out[name] = _brief(dd, r)
        last, last_look = d, r
        if first_above is not None and all(v is not None for v in out.values()):
            break
    return {"decided": out, "first_above": first_above,
            "at_budget": _brief(last, last_look) if last is not None else None}


def _brief(d, look: int) -> dict:
    return {"outcome": d.outcome, "look": look, "sequences": d.sequences, "tokens": d.tokens,
            "drift": d.drift, "upper": d.upper, "p": d.p_value, "detectable": d.detectable,
            "needs": d.needs, "noise": d.noise}


def _ab_job(args) -> dict:
    seqs, per_round, looks, tolerances = args
    return sequential(_pairs(seqs), per_round, looks, tolerances)


def _null_job(args) -> dict:
    seqs, k, per_round, looks = args
    pairs = _pairs(seqs, k)
    seq = sequential(pairs, per_round, looks, {"default": DEFAULT_TOLERANCE})
    fixed = decide(pairs, DEFAULT_TOLERANCE, DEFAULT_CONFIDENCE, 2, 1)
    zeros = sum(p.noise == 0.0 for p in pairs) + sum(p.drift == 0.0 for p in pairs)
    return {"realistic": (seq["decided"]["default"] or {}).get("outcome"),
            "realistic_look": (seq["decided"]["default"] or {}).get("look"),
            "above_any_look": seq["first_above"] is not None,
            "fixed_above": fixed.outcome == "above", "fixed_p": fixed.p_value,
            "zeros": zeros, "n": len(pairs)}


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided binomial interval (bisection on the binomial tail)."""
    if n == 0:
        return 0.0, 1.0
    a = (1 - level) / 2

    def tail_ge(p: float) -> float:      # P(X >= k)
        return 1 - sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k))

    def tail_le(p: float) -> float:      # P(X <= k)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))

    def solve(f, target, increasing: bool) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (f(mid) < target) == increasing:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2
    low = 0.0 if k == 0 else solve(tail_ge, a, True)
    high = 1.0 if k == n else solve(tail_le, a, False)
    return low, high


def analyze(result: dict, workers: int = 2, fractions=(0.5, 0.9), resamples: int = 0
            ) -> dict:
    cfg = Config(**{k: tuple(v) if isinstance(v, list) else v
                    for k, v in result["config"].items()})
    groups = result["groups"]
    cells = _by_cell(groups)
    # the true effect of each (depth, output): the mean over sequences of drift_i -
    # noise_i over every seed but the run's own (leave one seed out), and over all
    truth: dict[tuple, float] = {}
    pooled: dict[tuple, float] = {}
    for (depth, out), gs in cells.items():
        allx = [s["drift"] - s["noise"] for g in gs for s in g["sequences"]]
        pooled[(depth, out)] = statistics.fmean(allx)
        for g in gs:
            rest = [s["drift"] - s["noise"] for h in gs if h is not g for s in h["sequences"]]
            truth[(depth, out, g["seed"])] = statistics.fmean(rest) if rest else float("nan")
    jobs = []
    for g in groups:
        tol = {"default": DEFAULT_TOLERANCE}
        t = truth[(g["depth"], g["output"], g["seed"])]
        for f in fractions:
            if t > 0:
                tol[f"below{f:g}"] = f * t
        jobs.append((g["sequences"], cfg.per_round, cfg.looks, tol))
    nulls = []
    for g in groups:
        trials = min((len(s["null"]) for s in g["sequences"][:cfg.null_sequences]), default=0)
        for k in range(trials):
            nulls.append((g["sequences"][:cfg.null_sequences], k, cfg.per_round, cfg.looks))
    with ProcessPoolExecutor(workers) as pool:
        ab = list(pool.map(_ab_job, jobs, chunksize=1))
        null = list(pool.map(_null_job, nulls, chunksize=8))
    for g, a in zip(groups, ab):
        g["decision"] = a
        g["true_effect_loo"] = truth[(g["depth"], g["output"], g["seed"])]
    null_by_depth: dict[int, list] = {}
    it = iter(null)
    for g in groups:
        trials = min((len(s["null"]) for s in g["sequences"][:cfg.null_sequences]), default=0)
        g["null"] = [next(it) for _ in range(trials)]
        null_by_depth.setdefault(g["depth"], []).extend(g["null"])
    stats = {}
    for (depth, out), gs in cells.items():
        seqs = [s for g in gs for s in g["sequences"]]
        stats[f"{depth}/{out}"] = cell_stats(seqs, cfg)
    resampled = {}
    if resamples:
        jobs = [(f"{d}/{o}", [s for g in gs for s in g["sequences"]], cfg.budget,
                 cfg.per_round, cfg.looks, resamples, fractions[-1])
                for (d, o), gs in cells.items() if pooled[(d, o)] > 0]
        with ProcessPoolExecutor(workers) as pool:
            for name, got in zip([j[0] for j in jobs], pool.map(_resample_job, jobs)):
                resampled[name] = got
    return {"cells": {f"{d}/{o}": pooled[(d, o)] for (d, o) in cells}, "stats": stats,
            "resampled": resampled, "null_by_depth": null_by_depth, "groups": groups,
            "config": asdict(cfg)}


def cell_stats(seqs: list[dict], cfg: Config) -> dict:
    """Over every seed's sequences of one (depth, output): the excess e_i's mean, its
    standard error, median and Hodges-Lehmann estimate (the location the signed-rank
    test sees), the decision on all of them at one look, and the budget at which the
    minimum detectable drift (driftdecide.minimum_detectable: normal approximation, the
    test's least efficiency, each look at 1/looks of the error) falls to the mean."""
    e = [s["drift"] - s["noise"] for s in seqs]
    n = len(e)
    walsh = sorted((e[i] + e[j]) / 2 for i in range(n) for j in range(i, n))
    sd = statistics.stdev(e)
    mean = statistics.fmean(e)
    whole = decide(_pairs(seqs), DEFAULT_TOLERANCE, DEFAULT_CONFIDENCE, 2, 1)
    return {"sequences": n, "mean": mean, "se": sd / math.sqrt(n), "sd": sd,
            "median": statistics.median(e), "hodges_lehmann": walsh[len(walsh) // 2],
            "walsh_positive": sum(w > 0 for w in walsh) / len(walsh),
            "all_one_look": _brief(whole, 1),
            "projected_budget": projected_budget(sd, mean, cfg.per_round)}


def projected_budget(sd: float, effect: float, per_round: int, limit: int = 10 ** 6
                     ) -> int | None:
    """Fewest sequences (whole rounds) whose minimum detectable drift, with as many
    looks as rounds, is at most `effect`; None past `limit` or for no positive effect."""
    if effect <= 0:
        return None
    z = statistics.NormalDist()
    n = per_round
    while n <= limit:
        looks = n // per_round
        alpha = (1 - DEFAULT_CONFIDENCE) / looks
        detectable = (z.inv_cdf(1 - alpha) + z.inv_cdf(driftdecide.POWER)) * sd / math.sqrt(
            n * driftdecide.EFFICIENCY)
        if detectable <= effect:
            return n
        n += per_round if n < 600 else 10 * per_round
    return None


def _resample_job(args) -> dict:
    """Coverage of the bound where the truth is known: runs of `budget` sequences drawn
    with replacement from the cell's pool (the population; its mean the true effect),
    the probe's sequential procedure at tolerance `fraction` x that mean."""
    name, seqs, budget, per_round, looks, count, fraction = args
    truth = statistics.fmean(s["drift"] - s["noise"] for s in seqs)
    rng = random.Random(f"resample {name}")
    bounded = above = 0
    for _ in range(count):
        draw = [seqs[rng.randrange(len(seqs))] for _ in range(budget)]
        got = sequential(_pairs(draw), per_round, looks, {"below": fraction * truth})
        decided = got["decided"]["below"]
        bounded += bool(decided and decided["outcome"] == "bounded")
        above += got["first_above"] is not None
    return {"runs": count, "tolerance": fraction * truth, "bounded": bounded,
            "above": above}


def report(result: dict, summary: dict) -> str:
    cfg = summary["config"]
    lines = []
    lines.append(f"budget {cfg['budget']} sequences, rounds of {2 * len(cfg['sizes'])}, "
                 f"looks {max(1, cfg['budget'] // (2 * len(cfg['sizes'])))}, confidence "
                 f"{DEFAULT_CONFIDENCE}, default tolerance {DEFAULT_TOLERANCE}; "
                 f"device {result['device']}, torch {result['torch']}; decided with "
                 f"isolate/measure/driftdecide.py sha256 {DECIDE_SHA} (measured under "
                 f"{result.get('driftdecide_sha256', '?')})")
    lines.append(f"noise: {result.get('noise', '?')}")
    lines.append("")
    lines.append("mhc-bf16 (A = upstream fp32 mixes, B = mhc-bf16), per depth and output "
                 "length, one sequential run per seed (e_i = drift_i - noise_i, per token):")
    lines.append("| layers | output | e_i over all seeds: mean (SE) | median, HL | noise_i mean "
                 "| above within budget | sequences to above (min-max) | tokens to above "
                 "(min-max) | at tol 0.002: outcome (look) | old per-token Verdict at "
                 "budget | all seeds' sequences, one look | budget to detect the mean "
                 "(projected) | bounded at tol = 0.5 / 0.9 x true effect |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (depth, out), gs in _by_cell(summary["groups"]).items():
        st = summary["stats"][f"{depth}/{out}"]
        firsts = [g["decision"]["first_above"] for g in gs]
        hit = [f for f in firsts if f is not None]
        seqs = sorted(f["sequences"] for f in hit)
        toks = sorted(f["tokens"] for f in hit)
        dflt = [g["decision"]["decided"]["default"] for g in gs]
        counts: dict[str, list[int]] = {}
        for d in dflt:
            key = d["outcome"] if d else "inconclusive"
            counts.setdefault(key, []).append(d["look"] if d else cfg["budget"] // (
                2 * len(cfg["sizes"])))
        dtext = ", ".join(f"{k} {len(v)} (look {min(v)}-{max(v)})" if min(v) != max(v)
                          else f"{k} {len(v)} (look {v[0]})" for k, v in counts.items())
        old = sum(bool(g["old_verdict"]["above"]) for g in gs)
        below = []
        for f in ("0.5", "0.9"):
            runs = [g["decision"]["decided"] for g in gs if f"below{f}" in g["decision"]["decided"]]
            got = sum(1 for x in runs if x[f"below{f}"] and x[f"below{f}"]["outcome"] == "bounded")
            below.append(f"{got}/{len(runs)}" if runs else "n/a")
        noise = statistics.fmean(s["noise"] for g in gs for s in g["sequences"])
        whole = st["all_one_look"]
        proj = st["projected_budget"]
        lines.append(
            f"| {depth} | {out} | {st['mean']:.3g} ({st['se']:.2g}) | {st['median']:.2g}, "
            f"{st['hodges_lehmann']:.2g} | {noise:.3g} | {len(hit)}/{len(gs)} | "
            + (f"{_span(seqs)} | {_span(toks)} | " if hit else "- | - | ")
            + f"{dtext} | {old}/{len(gs)} above | {whole['outcome']} ({st['sequences']}, p "
            f"{_fmt(whole['p'])}) | {proj if proj else '-'} | {below[0]} / {below[1]} |")
    missed = [g for g in summary["groups"] if g["decision"]["first_above"] is None]
    if missed:
        lines.append("")
        lines.append("runs never `above` within the budget (decision on all their sequences):")
        for g in missed:
            b = g["decision"]["at_budget"]
            lines.append(f"- {g['depth']} layers, output {g['output']}, seed {g['seed']}: "
                         f"{b['outcome']} at {b['sequences']} sequences, drift beyond noise "
                         f"{_fmt(b['drift'])}, p {_fmt(b['p'])}, detectable "
                         f"{_fmt(b['detectable'])}; needs: {b['needs']}")
    lines.append("")
    trials = result.get("null_trials", 0)
    lines.append(f"same-state pairs (the null: A vs A', B vs B'), {cfg['null_sequences']} "
                 f"sequences per trial, {trials} trial(s) per run (states alternate B, A), "
                 "binomial 95% intervals (Clopper-Pearson):")
    lines.append("| layers | trials | false above, sequential at tol 0.002 (nominal <= 1%) | "
                 f"false above at any of the first {cfg['null_sequences'] // (2 * len(cfg['sizes']))} "
                 f"looks (above only, each at 1%/{max(1, cfg['budget'] // (2 * len(cfg['sizes'])))}) "
                 "| false above, one look "
                 f"at {cfg['null_sequences']} sequences (looks=1, nominal 1%) | realistic "
                 "outcomes | drift_i or noise_i exactly 0 |")
    lines.append("|---|---|---|---|---|---|---|")
    total = {"n": 0, "r": 0, "a": 0, "f": 0}
    for depth in sorted(summary["null_by_depth"], key=int):
        rs = summary["null_by_depth"][depth]
        n = len(rs)
        r = sum(x["realistic"] == "above" for x in rs)
        a = sum(x["above_any_look"] for x in rs)
        f = sum(x["fixed_above"] for x in rs)
        outs: dict[str, int] = {}
        for x in rs:
            key = f"{x['realistic'] or 'undecided'}"
            outs[key] = outs.get(key, 0) + 1
        zeros = sum(x["zeros"] for x in rs)
        for k2, v in (("n", n), ("r", r), ("a", a), ("f", f)):
            total[k2] += v
        lines.append(f"| {depth} | {n} | {_rate(r, n)} | {_rate(a, n)} | {_rate(f, n)} | "
                     + ", ".join(f"{k} {v}" for k, v in sorted(outs.items()))
                     + f" | {zeros} of {2 * n * cfg['null_sequences']} |")
    n = total["n"]
    lines.append(f"| all | {n} | {_rate(total['r'], n)} | {_rate(total['a'], n)} | "
                 f"{_rate(total['f'], n)} | | |")
    if summary.get("resampled"):
        lines.append("")
        lines.append(f"bound coverage where the truth is known: {cfg['budget']}-sequence runs "
                     "drawn with replacement from each cell's sequences (the population; its "
                     "mean e_i the true effect), sequential, tolerance 0.9 x that mean:")
        lines.append("| layers/output | runs | tolerance | bounded (must be ~0) | above |")
        lines.append("|---|---|---|---|---|")
        for name, r in summary["resampled"].items():
            lines.append(f"| {name} | {r['runs']} | {r['tolerance']:.3g} | "
                         f"{_rate(r['bounded'], r['runs'])} | {r['above']} |")
    return "\n".join(lines)


def _span(values: list[int]) -> str:
    return f"{values[0]}" if values[0] == values[-1] else f"{values[0]}-{values[-1]}"


def _rate(k: int, n: int) -> str:
    if n == 0:
        return "-"
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} = {100 * k / n:.2g}% [{100 * lo:.2g}, {100 * hi:.2g}]%"


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3g}"


# ================================================================ main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="measure (GPU) and write the raw numbers")
    parser.add_argument("--analyze", type=Path, help="decide from a measured JSON (CPU)")
    parser.add_argument("--summary", type=Path, help="with --analyze: the decisions as JSON")
    parser.add_argument("--cpu", action="store_true", help="tiny model on the CPU (dry run)")
    parser.add_argument("--seconds", type=float, help="time after which no null trial starts")
    parser.add_argument("--seeds", type=int, help="how many seeds (0..N-1)")
    parser.add_argument("--depths", help="comma-separated layer counts (default 8,16,32,61)")
    parser.add_argument("--residual", choices=("mixed", "sublayer"),
                        help="mixed (default, drift_gpu.py's model) or sublayer")
    parser.add_argument("--noise", choices=("batched", "alone"),
                        help="batched (default: a random filler ahead of every replay) or "
                             "alone (each replay by itself, as the probe sends them)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resample", type=int, default=0,
                        help="with --analyze: runs drawn from each cell's pool (coverage)")
    args = parser.parse_args()
    if args.analyze:
        result = json.loads(args.analyze.read_text())
        summary = analyze(result, args.workers, resamples=args.resample)
        print(report(result, summary))
        if args.summary:
            args.summary.write_text(json.dumps(summary, indent=1) + "\n")
        return
    cfg = Config(**TINY) if args.cpu else Config()
    if args.seconds is not None:
        cfg.seconds = args.seconds
    if args.seeds is not None:
        cfg.seeds = tuple(range(args.seeds))
    if args.depths:
        cfg.depths = tuple(int(x) for x in args.depths.split(","))
    if args.residual:
        cfg.residual = args.residual
    if args.noise:
        cfg.noise = args.noise
    measure(cfg, args.json)


if __name__ == "__main__":
    main()
