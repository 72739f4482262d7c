"""Engine-shaped steps on a dedicated accelerator: does a GPU's step time hold still over minutes
(this project's CPU host moved 0.69-1.69 within one 47 s replay, repeatability-2026-12-04), and
does the capacity model's step form fit a transformer's steps there?

The capacity model (cost/simulate/capacity.py) says a step takes
``base + per_seq·seqs + per_kv_token·kv_tokens + per_prompt_token·prefill_tokens``. This times
such steps on a Llama-3-8B-shaped decoder (32 layers, hidden 4,096, 32 query and 8 KV heads of
128, MLP 14,336; random bf16 weights) in plain PyTorch: not vLLM, which the GPU machine lacks, so
no paged attention or CUDA graphs. Each step runs every layer over the step's tokens (decodes:
one token for each of ``seqs`` sequences; a prompt chunk: ``prefill_tokens``), attention over
each decoding sequence's ``kv`` cached tokens (a cache per layer) and causal attention within the
chunk; timed with CUDA events after warm-up.

Three parts: a grid of decode, prefill and mixed steps, fitted to the step form (least squares
on relative error, as the capacity fit weighs its points); then the same four steps timed in
rounds for ``--stability-s`` seconds, each round's median kept, which says how far the step
time moves between minutes. ``--small`` runs a small shape in float32 on the CPU, to check the
script. Writes JSON to ``--json``.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F

FULL = dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336)
SMALL = dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, mlp=512)


class Decoder:
    def __init__(self, shape: dict, device: str, dtype, max_seqs: int, max_kv: int):
        self.s, self.device, self.dtype = shape, device, dtype
        h, q, kv, m = shape["hidden"], shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"], shape["mlp"]
        g = torch.Generator(device=device).manual_seed(0)

        def w(a, b):
            return (torch.randn(a, b, generator=g, device=device, dtype=dtype) / math.sqrt(a))
        self.layers = [dict(wqkv=w(h, q + 2 * kv), wo=w(q, h), wgu=w(h, 2 * m), wd=w(m, h)) for _ in range(shape["layers"])]
        cache = (shape["layers"], max_seqs, shape["kv_heads"], max_kv, shape["head_dim"])
        self.k_cache = torch.randn(cache, generator=g, device=device, dtype=dtype)
        self.v_cache = torch.randn(cache, generator=g, device=device, dtype=dtype)

    def _attend(self, q, k, v, causal):
        groups = self.s["heads"] // self.s["kv_heads"]
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except TypeError:           # torch < 2.5: no enable_gqa
            return F.scaled_dot_product_attention(q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1),
                                                  is_causal=causal)

    @torch.inference_mode()
    def step(self, seqs: int, kv: int, prefill: int) -> None:
        s = self.s
        hd, nh, nkv = s["head_dim"], s["heads"], s["kv_heads"]
        tokens = seqs + prefill
        x = torch.ones(tokens, s["hidden"], device=self.device, dtype=self.dtype)
        for i, layer in enumerate(self.layers):
            qkv = x @ layer["wqkv"]
            q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
            out = []
            if seqs:            # each decoding sequence: one query against its kv cached tokens
                qd = q[:seqs].view(seqs, nh, 1, hd)
                out.append(self._attend(qd, self.k_cache[i, :seqs, :, :kv], self.v_cache[i, :seqs, :, :kv], False)
                           .reshape(seqs, nh * hd))
            if prefill:         # the prompt chunk: causal attention within it
                qp = q[seqs:].view(1, prefill, nh, hd).transpose(1, 2)
                kp = k[seqs:].view(1, prefill, nkv, hd).transpose(1, 2)
                vp = v[seqs:].view(1, prefill, nkv, hd).transpose(1, 2)
                out.append(self._attend(qp, kp, vp, True).transpose(1, 2).reshape(prefill, nh * hd))
            x = x + torch.cat(out) @ layer["wo"]
            gate, up = (x @ layer["wgu"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["wd"]

    def time_ms(self, seqs: int, kv: int, prefill: int, steps: int, warmup: int = 3) -> float:
        """Median milliseconds of ``steps`` identical steps."""
        for _ in range(warmup):
            self.step(seqs, kv, prefill)
        times = []
        for _ in range(steps):
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                self.step(seqs, kv, prefill)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                self.step(seqs, kv, prefill)
                times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)


def fit_step_form(rows: list[dict]) -> dict:
    """Least squares on relative error of ms = base + per_seq·seqs + per_kv·kv_tokens + per_prompt·prefill,
    where seqs counts decoding sequences plus one for a prompt chunk, as the capacity model counts them."""
    a = torch.tensor([[1.0, r["seqs"] + (1 if r["prefill"] else 0), r["seqs"] * r["kv"] + r["prefill"], r["prefill"]]
                      for r in rows], dtype=torch.float64)
    y = torch.tensor([r["ms"] for r in rows], dtype=torch.float64)
    # Non-negative, as the capacity fit is: a term whose coefficient comes out negative is dropped
    # and the rest refitted.
    keep = list(range(a.shape[1]))
    while True:
        sub = torch.linalg.lstsq(a[:, keep] / y[:, None], torch.ones_like(y)).solution
        if (sub >= 0).all():
            break
        keep.pop(int(torch.argmin(sub)))
    coef = torch.zeros(a.shape[1], dtype=torch.float64)
    coef[keep] = sub
    predicted = a @ coef
    rel = (predicted - y) / y
    for r, p, e in zip(rows, predicted.tolist(), rel.tolist()):
        r["fitted_ms"], r["relative_error"] = round(p, 3), round(e, 4)
    return {"base_ms": coef[0].item(), "per_seq_ms": coef[1].item(), "per_kv_token_us": coef[2].item() * 1e3,
            "per_prompt_token_us": coef[3].item() * 1e3,
            "relative_error": {"median_abs": statistics.median(abs(e) for e in rel.tolist()),
                               "max_abs": max(abs(e) for e in rel.tolist())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="a small float32 shape on the CPU, to check the script")
    parser.add_argument("--stability-s", type=float, default=150.0)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    device = "cpu" if args.small else "cuda"
    shape, dtype = (SMALL, torch.float32) if args.small else (FULL, torch.bfloat16)
    seqs_grid = (1, 8, 32, 64, 128, 256)
    kv_grid = (256, 1024, 2048)
    prefill_grid = (128, 512, 1024, 2048, 4096)
    mixed = [(s, 1024, p) for s in (32, 128) for p in (256, 1024, 2048)]
    began = time.time()
    model = Decoder(shape, device, dtype, max(seqs_grid), max(kv_grid))
    doc: dict = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
                 "shape": shape, "dtype": str(dtype), "grid": []}
    steps = 5 if args.small else 20
    configs = ([(s, kv, 0) for s in seqs_grid for kv in kv_grid] + [(0, 0, p) for p in prefill_grid] + mixed)
    for s, kv, p in configs:            # one pass first: kernel selection and allocator growth
        model.step(s, kv, p)
    for s in seqs_grid:
        for kv in kv_grid:
            doc["grid"].append({"seqs": s, "kv": kv, "prefill": 0, "ms": model.time_ms(s, kv, 0, steps)})
    for p in prefill_grid:
        doc["grid"].append({"seqs": 0, "kv": 0, "prefill": p, "ms": model.time_ms(0, 0, p, steps)})
    for s, kv, p in mixed:
        doc["grid"].append({"seqs": s, "kv": kv, "prefill": p, "ms": model.time_ms(s, kv, p, steps)})
    doc["fit"] = fit_step_form(doc["grid"])
    print(json.dumps(doc["fit"]), flush=True)
    for r in doc["grid"]:
        print(f"seqs {r['seqs']:4d} kv {r['kv']:5d} prefill {r['prefill']:5d}: {r['ms']:8.3f} ms, "
              f"fit {r['fitted_ms']:8.3f} ({r['relative_error']:+.1%})", flush=True)
    # Stability: the same steps in rounds, each round's median kept, for --stability-s seconds.
    probes = {"decode 64x1024": (64, 1024, 0), "decode 256x1024": (256, 1024, 0),
              "prefill 2048": (0, 0, 2048), "mixed 128x1024 + 1024": (128, 1024, 1024)}
    rounds: dict[str, list[tuple[float, float]]] = {k: [] for k in probes}
    start = time.time()
    while time.time() - start < args.stability_s:
        for name, (s, kv, p) in probes.items():
            rounds[name].append((round(time.time() - start, 2), model.time_ms(s, kv, p, 10, warmup=1)))
    doc["stability"] = {}
    for name, values in rounds.items():
        ms = [v for _, v in values]
        med = statistics.median(ms)
        doc["stability"][name] = {"rounds": len(ms), "median_ms": med, "min_ms": min(ms), "max_ms": max(ms),
                                  "max_over_min": max(ms) / min(ms), "round_ms": values}
        print(f"{name}: {len(ms)} rounds over {args.stability_s:.0f} s, median {med:.3f} ms, "
              f"min {min(ms):.3f}, max {max(ms):.3f} (max/min {max(ms) / min(ms):.3f})", flush=True)
    doc["seconds"] = round(time.time() - began, 1)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
