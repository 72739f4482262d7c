"""A from-scratch LLM server in the course's style, kept ONLY as the benchmark's baseline.

transformers ``generate`` on a fixed batch of up to 4 requests taken first-in first-out; the
batch runs to its end before the next one starts (no continuous batching, no paged KV
cache). It answers just what the benchmark sends: streaming ``POST /v1/completions``.

    python benchmarks/server-vs-vllm/naive_server.py --model DIR --port 8001
"""
from __future__ import annotations

import argparse
import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BATCH_SIZE = 4


class Job:
    def __init__(self, prompt: str, max_tokens: int) -> None:
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.tokens: "queue.Queue[int | None]" = queue.Queue()
        self.prompt_tokens = 0


class BatchStreamer:
    """Receives each decoding step's tokens for the whole batch from ``generate``."""

    def __init__(self, jobs: list[Job]) -> None:
        self.jobs = jobs
        self.prompt_seen = False
        self.sent = [0] * len(jobs)

    def put(self, value) -> None:
        if not self.prompt_seen:           # the first call carries the prompts
            self.prompt_seen = True
            return
        for i, token in enumerate(value.reshape(-1).tolist()):
            if self.sent[i] < self.jobs[i].max_tokens:
                self.sent[i] += 1
                self.jobs[i].tokens.put(token)

    def end(self) -> None:
        for job in self.jobs:
            job.tokens.put(None)


def worker(model, tokenizer, jobs: "queue.Queue[Job]") -> None:
    import torch
    while True:
        batch = [jobs.get()]
        while len(batch) < BATCH_SIZE:
            try:
                batch.append(jobs.get_nowait())
            except queue.Empty:
                break
        encoded = tokenizer([j.prompt for j in batch], return_tensors="pt", padding=True)
        for job, mask in zip(batch, encoded["attention_mask"]):
            job.prompt_tokens = int(mask.sum())
        longest = max(j.max_tokens for j in batch)
        with torch.inference_mode():
            model.generate(**encoded, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, streamer=BatchStreamer(batch),
                           pad_token_id=tokenizer.pad_token_id)


def make_handler(tokenizer, jobs: "queue.Queue[Job]", model_name: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200 if self.path in ("/ping", "/health") else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            job = Job(body["prompt"], int(body.get("max_tokens", 16)))
            jobs.put(job)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            produced = 0
            while (token := job.tokens.get()) is not None:
                produced += 1
                event = {"object": "text_completion", "model": model_name, "choices": [
                    {"index": 0, "text": tokenizer.decode([token]), "finish_reason":
                     "length" if produced == job.max_tokens else None}]}
                self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            usage = {"choices": [], "usage": {"prompt_tokens": job.prompt_tokens,
                                              "completion_tokens": produced}}
            self._chunk(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()
    jobs: "queue.Queue[Job]" = queue.Queue()
    threading.Thread(target=worker, args=(model, tokenizer, jobs), daemon=True).start()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(tokenizer, jobs,
                                                                         args.model))
    print(f"naive server on port {args.port} at {time.strftime('%X')}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
