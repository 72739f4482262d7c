"""The knowledge agent: documents and retrieval, the plan, chained calls and their trace, the
failures that must not pass as success, the CLI, Bedrock through botocore, and one run on the
real local server."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from options.agent.actions import ACTIONS, DEFAULT_PLAN, parse_actions, read_plan
from options.agent.retrieval import PASSAGE_WORDS, HashedBagOfWords, Index, ServedEmbeddings, read_passages
from options.agent.run import AgentFailed, Model, run_agent
from options.core import BadInput

REPO = Path(__file__).resolve().parents[2]
QUESTION = "What does level 3 configure in the LMI container?"


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "options.agent", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _http_model(url):
    from options.contract import invoke_http
    return Model(lambda req: invoke_http(url, req, "openai-completions"), url, hourly_usd=1.408)


# --- documents and retrieval ------------------------------------------------------------------

def test_documents_become_passages_and_the_closest_comes_first(docs):
    passages = read_passages(docs)
    assert {p.source for p in passages} == {"lmi.md", "bedrock.txt"}      # notes.bin is not a document
    index = Index.build(passages)
    hits = index.search(QUESTION, k=3)
    assert hits[0][0].source == "lmi.md" and hits[0][1] > 0.2
    assert index.search("zebra quantum", k=3) == []                       # shares no word


def test_long_files_are_cut_near_the_passage_size(tmp_path):
    (tmp_path / "long.md").write_text("\n\n".join(" ".join(["word"] * 50) for _ in range(5)))
    sizes = [len(p.text.split()) for p in read_passages(tmp_path)]
    assert sizes == [100, 100, 50] and max(sizes) <= PASSAGE_WORDS


def test_the_local_embedding_is_stable_and_unit_length():
    emb = HashedBagOfWords(dims=64)
    a, b = emb.embed(["rolling batch size", "rolling batch size"]).vectors
    assert a == b and math.isclose(sum(x * x for x in a), 1.0)
    assert emb.name == "local hashed bag-of-words (64 dims)"


def test_no_documents_is_an_error_saying_what_to_do(tmp_path):
    with pytest.raises(BadInput, match="no documents indexed: .* Put the documents"):
        read_passages(tmp_path)
    with pytest.raises(BadInput, match="is not a folder"):
        read_passages(tmp_path / "missing")


# --- the rung's embeddings, or the fallback --------------------------------------------------------

def test_retrieval_uses_the_rungs_embeddings_route_and_traces_the_embed_call(scripted_rung, docs):
    from options.agent.run import open_index

    rung, url = scripted_rung
    rung.embeddings = "served"
    model = _http_model(url)
    model.embedder = ServedEmbeddings(url)
    index = open_index(read_passages(docs), model)
    assert index.fallback is None and index.embedder.name == f"the rung's embeddings ({url}/v1/embeddings)"
    assert rung.embedded == [[p.text for p in index.passages]]           # one batch: every passage
    trace = run_agent(QUESTION, index, model)
    # The course's four serial calls: plan → embed → summarise → analyse.
    assert [c.role for c in trace.calls] == ["plan", "embed", "summarise", "analyse"]
    assert rung.embedded[1] == [QUESTION]
    embed = trace.calls[1]
    assert embed.endpoint == f"{url}/v1/embeddings" and embed.ttft_ms is None
    # The rung's usage: it counts the words of what it embedded.
    assert (embed.input_tokens, embed.output_tokens) == (len(QUESTION.split()), 0)
    assert embed.cost_usd == pytest.approx(1.408 * embed.e2e_ms / 1000 / 3600)
    doc = trace.to_json()
    assert doc["retrieval"]["hits"][0]["passage"] == "lmi.md#0" and doc["retrieval"]["fallback"] is None
    indexing = doc["retrieval"]["indexing"]
    assert indexing["role"] == "index" and indexing["input_tokens"] == sum(len(p.text.split()) for p in index.passages)
    assert doc["totals"]["input_tokens"] == sum(c["input_tokens"] for c in doc["calls"])   # indexing is not a call


@pytest.mark.parametrize("answer, said", [("400", "HTTP 400: .*does not pool"), ("404", "HTTP 404")])
def test_a_rung_without_embeddings_falls_back_to_the_local_one_and_says_why(scripted_rung, docs, answer, said):
    from options.agent.run import open_index

    rung, url = scripted_rung
    rung.embeddings = answer
    model = _http_model(url)
    model.embedder = ServedEmbeddings(url)
    index = open_index(read_passages(docs), model)
    assert index.embedder.name.startswith("local hashed bag-of-words")
    assert re.match(f"{re.escape(url)}/v1/embeddings answered {said}", index.fallback)
    trace = run_agent(QUESTION, index, model)
    assert [c.role for c in trace.calls] == ["plan", "summarise", "analyse"]
    assert trace.to_json()["retrieval"]["fallback"] == index.fallback and rung.embedded == []


def test_cli_names_the_embeddings_it_used(scripted_rung, docs, tmp_path):
    rung, url = scripted_rung
    rung.embeddings = "400"
    done = _cli("--level", "5", "--url", url, "--docs", str(docs), "--question", QUESTION)
    out = " ".join(done.stdout.split())
    assert done.returncode == 0 and "with local hashed bag-of-words (512 dims) (" in out and "does not pool" in out
    rung.embeddings = "served"
    done = _cli("--level", "5", "--url", url, "--docs", str(docs), "--question", QUESTION, "--json")
    trace = json.loads(done.stdout)
    assert [c["role"] for c in trace["calls"]] == ["plan", "embed", "summarise", "analyse"]
    assert trace["retrieval"]["method"] == f"the rung's embeddings ({url}/v1/embeddings)"


# --- the plan ---------------------------------------------------------------------------------

def test_a_plan_is_read_in_order_with_aliases_once_each():
    assert read_plan("1. Search the docs. 2. Summarize. 3. analyze; then search again") == \
        ["retrieve", "summarise", "analyse"]
    assert read_plan("w0 w1 w2") == []
    assert parse_actions("retrieve, analyse") == ["retrieve", "analyse"]
    with pytest.raises(BadInput, match="unknown action 'browse'; choose from retrieve, summarise, analyse"):
        parse_actions("retrieve,browse")


# --- one task, end to end, on a scripted rung ------------------------------------------------------

def test_the_chain_passes_each_result_on_and_the_trace_adds_up(scripted_rung, docs):
    rung, url = scripted_rung
    trace = run_agent(QUESTION, Index.build(read_passages(docs)), _http_model(url))
    assert trace.plan == ["retrieve", "summarise", "analyse"] and trace.plan_source == "the model's plan"
    assert [c.role for c in trace.calls] == ["plan", "summarise", "analyse"]
    # summarise sees the retrieved passage; analyse sees summarise's answer, not the passages.
    assert "[lmi.md#0]" in rung.prompts[1] and "rolling batch size" in rung.prompts[1]
    assert rung.answer in rung.prompts[2] and "[lmi.md#0]" not in rung.prompts[2]
    assert trace.answer == rung.answer
    doc = trace.to_json(level=5, target="local")
    assert doc["schema"] == "spectrum.agent-trace/1"
    for call, prompt in zip(doc["calls"], rung.prompts):
        assert set(call) >= {"endpoint", "role", "input_tokens", "output_tokens", "ttft_ms", "e2e_ms", "cost_usd"}
        assert call["input_tokens"] == len(prompt.split()) and call["ttft_ms"] <= call["e2e_ms"]
        # Self-hosted: the call's instance time at $1.408/h.
        assert call["cost_usd"] == pytest.approx(1.408 * call["e2e_ms"] / 1000 / 3600)
    t = doc["totals"]
    assert t["calls"] == 3 and t["input_tokens"] == sum(c["input_tokens"] for c in doc["calls"])
    assert t["output_tokens"] == len(rung.plan.split()) + 2 * len(rung.answer.split())
    assert t["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in doc["calls"]))
    assert doc["retrieval"]["method"].startswith("local hashed bag-of-words")
    assert doc["retrieval"]["hits"][0]["passage"] == "lmi.md#0"


def test_a_plan_naming_no_action_runs_the_default_and_says_so(scripted_rung, docs):
    rung, url = scripted_rung
    rung.plan = "w0 w1 w2"
    trace = run_agent(QUESTION, Index.build(read_passages(docs)), _http_model(url))
    assert trace.plan == list(DEFAULT_PLAN) and "named no known action ('w0 w1 w2')" in trace.plan_source


def test_every_action_skipped_is_an_error_not_a_success(scripted_rung, docs):
    _, url = scripted_rung
    with pytest.raises(BadInput, match="every action was skipped .*retrieve: no passage shares a word"):
        run_agent("zebra quantum", Index.build(read_passages(docs)), _http_model(url),
                  actions=["retrieve", "analyse"])


def test_no_answer_is_an_error(scripted_rung, docs):
    rung, url = scripted_rung
    rung.answer = ""
    with pytest.raises(AgentFailed, match="returned no text, so the task has no answer"):
        run_agent(QUESTION, Index.build(read_passages(docs)), _http_model(url), actions=["retrieve", "analyse"])
    with pytest.raises(BadInput, match="ran no model action, so there is no answer"):
        run_agent(QUESTION, Index.build(read_passages(docs)), _http_model(url), actions=["retrieve"])


# --- the CLI ----------------------------------------------------------------------------------

def test_cli_prints_the_calls_and_writes_a_trace_the_cost_model_prices(scripted_rung, docs, tmp_path):
    _, url = scripted_rung
    trace_path = tmp_path / "trace.json"
    done = _cli("--level", "5", "--url", url, "--docs", str(docs), "--question", QUESTION,
                "--instance", "ml.g5.xlarge", "--trace", str(trace_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "retrieve → summarise → analyse" in done.stdout and "total" in done.stdout
    trace = json.loads(trace_path.read_text())
    assert [c["role"] for c in trace["calls"]] == ["plan", "summarise", "analyse"]
    priced = subprocess.run([sys.executable, "-m", "cost", "agent", "--trace", str(trace_path), "--model",
                             "qwen.qwen3-32b-v1:0", "--instance", "ml.g5.xlarge", "--capacity", "100", "--json"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert priced.returncode == 0, priced.stderr
    task = json.loads(priced.stdout)["task"]
    assert task["input_tokens"] == trace["totals"]["input_tokens"] and task["calls"] == 3


@pytest.mark.parametrize("args, message", [
    (["--level", "1", "--question", "q"], "level 1 (Bedrock) does not serve on this machine"),
    (["--level", "5", "--question", QUESTION, "--actions", "retrieve,browse"], "unknown action 'browse'"),
    (["--level", "9", "--question", "q"], "9"),
    (["--level", "3", "--target", "aws", "--question", "q"], "give --endpoint NAME"),
    (["--level", "5", "--question", "q", "--top-k", "0"], "--top-k 0 must be at least 1"),
])
def test_cli_bad_input_exits_2_naming_the_value(docs, args, message):
    done = _cli("--docs", str(docs), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in " ".join(done.stdout.split())


def test_cli_without_documents_exits_2_and_the_trace_says_why(tmp_path):
    trace_path = tmp_path / "trace.json"
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _cli("--level", "5", "--url", "http://127.0.0.1:9", "--docs", str(empty), "--question", "q",
                "--trace", str(trace_path))
    out = " ".join(done.stdout.split())
    assert done.returncode == 2 and "error: no documents indexed" in out and "Put the documents" in out
    trace = json.loads(trace_path.read_text())
    assert trace["error"]["kind"] == "bad input" and trace["error"]["message"].startswith("no documents indexed")
    assert trace["calls"] == [] and trace["totals"]["calls"] == 0


def test_a_task_that_fails_midway_writes_its_calls_and_the_error(scripted_rung, docs, tmp_path):
    rung, url = scripted_rung
    rung.fail_from = 2                      # the plan and summarise answer; analyse gets HTTP 500
    trace_path = tmp_path / "trace.json"
    done = _cli("--level", "5", "--url", url, "--docs", str(docs), "--question", QUESTION,
                "--instance", "ml.g5.xlarge", "--trace", str(trace_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "failed: " in done.stdout and "answered HTTP 500" in " ".join(done.stdout.split())
    trace = json.loads(trace_path.read_text())
    assert trace["error"]["kind"] == "failure" and "HTTP 500" in trace["error"]["message"]
    assert [c["role"] for c in trace["calls"]] == ["plan", "summarise"]
    assert [(s["action"], s["ran"]) for s in trace["steps"]] == [("retrieve", True), ("summarise", True),
                                                                 ("analyse", False)]
    assert trace["steps"][2]["why"].startswith("its call failed: ") and "HTTP 500" in trace["steps"][2]["why"]
    assert trace["totals"]["input_tokens"] == sum(len(p.split()) for p in rung.prompts)
    assert trace["totals"]["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in trace["calls"]))
    assert trace["answer"] == ""


# --- planning by tool calls ------------------------------------------------------------------------

class ToolRung:
    """A model reached in process: the planner's request carries the actions as tools; it
    answers with ``calls`` (or refuses tools with HTTP 400), every other call with text."""

    def __init__(self, calls=None, refuse=False):
        self.calls, self.refuse, self.sent = calls or [], refuse, []

    def __call__(self, req):
        from options.contract import InvokeError, Result, Usage
        self.sent.append(req)
        if req.tools is not None and self.refuse:
            raise InvokeError('http://x answered HTTP 400: "auto" tool choice requires '
                              "--enable-auto-tool-choice", kind="http_400", status=400)
        if req.tools is not None:
            return Result("", "tool_calls", Usage(5, 7), tool_calls=self.calls)
        plan = "retrieve, summarise" if req.prompt.rstrip().endswith("Plan:") else "An answer."
        return Result(plan, "stop", Usage(5, 3))


def test_a_target_that_calls_tools_plans_by_tool_calls(docs):
    rung = ToolRung([{"name": "retrieve", "arguments": "{}"}, {"name": "analyse", "arguments": "{}"},
                     {"name": "retrieve", "arguments": "{}"}, {"name": "launch", "arguments": "{}"}])
    model = Model(rung, "in-process", streams=False, tool_calls=True)
    trace = run_agent(QUESTION, Index.build(read_passages(docs)), model)
    planner = rung.sent[0]
    assert [t["function"]["name"] for t in planner.tools] == list(ACTIONS)
    assert planner.tool_choice == "required"
    # In the calls' order, once each, only the registry's actions.
    assert trace.plan == ["retrieve", "analyse"]
    assert trace.plan_source == "the model's plan (tool calls)"
    assert trace.to_json()["calls"][0]["tool_calls"][0]["name"] == "retrieve"


def test_a_target_that_refuses_tools_gets_a_text_plan_and_the_trace_says_why(docs):
    rung = ToolRung(refuse=True)
    model = Model(rung, "in-process", streams=False, tool_calls=True)
    trace = run_agent(QUESTION, Index.build(read_passages(docs)), model)
    assert trace.plan == ["retrieve", "summarise"]
    assert "the target refused tool calls" in trace.plan_source
    assert "--enable-auto-tool-choice" in trace.plan_source
    assert [c.role for c in trace.calls][:1] == ["plan"]       # the refused call is not counted


# --- the real local server ------------------------------------------------------------------------

@pytest.mark.engine
def test_the_agent_on_a_running_level_5_server(docs, tmp_path, plain_server):
    """The chain in level 5's own dialect (OpenAI completions on /invocations) against a server
    already running (the suite's shared one); the next test has the agent start its own."""
    trace_path = tmp_path / "trace.json"
    done = _cli("--level", "5", "--url", plain_server.url + "/invocations", "--docs", str(docs),
                "--question", QUESTION, "--max-tokens", "8", "--trace", str(trace_path), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    trace = json.loads(trace_path.read_text())
    # Random weights: the plan is noise, so the default plan runs, and says so.
    assert trace["plan"]["actions"] == list(DEFAULT_PLAN)
    roles = [c["role"] for c in trace["calls"]]
    assert roles == ["plan", "summarise", "analyse"]
    for c in trace["calls"]:
        assert c["endpoint"].endswith("/invocations (openai-completions)")
        assert c["input_tokens"] > 0 and 0 < c["output_tokens"] <= 24 and 0 < c["ttft_ms"] <= c["e2e_ms"]
    # Each step's prompt carries the previous result: analyse's is built on summarise's answer.
    assert trace["calls"][1]["input_tokens"] > trace["calls"][2]["input_tokens"] > 0
    # A running server may be anyone's instance: unpriced until the user names its type.
    assert trace["totals"]["cost_usd"] is None and "give --instance TYPE" in trace["cost_basis"]
    # The server's engine generates, so it serves no embeddings (its /v1/embeddings refuses), and the
    # trace says so.
    assert trace["retrieval"]["method"].startswith("local hashed bag-of-words")
    assert re.match(r"http://127\.0\.0\.1:\d+/v1/embeddings answered HTTP 4\d\d: ", trace["retrieval"]["fallback"])


@pytest.mark.engine
def test_the_agent_plans_by_real_tool_calls_on_the_local_server(docs, tmp_path, tiny_model):
    """OpenAI chat on the local server the agent starts itself (level 5 with no --url): the
    server starts with a tool-call parser, the planner gets its plan as tool calls that
    structured decoding keeps to the registry's actions."""
    trace_path = tmp_path / "trace.json"
    done = _cli("--level", "5", "--dialect", "openai-chat", "--docs", str(docs), "--question", QUESTION,
                "--max-tokens", "8", "--trace", str(trace_path), timeout=600)
    trace = json.loads(trace_path.read_text())
    # Random weights choose the actions: a plan of retrieve alone has no answer, and the agent
    # says so (exit 2) rather than answering nothing; any other plan runs.
    model_actions = [a for a in trace["plan"]["actions"] if ACTIONS[a].uses_model]
    assert done.returncode == (0 if model_actions else 2), done.stdout + done.stderr
    planner = trace["calls"][0]
    assert planner["role"] == "plan" and planner["endpoint"].endswith("(openai-chat)")
    names = [c["name"] for c in planner["tool_calls"]]
    assert names and set(names) <= set(ACTIONS), planner
    assert trace["plan"]["source"] == "the model's plan (tool calls)", trace["plan"]
    assert trace["plan"]["actions"] == list(dict.fromkeys(names))
    # The server runs here: it is no AWS bill.
    assert trace["totals"]["cost_usd"] is None and "no AWS bill" in trace["cost_basis"]
