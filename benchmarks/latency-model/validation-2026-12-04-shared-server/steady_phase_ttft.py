"""Each profile's steady phases simulated on that profile's own fitted model: mean, p50 and p99
TTFT predicted against what the phase measured. Run from the repository root:
``python benchmarks/latency-model/validation-2026-12-04-shared-server/steady_phase_ttft.py > OUT.json``.
It reads every ``capacity*.json`` under benchmarks/latency-model that kept its steady phases."""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path.cwd()))
from cost.simulate.capacity import CapacityModel   # noqa: E402
from cost.simulate.fleet import run_fleet           # noqa: E402
from cost.simulate.scaling import Fixed             # noqa: E402

rows = []
for path in sorted(Path("benchmarks/latency-model").rglob("capacity*.json")):
    doc = json.loads(path.read_text())
    phases = (doc.get("capacity_profile") or {}).get("steady_phases")
    if not phases or "capacity_model" not in doc:
        continue
    model = CapacityModel.from_json(doc["capacity_model"])
    for phase in phases:
        r = phase["requests"]
        sent = np.array([np.nan if x is None else x for x in r["sent_s"]], float)
        ttft = np.array([np.nan if x is None else x for x in r["ttft_s"]], float)
        sent_ok = ~np.isnan(sent)
        inputs, outputs = np.array(r["input_tokens"])[sent_ok], np.array(r["output_tokens"])[sent_ok]
        run = run_fleet(sent[sent_ok], inputs, outputs, model, Fixed(1), span_s=float(np.nanmax(sent)) + 1, seed=0)
        predicted = (run.first_token_s - sent[sent_ok]) * 1000
        measured = ttft[sent_ok] * 1000
        answered = ~np.isnan(measured)
        stats = {name: [round(float(f(measured[answered])), 1), round(float(f(predicted[answered])), 1)]
                 for name, f in (("mean", np.mean), ("p50", np.median), ("p99", lambda a: np.percentile(a, 99)))}
        rows.append({"profile": str(path.relative_to("benchmarks/latency-model")), "load": phase["load"],
                     "requests": int(answered.sum()),
                     "output_tok_s": round(float(outputs.sum() / (np.nanmax(sent) - np.nanmin(sent)))),
                     "ttft_ms_measured_predicted": stats,
                     "mean_ratio_measured_over_predicted": round(stats["mean"][0] / stats["mean"][1], 2)})
json.dump({"what": __doc__.split("\n\n")[0].replace("\n", " "), "rows": rows}, sys.stdout, indent=1)
print()
