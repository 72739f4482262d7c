"""Does a replay's measurement repeat? A measurement script, not a test; its output is in
benchmarks/latency-model/repeatability-2026-12-04/.

One local server (the suite's plain server: tiny model, 1,024-token context, eager), one capacity
profile with the validation's trace mix, then the same ``--load 0.5`` replay five times, back to
back except for a 60 s idle gap before the fourth. Run from the repository root:
``python tests/bench/repeat_replays.py OUT_DIR`` (about 8 minutes), then
``python -m cost simulate --predict-replay OUT_DIR/replay-*.json --bench OUT_DIR/cap.json --json``
and that results folder's ``replay_sixths.py OUT_DIR/cap.json OUT_DIR/replay-*.json``."""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from bench_profiles import profile_with_trace_mix, replay_with_trace_mix   # noqa: E402
from shared_servers import plain_server_env                                # noqa: E402
from options.local_server import LocalServer                               # noqa: E402
from options.tiny_model import tiny_model_dir                              # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
server = LocalServer(plain_server_env(tiny_model_dir()), log_path=out / "server.log")
server.start()
try:
    server.wait_ready()
    profile_with_trace_mix(server.url, out / "cap.json")
    for i, idle_s in enumerate([0, 0, 0, 60, 0]):
        time.sleep(idle_s)
        replay_with_trace_mix(server.url, "0.5", out / "cap.json", out / f"replay-{i}.json")
        print(f"replay {i} (after {idle_s} s idle): {out / f'replay-{i}.json'}", flush=True)
finally:
    server.stop()
