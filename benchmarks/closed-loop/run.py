"""Closed loops of fixed-size requests on a real vLLM (CPU), against the simulator's prediction.

AIConfigurator's held-out points are closed loops: AIPerf keeps C requests of fixed size in flight
(``--concurrency C --isl-stddev 0 --osl-stddev 0``, ``ignore_eos``). The simulator sends such a
loop's C requests together from an empty server, and as they all finish in the same step they
come back together: each wave's prompts share one prefill step. Whether a real server keeps that
lockstep, or its clients drift apart, sets the loop's TTFT by a factor of two or more.

This run measures it on this machine: a random-weight Llama large enough that a 512-token prefill
costs several decode steps (as a 1,024-token one does on a GPU), served by the bring-your-own
server, profiled by ``options.bench --profile capacity`` before and after, and driven by a client
of C threads that logs when each request was sent and answered (``closed_loop_client``), started
two ways: every thread's first request at the same moment (``together``, as AIPerf starts its
profiling phase once the warmup has drained), or each as soon as its connection is open
(``spread``, tens of milliseconds apart). Each is set beside ``cost.hardware.predict.closed_loop``
run from each profile, as the held-out harness runs AIConfigurator's points (every request
counted, from an empty server).

    PYTHONPATH=$PWD:$PWD/containers/byo-vllm .venv/bin/python benchmarks/closed-loop/run.py \\
        --out benchmarks/closed-loop/DATE
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "containers" / "byo-vllm")]

from cost.hardware.predict import closed_loop  # noqa: E402
from cost.simulate.capacity import load_capacity  # noqa: E402
from options.local_server import LocalServer  # noqa: E402
from options.tiny_model import cache_root, tiny_model_dir  # noqa: E402

# 768 wide, 8 layers (54 M parameters): on two cores a 512-token prefill takes ~120 ms and a
# decode step ~15 ms, the ratio a 1,024-token prefill has to a decode step on a GPU.
HIDDEN, LAYERS, KV_HEADS, HEAD_DIM = 768, 8, 2, 64
MAX_MODEL_LEN = 1024


def build_model(folder: Path) -> Path:
    """The tiny model's tokenizer on a wider, deeper random Llama (built once)."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    src = tiny_model_dir()
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(src / name, tmp / name)
    config = json.loads((src / "config.json").read_text())
    config.update(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HIDDEN // HEAD_DIM,
                  num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, intermediate_size=3 * HIDDEN)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tmp.rename(folder)
    return folder


def closed_loop_client(url: str, model: str, concurrency: int, requests: int, prompt_tokens: int,
                       output_tokens: int, together: bool) -> list[dict]:
    """C threads, each sending its next request when its last one is answered; prompts are fresh
    random token ids (no prefix-cache hits), answers exactly ``output_tokens`` long. ``together``:
    every thread sends its first request at the same moment (as AIPerf does once its warmup has
    drained); else each sends as soon as it has its connection, tens of milliseconds apart. Times
    in s from the loop's start."""
    records, lock, left = [], threading.Lock(), [requests]
    gate = threading.Barrier(concurrency if together else 1)
    t0 = time.perf_counter()

    def client(k: int) -> None:
        rng = random.Random(f"{time.time_ns()}-{k}")
        with httpx.Client(timeout=600) as http:
            http.get(url + "/ping")
            gate.wait()
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                body = {"model": model, "prompt": [rng.randrange(10, 500) for _ in range(prompt_tokens)],
                        "max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True,
                        "stream": True}
                sent, first = time.perf_counter(), None
                with http.stream("POST", url + "/v1/completions", json=body) as response:
                    response.raise_for_status()
                    for line in response.iter_lines():
                        if first is None and line.startswith("data: {") and '"text":""' not in line:
                            first = time.perf_counter()
                end = time.perf_counter()
                with lock:
                    records.append({"client": k, "sent_s": sent - t0, "first_s": first - t0, "end_s": end - t0})

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records


def summary(records: list[dict], output_tokens: int) -> dict:
    ttft = [1e3 * (r["first_s"] - r["sent_s"]) for r in records]
    e2e = [1e3 * (r["end_s"] - r["sent_s"]) for r in records]
    sends = sorted(r["sent_s"] for r in records)
    waves, current = [], 1
    for a, b in zip(sends, sends[1:]):             # sends within 30 ms of the one before: one wave
        if b - a < 0.030:
            current += 1
        else:
            waves.append(current)
            current = 1
    waves.append(current)
    return {"requests": len(records), "ttft_ms_mean": statistics.mean(ttft), "ttft_ms_p50": statistics.median(ttft),
            "tpot_ms_mean": statistics.mean((e - t) / (output_tokens - 1) for e, t in zip(e2e, ttft)),
            "e2e_ms_mean": statistics.mean(e2e), "mean_requests_sent_together": statistics.mean(waves)}


def predicted(profile: Path, concurrency: int, prompt_tokens: float, output_tokens: int) -> dict:
    s = closed_loop(load_capacity(profile), concurrency, round(prompt_tokens), output_tokens,
                    requests=20 * concurrency, steady_state=False)
    return {"ttft_ms_mean": s["ttft_ms"]["mean"], "tpot_ms_mean": s["tpot_ms"]["mean"], "e2e_ms_mean": s["e2e_ms"]["mean"]}


def profile(url: str, path: Path, prompt_tokens: int, output_tokens: int) -> Path:
    subprocess.run([sys.executable, "-m", "options.bench", "--url", url, "--profile", "capacity",
                    "--prompt-tokens", f"fixed:{prompt_tokens}", "--output-tokens", f"fixed:{output_tokens}",
                    "--json", str(path), "--no-progress"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the records")
    parser.add_argument("--concurrency", default="1,4,8,16")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    model = build_model(cache_root() / f"closed-loop-llama-{HIDDEN}x{LAYERS}")
    server = LocalServer({"HF_MODEL_ID": str(model), "SM_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
                          "SM_VLLM_ENFORCE_EAGER": ""}, log_path=Path(tempfile.gettempdir()) / "closed-loop-server.log")
    server.start()
    try:
        server.wait_ready()
        before = profile(server.url, args.out / "profile-before.json", args.prompt_tokens, args.output_tokens)
        runs = []
        for c in concurrencies:
            for start in ("together", "spread"):
                recs = closed_loop_client(server.url, str(model), c, 20 * c, args.prompt_tokens,
                                          args.output_tokens, together=start == "together")
                (args.out / f"{start}-c{c}.json").write_text(json.dumps(recs))
                runs.append({"start": start, "concurrency": c, "prompt_tokens": args.prompt_tokens,
                             "measured": summary(recs, args.output_tokens)})
        after = profile(server.url, args.out / "profile-after.json", args.prompt_tokens, args.output_tokens)
    finally:
        server.stop()
    for run in runs:
        run["predicted_from_profile_before"] = predicted(before, run["concurrency"], run["prompt_tokens"], args.output_tokens)
        run["predicted_from_profile_after"] = predicted(after, run["concurrency"], run["prompt_tokens"], args.output_tokens)
    (args.out / "results.json").write_text(json.dumps(runs, indent=2))
    print("| start | C | sent together | TTFT measured | predicted (before / after) | TPOT measured | predicted |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        m, b, a = r["measured"], r["predicted_from_profile_before"], r["predicted_from_profile_after"]
        print(f"| {r['start']} | {r['concurrency']} | {m['mean_requests_sent_together']:.1f} | "
              f"{m['ttft_ms_mean']:.0f} | {b['ttft_ms_mean']:.0f} / {a['ttft_ms_mean']:.0f} | "
              f"{m['tpot_ms_mean']:.1f} | {b['tpot_ms_mean']:.1f} / {a['tpot_ms_mean']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
