"""The agent's retrieval with a real pooling server's embeddings: the bring-your-own server with
SM_VLLM_RUNNER=pooling (the suite's shared one, tests/conftest.py) answers POST /v1/embeddings
for the documents and the question, while the scripted rung answers the chain's generation calls
(the real engine's generation is test_agent.py's engine test)."""
from __future__ import annotations

import json
import urllib.request

import pytest
from test_agent import QUESTION, _cli


@pytest.mark.engine
def test_the_agent_retrieves_with_a_pooling_servers_embeddings(scripted_rung, docs, pooling_server):
    rung, url = scripted_rung
    server = pooling_server
    done = _cli("--level", "5", "--url", url, "--embeddings-url", server.url, "--instance", "ml.g5.xlarge",
                "--docs", str(docs), "--question", QUESTION, "--json", timeout=300)
    asked = urllib.request.Request(server.url + "/v1/embeddings", data=json.dumps({"input": [QUESTION]}).encode(),
                                   headers={"Content-Type": "application/json"})
    question_tokens = json.load(urllib.request.urlopen(asked, timeout=60))["usage"]["prompt_tokens"]
    assert done.returncode == 0, done.stdout + done.stderr
    trace = json.loads(done.stdout)
    assert [c["role"] for c in trace["calls"]] == ["plan", "embed", "summarise", "analyse"]
    embed = trace["calls"][1]
    assert embed["endpoint"] == f"{server.url}/v1/embeddings" and embed["output_tokens"] == 0
    assert embed["input_tokens"] == question_tokens > 0              # the server's own count
    assert embed["cost_usd"] == pytest.approx(1.408 * embed["e2e_ms"] / 1000 / 3600)
    retrieval = trace["retrieval"]
    assert retrieval["method"] == f"the rung's embeddings ({server.url}/v1/embeddings)" and retrieval["fallback"] is None
    assert retrieval["indexing"]["input_tokens"] > retrieval["passages"]
    # Random weights: which passage comes first is noise, but the passages summarise saw are the hits.
    assert retrieval["hits"] and all(f"[{h['passage']}]" in rung.prompts[1] for h in retrieval["hits"])
