"""Many models on one endpoint, through real HTTP: LoRA adapters on the real vLLM CPU engine
with the tiny model, started by ``serve`` once for the module, and SageMaker's multi-model
contract (``/models``) over them, with S3 served by moto.

The server runs with a cache of 6 adapters and 8 adapters in its model folder, so a mix of
all of them loads, evicts and reloads while it runs."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from byo_servers import MAX_MODEL_LEN, StartedServer, sse_events
from options.local_server import LocalServer, free_port
from test_byo_adapters_guards import write_peft_adapter

pytestmark = pytest.mark.engine

FOLDER_ADAPTERS = [f"a{i}" for i in range(1, 9)]
BROKEN = "zbroken"
CPU_SLOTS = 6
PROMPT = "The deployment spectrum"


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 as a local server the serving process reaches through AWS_ENDPOINT_URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    url = f"http://127.0.0.1:{port}"
    import boto3
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="adapters-bucket")
    yield url, client
    server.stop()


@pytest.fixture(scope="module")
def lora_server(tiny_model, tmp_path_factory, s3_endpoint):
    root = tmp_path_factory.mktemp("lora")
    model = root / "model"                  # the tiny model's files, plus adapters/<name>/
    model.mkdir()
    for item in tiny_model.iterdir():
        (model / item.name).symlink_to(item)
    for seed, name in enumerate(FOLDER_ADAPTERS, start=1):
        write_peft_adapter(model / "adapters" / name, seed)
    # Registered like the others; its files are found broken when it is first asked for.
    (write_peft_adapter(model / "adapters" / BROKEN, 9) / "adapter_config.json").unlink()
    extra = root / "extra"                  # a configured source for POST /models
    extra.mkdir()
    log = root / "server.log"
    server = LocalServer({
        "HF_MODEL_ID": str(model), "SM_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
        "SM_VLLM_ENFORCE_EAGER": "", "SM_VLLM_ENABLE_LORA": "true",
        "SM_VLLM_MAX_LORAS": "4", "SM_VLLM_MAX_CPU_LORAS": str(CPU_SLOTS),
        "SM_VLLM_MAX_LORA_RANK": "8",
        "SPECTRUM_SERVER_ADAPTER_SOURCES": f"{extra},s3://adapters-bucket/allowed",
        "AWS_ENDPOINT_URL": s3_endpoint[0], "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    }, log_path=log)
    server.start()
    try:
        server.wait_ready()
        started = StartedServer(server, [], log)
        started.model, started.extra = model, extra
        yield started
    finally:
        server.stop()


def complete(server, model: str | None, prompt: str = PROMPT, tokens: int = 16,
             route: str = "/v1/completions", **headers) -> requests.Response:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if model is not None:
        body["model"] = model
    return requests.post(server.url + route, json=body, headers=headers, timeout=120)


def text(server, model: str | None, **kw) -> str:
    r = complete(server, model, **kw)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def models(server, **params) -> requests.Response:
    return requests.get(server.url + "/models", params=params, timeout=30)


def load(server, name: str, url: str, **extra) -> requests.Response:
    return requests.post(server.url + "/models", json={"model_name": name, "url": url, **extra},
                         timeout=120)


def delete(server, name: str) -> requests.Response:
    return requests.delete(server.url + f"/models/{name}", timeout=120)


def adapter_metric(server, name: str, adapter: str) -> float:
    return server.metric(f'{name}{{adapter="{adapter}"')


def residency(server, adapter: str) -> str:
    samples = server.metrics()
    found = [w for w in ("gpu", "cpu", "registered")
             if samples.get(f'byo_adapter_resident{{adapter="{adapter}",where="{w}"}}') == 1]
    assert len(found) == 1, (adapter, found)
    return found[0]


# -- registered at start-up, loaded on first use ----------------------------------------------
def test_the_folder_adapters_are_registered_not_loaded(lora_server):
    r = models(lora_server)
    assert r.status_code == 200
    listed = r.json()["models"]
    assert [m["modelName"] for m in listed] == FOLDER_ADAPTERS + [BROKEN]
    assert listed[0]["modelUrl"] == str(lora_server.model / "adapters" / "a1")
    assert "nextPageToken" not in r.json()
    for name in FOLDER_ADAPTERS:
        assert residency(lora_server, name) == "registered"
        assert adapter_metric(lora_server, "byo_adapter_loads_total", name) == 0
    got = requests.get(lora_server.url + "/models/a1", timeout=10).json()
    assert got == {"modelName": "a1", "modelUrl": listed[0]["modelUrl"],
                   "residency": "registered", "pinned": False, "origin": "folder",
                   "requestsRunning": 0}
    ids = [m["id"] for m in requests.get(lora_server.url + "/v1/models", timeout=10).json()["data"]]
    assert ids == [str(lora_server.model), *FOLDER_ADAPTERS, BROKEN]


def test_each_route_selects_the_adapter_and_the_base_name_selects_the_base(lora_server):
    base = text(lora_server, None)
    assert text(lora_server, str(lora_server.model)) == base        # the base model's name
    a1 = complete(lora_server, "a1")
    assert a1.status_code == 200 and a1.json()["model"] == "a1"
    a1_text = a1.json()["choices"][0]["text"]
    assert a1_text != base, "the adapter did not change the output"
    assert text(lora_server, "a2") not in (base, a1_text)
    # /invocations: SageMaker's TargetModel header, in the TGI dialect.
    tgi = {"inputs": PROMPT, "parameters": {"max_new_tokens": 16, "ignore_eos": True}}
    r = requests.post(lora_server.url + "/invocations", json=tgi, timeout=60,
                      headers={"X-Amzn-SageMaker-Target-Model": "a1"})
    assert r.status_code == 200 and r.json()["generated_text"] == a1_text
    r = requests.post(lora_server.url + "/invocations", json=tgi, timeout=60)
    assert r.json()["generated_text"] == base
    # /models/<name>/invoke, any dialect (here OpenAI completion, streamed).
    r = requests.post(lora_server.url + "/models/a1/invoke", timeout=60, stream=True, json={
        "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "ignore_eos": True,
        "stream": True})
    events = sse_events(r)
    assert "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"]) == a1_text
    # OpenAI chat names the adapter in "model".
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True}
    with_a1 = requests.post(lora_server.url + "/v1/chat/completions", timeout=60,
                            json=chat | {"model": "a1"}).json()
    plain = requests.post(lora_server.url + "/v1/chat/completions", json=chat, timeout=60).json()
    assert with_a1["model"] == "a1"
    assert with_a1["choices"][0]["message"] != plain["choices"][0]["message"]
    assert residency(lora_server, "a1") == "gpu"
    assert adapter_metric(lora_server, "byo_adapter_loads_total", "a1") == 1
    assert adapter_metric(lora_server, "byo_adapter_hits_total", "a1") == 3   # after its load


def test_an_unknown_adapter_is_404_naming_what_is_loaded(lora_server):
    for r in (complete(lora_server, "nope"),
              complete(lora_server, None, route="/invocations",
                       **{"X-Amzn-SageMaker-Target-Model": "nope"}),
              requests.post(lora_server.url + "/models/nope/invoke", json={"inputs": "x"},
                            timeout=10),
              requests.get(lora_server.url + "/models/nope", timeout=10),
              delete(lora_server, "nope")):
        assert r.status_code == 404, r.text
        message = r.json()["error"]["message"]
        assert "'nope'" in message and "a1" in message and "loaded now:" in message


def test_64_concurrent_first_requests_cause_one_load(lora_server):
    name = "a8"
    assert residency(lora_server, name) == "registered"
    warm_ttft = _ttft(lora_server, "a1")
    with ThreadPoolExecutor(64) as pool:
        started = time.monotonic()
        answers = list(pool.map(lambda _: complete(lora_server, name, tokens=8), range(64)))
        burst_s = time.monotonic() - started
    assert [r.status_code for r in answers] == [200] * 64
    assert len({r.json()["choices"][0]["text"] for r in answers}) == 1
    assert adapter_metric(lora_server, "byo_adapter_loads_total", name) == 1
    load_s = adapter_metric(lora_server, "byo_adapter_load_seconds_sum", name)
    print(f"\ncold adapter: 64 concurrent first requests, 1 load of {load_s * 1000:.0f} ms, "
          f"burst answered in {burst_s:.2f} s; warm TTFT {warm_ttft * 1000:.0f} ms")


def test_a_cold_adapter_first_token_includes_its_load(lora_server):
    name = "a7"
    assert residency(lora_server, name) == "registered"
    cold = _ttft(lora_server, name)
    warm = _ttft(lora_server, name)
    print(f"\ncold-load TTFT {cold * 1000:.0f} ms, then warm {warm * 1000:.0f} ms")
    assert adapter_metric(lora_server, "byo_adapter_loads_total", name) == 1


def _ttft(server, model: str) -> float:
    started = time.monotonic()
    with requests.post(server.url + "/v1/completions", stream=True, timeout=60, json={
            "model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0,
            "stream": True}) as r:
        assert r.status_code == 200, r.text
        next(r.iter_lines())
        first = time.monotonic() - started
        for _ in r.iter_lines():
            pass
    return first


# -- correct under mixing ---------------------------------------------------------------------
def test_a_mix_of_8_adapters_and_the_base_equals_each_alone(lora_server):
    prompts = [f"{PROMPT} {i}" for i in range(3)]
    who = [None, *FOLDER_ADAPTERS]
    alone = {(m, p): text(lora_server, m, prompt=p, tokens=24) for m in who for p in prompts}
    for p in prompts:
        assert len({alone[(m, p)] for m in who}) == len(who), "adapters must differ"
    evictions = lora_server.metric("byo_adapter_evictions_total")
    jobs = [(m, p) for _ in range(2) for m in who for p in prompts]
    with ThreadPoolExecutor(len(jobs)) as pool:
        mixed = list(pool.map(lambda job: text(lora_server, job[0], prompt=job[1], tokens=24),
                              jobs))
    wrong = [(m, p) for (m, p), got in zip(jobs, mixed) if got != alone[(m, p)]]
    assert not wrong, f"{len(wrong)} of {len(jobs)} rows differ from their output alone: {wrong}"
    # 8 adapters over a cache of 6: the mix had to evict and reload.
    assert lora_server.metric("byo_adapter_evictions_total") > evictions
    # Every loaded adapter keeps an engine slot (engine.py says why).
    places = [residency(lora_server, n) for n in FOLDER_ADAPTERS]
    assert places.count("gpu") == CPU_SLOTS and places.count("cpu") == 0


# -- SageMaker's multi-model contract -------------------------------------------------------
def test_load_409_list_pages_get_delete_and_reload_new_files(lora_server):
    folder = write_peft_adapter(lora_server.extra / "b1", 101)
    r = load(lora_server, "b1", str(folder))
    assert r.status_code == 200, r.text
    assert r.json()["modelName"] == "b1"
    first = text(lora_server, "b1")
    assert load(lora_server, "b1", str(folder)).status_code == 409
    assert load(lora_server, "a1", str(folder)).status_code == 409
    assert load(lora_server, str(lora_server.model), str(folder)).status_code == 409
    # Pagination: pages of 3 until no token, every name exactly once.
    seen, token, pages = [], None, 0
    while True:
        page = models(lora_server, max_results=3,
                      **({"next_page_token": token} if token else {})).json()
        seen += [m["modelName"] for m in page["models"]]
        pages += 1
        token = page.get("nextPageToken")
        if not token:
            break
    assert sorted(seen) == sorted(FOLDER_ADAPTERS + [BROKEN, "b1"]) and pages == 4
    assert models(lora_server, max_results=0).status_code == 400
    assert models(lora_server, next_page_token="%%%").status_code == 400
    got = requests.get(lora_server.url + "/models/b1", timeout=10).json()
    assert got["modelUrl"] == str(folder) and got["origin"] == "api"
    # DELETE: later requests 404, the slot is freed.
    assert delete(lora_server, "b1").status_code == 200
    assert complete(lora_server, "b1").status_code == 404
    assert requests.get(lora_server.url + "/models/b1", timeout=10).status_code == 404
    assert 'byo_adapter_resident{adapter="b1"' not in requests.get(
        lora_server.url + "/metrics", timeout=10).text
    # The same name again, with other files at the same place: the new files answer.
    write_peft_adapter(folder, 202)
    reference = write_peft_adapter(lora_server.extra / "b1-reference", 202)
    assert load(lora_server, "b1", str(folder)).status_code == 200
    assert load(lora_server, "b1ref", str(reference)).status_code == 200
    second = text(lora_server, "b1")
    assert second != first and second == text(lora_server, "b1ref")
    for name in ("b1", "b1ref"):
        assert delete(lora_server, name).status_code == 200


def test_pinned_adapters_are_never_evicted_and_a_full_pinned_cache_is_507(lora_server):
    pinned = [f"p{i}" for i in range(CPU_SLOTS)]
    for i, name in enumerate(pinned):
        folder = write_peft_adapter(lora_server.extra / name, 300 + i)
        r = load(lora_server, name, str(folder), pinned=True)
        assert r.status_code == 200, r.text
    try:
        expected = {name: text(lora_server, name) for name in pinned}
        spare = write_peft_adapter(lora_server.extra / "spare", 399)
        r = load(lora_server, "spare", str(spare))
        assert r.status_code == 507, r.text
        assert "pinned" in r.json()["error"]["message"]
        assert complete(lora_server, "a3").status_code == 507    # a registered one: no room
        assert load(lora_server, "spare", str(spare)).status_code == 507   # not kept
        for name in pinned:
            assert residency(lora_server, name) in ("gpu", "cpu")
            assert adapter_metric(lora_server, "byo_adapter_evictions_total", name) == 0
            assert text(lora_server, name) == expected[name]
        assert load(lora_server, "x", str(spare), pinned="yes").status_code == 400
    finally:
        for name in pinned:
            assert delete(lora_server, name).status_code == 200
    assert text(lora_server, "a3")                              # room again


def test_an_adapter_from_s3(lora_server, s3_endpoint):
    _, s3 = s3_endpoint
    local = write_peft_adapter(lora_server.extra / "s1-local", 500)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        s3.upload_file(str(local / name), "adapters-bucket", f"allowed/s1/{name}")
    r = load(lora_server, "s1", "s3://adapters-bucket/allowed/s1")
    assert r.status_code == 200, r.text
    assert load(lora_server, "s1-local", str(local)).status_code == 200
    assert text(lora_server, "s1") == text(lora_server, "s1-local")
    r = load(lora_server, "s2", "s3://adapters-bucket/private/s1")
    assert r.status_code == 403 and "s3://adapters-bucket/allowed/" in r.text
    for name in ("s1", "s1-local"):
        assert delete(lora_server, name).status_code == 200


# -- the guards, over HTTP: nothing bad reaches the engine, nothing takes it down ------------
def test_refused_loads_name_the_problem_and_the_server_keeps_serving(lora_server, tmp_path):
    before = {n: text(lora_server, n) for n in (None, "a1")}
    outside = write_peft_adapter(tmp_path / "outside", 600)
    r = load(lora_server, "o", str(outside))
    assert r.status_code == 403 and str(lora_server.extra) in r.text and "/opt/ml/models" in r.text
    r = load(lora_server, "o", str(lora_server.extra) + "/../outside")
    assert r.status_code == 403 and "'..'" in r.text
    link = lora_server.extra / "link"
    link.symlink_to(outside)
    r = load(lora_server, "o", str(link))
    assert r.status_code == 403 and "symlink" in r.text
    pickled = write_peft_adapter(lora_server.extra / "pickled", 601)
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    r = load(lora_server, "o", str(pickled))
    assert r.status_code == 400 and "adapter_model.bin" in r.text and "pickle" in r.text
    big = write_peft_adapter(lora_server.extra / "rank16", 602, rank=16)
    r = load(lora_server, "o", str(big))
    assert r.status_code == 400 and "max_lora_rank 8" in r.text
    other = write_peft_adapter(lora_server.extra / "other", 603, base={
        "model.layers.0.self_attn.q_proj": (256, 256)})
    r = load(lora_server, "o", str(other))
    assert r.status_code == 400 and "another model" in r.text
    # Files that pass the checks but that vLLM itself refuses (DoRA): refused, not fatal.
    dora = write_peft_adapter(lora_server.extra / "dora", 604, config={
        "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "use_dora": True})
    r = load(lora_server, "o", str(dora))
    assert r.status_code == 400 and "engine refused" in r.text, r.text
    # A registered folder adapter whose files are broken: its requests get the 400.
    r = complete(lora_server, BROKEN)
    assert r.status_code == 400 and "adapter_config.json" in r.text
    assert residency(lora_server, BROKEN) == "registered"
    assert requests.get(lora_server.url + "/ping", timeout=2).status_code == 200
    assert {n: text(lora_server, n) for n in (None, "a1")} == before
    assert models(lora_server).json()["models"][0]["modelName"] == "a1"


def test_adapter_metrics(lora_server):
    text_ = requests.get(lora_server.url + "/metrics", timeout=10).text
    for family in ("byo_adapter_loads_total", "byo_adapter_evictions_total",
                   "byo_adapter_hits_total", "byo_adapter_load_seconds_bucket",
                   "byo_adapter_load_failures_total", "byo_adapter_resident"):
        assert family in text_, family
    assert lora_server.metric("byo_adapter_load_failures_total") >= 1
    assert adapter_metric(lora_server, "byo_adapter_load_seconds_count", "a1") >= 1
