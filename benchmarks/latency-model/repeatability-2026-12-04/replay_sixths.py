"""Each replay's E2E measured / predicted, sixth by sixth of its span: how far the server's speed
moves within one replay. Predicted on the profile at the replay's own speed (``at_replay_speed``),
so what is left is the speed moving within the replay and the model's error where it is.
Run from the repository root: ``python THIS_FILE PROFILE.json REPLAY.json... > OUT.json``."""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path.cwd()))
from cost.simulate.capacity import CapacityModel       # noqa: E402
from cost.simulate.cli import replay_speed, replay_trace  # noqa: E402
from cost.simulate.fleet import run_fleet               # noqa: E402
from cost.simulate.scaling import Fixed                 # noqa: E402

SIXTHS = 6
profile = CapacityModel.from_json(json.loads(Path(sys.argv[1]).read_text())["capacity_model"])
rows = []
for path in sys.argv[2:]:
    replay = json.loads(Path(path).read_text())["replay"]
    factor = replay_speed(replay, profile)["factor"]
    trace = replay_trace(replay["spec"])
    run = run_fleet(trace.arrival_s, trace.input_tokens, trace.output_tokens, profile.with_step_speed(factor),
                    Fixed(1), span_s=trace.span_s, seed=0)
    predicted = (run.finish_s - trace.arrival_s) * 1000
    arrival = np.array([r["arrival_s"] for r in replay["requests"]])
    assert np.allclose(arrival, trace.arrival_s, atol=1e-3), "the replay's requests are not in trace order"
    measured = np.array([np.nan if r["e2e_ms"] is None else r["e2e_ms"] for r in replay["requests"]])
    edges = np.linspace(0, arrival.max(), SIXTHS + 1)
    ratios = [round(float(np.nanmedian(measured[m]) / np.median(predicted[m])), 2)
              for m in ((arrival >= a) & (arrival <= b) for a, b in zip(edges[:-1], edges[1:]))]
    rows.append({"replay": path, "load": replay["spec"].get("load"), "speed_factor": factor,
                 "span_s": round(float(arrival.max()), 1), "e2e_p50_measured_over_predicted_by_sixth": ratios,
                 "whole_replay": round(float(np.nanmedian(measured) / np.median(predicted)), 2)})
json.dump({"what": __doc__.split("\n\n")[0].replace("\n", " "), "profile": sys.argv[1], "rows": rows},
          sys.stdout, indent=1)
print()
