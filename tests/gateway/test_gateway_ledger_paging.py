"""Reading a large ledger: the reply parser's cost grows with the bytes, not with their square,
and the Redis store pages the stream (``XRANGE key start end COUNT n``, each page after the
last id of the one before) so ``admin usage`` and ``cost bill`` read millions of entries.

The 1,000,000-entry timing is ``tests/gateway/ledger_read_bench.py`` (docs/gateway.md, "Tests");
here the reader's work is counted, not timed (a shared machine's noise made a timed ratio fail).
"""
from __future__ import annotations

import asyncio
import json
import sys

import pytest
import redis

from gateway_harness import Gateway, answers  # noqa: F401  (and spectrum_gateway on sys.path)
from ledger_read_bench import FIRST_MS, LEDGER_KEY, entry, fill, read_all, store_for
from spectrum_gateway import meter
from spectrum_gateway.resp import INCOMPLETE, Reader


def _ledger_reply(count: int) -> bytes:
    """An XRANGE reply of ``count`` entries, as Redis sends it."""
    rows = []
    for i in range(count):
        raw = meter.ledger_json(entry(i)).encode()
        stream_id = b"%d-%d" % (FIRST_MS + i // 2, i % 2)
        rows.append(b"*2\r\n$%d\r\n%s\r\n*2\r\n$1\r\ne\r\n$%d\r\n%s\r\n"
                    % (len(stream_id), stream_id, len(raw), raw))
    return b"*%d\r\n" % count + b"".join(rows)


def _line_searches(run):
    """``run()``'s result and how many times the RESP reader searched its buffer for a line end
    meanwhile: the parser's work, counted. Parsing again from a partial reply's start on every
    piece multiplies the searches by the pieces; parsing on from where it stopped keeps them
    near one a line."""
    searches = 0

    def profile(frame, event, arg):
        nonlocal searches
        if event == "c_call" and getattr(arg, "__name__", "") == "find" and isinstance(
                getattr(arg, "__self__", None), bytearray):
            searches += 1
    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return result, searches


def _parse(wire: bytes, chunk: int = 65536):
    """The reply read out of ``wire`` arriving ``chunk`` bytes at a time."""
    reader = Reader()
    for at in range(0, len(wire), chunk):
        reader.feed(wire[at:at + chunk])
        reply = reader.gets()
    return reply


def test_a_reply_arriving_in_pieces_costs_the_same_per_entry_whatever_its_size():
    """Parsing again from the start on every piece made 8,000 entries cost 0.48 s; 5 times
    the entries then cost 25 times the CPU, not 5."""
    per_entry = {}
    for count in (10_000, 50_000):
        reply, searches = _line_searches(lambda: _parse(_ledger_reply(count)))
        assert reply is not INCOMPLETE and len(reply) == count
        per_entry[count] = searches / count
    assert per_entry[50_000] < 1.2 * per_entry[10_000], per_entry
    assert per_entry[50_000] < 10        # ~7 lines an entry (its id, field, value and headers)


@pytest.fixture
def ledger_db(redis_server):
    """A database of its own in the session's redis-server, emptied after."""
    client = redis.Redis(port=redis_server.port, db=9)
    client.delete(LEDGER_KEY)
    yield redis_server.url.rsplit("/", 1)[0] + "/9", client
    client.delete(LEDGER_KEY)
    client.close()


def test_the_store_pages_the_ledger_in_order_bounded_and_once(tmp_path, ledger_db):
    url, client = ledger_db
    fill(client.connection_pool.connection_kwargs["port"], 50_000, db=9)
    # A settle retried after its reply was lost wrote entry 2,999 again, later: dropped.
    client.xadd(LEDGER_KEY, {"e": meter.ledger_json(entry(2_999))}, id=f"{FIRST_MS + 30_000}-5")

    async def pages(**kwargs):
        store = store_for(url, tmp_path)
        try:
            return [page async for page in store.ledger_pages(**kwargs)]
        finally:
            await store.close()
    got = asyncio.run(pages(page_entries=1_000))
    assert [len(p) for p in got[:3]] == [1_000] * 3 and len(got) == 50
    ids = [e["request_id"] for page in got for e in page]
    assert ids == [f"{i:016x}" for i in range(50_000)]            # every one, in order, once
    # Bounds by stream id: from a millisecond (included) to another (not included).
    since, until = FIRST_MS + 1_000, FIRST_MS + 2_000
    bounded = [e for page in asyncio.run(pages(since_ms=since, until_ms=until, page_entries=333))
               for e in page]
    assert [e["request_id"] for e in bounded] == [f"{i:016x}" for i in range(2_000, 4_000)]
    assert asyncio.run(pages(since_ms=until, until_ms=since)) == []


def test_reading_10k_and_50k_entries_costs_the_same_per_entry(tmp_path, ledger_db):
    """The whole read through the store, pages and replies: the reader's work per entry is the
    same at 50,000 entries as at 10,000 (counted: pieces arrive as the socket cuts them, so a few
    more or fewer searches either way)."""
    url, client = ledger_db
    port = client.connection_pool.connection_kwargs["port"]
    fill(port, 10_000, db=9)
    (small, _, _), small_searches = _line_searches(lambda: read_all(url, tmp_path))
    assert small == 10_000
    fill(port, 40_000, db=9, first=10_000)
    (large, _, _), large_searches = _line_searches(lambda: read_all(url, tmp_path))
    assert large == 50_000
    per_small, per_large = small_searches / 10_000, large_searches / 50_000
    assert per_large < 1.5 * per_small, (per_small, per_large)


def test_admin_usage_streams_the_paged_ledger(tmp_path, ledger_db):
    url, client = ledger_db
    fill(client.connection_pool.connection_kwargs["port"], 25_000, db=9)
    gw = Gateway(tmp_path, {"store": url, "tenants": {"tenant7": {}}, "models": {
        "m": {"upstreams": [{"name": "u", "url": "http://127.0.0.1:9"}]}}})
    out = json.loads(gw.admin("usage", "--json").stdout)
    assert [e["request_id"] for e in out["entries"]] == [f"{i:016x}" for i in range(25_000)]
    assert sum(row["requests"] for row in out["summary"]) == 25_000
    one = json.loads(gw.admin("usage", "--json", "--tenant", "tenant7").stdout)
    assert {e["tenant"] for e in one["entries"]} == {"tenant7"} and len(one["entries"]) == 500
    assert one["summary"] == [row for row in out["summary"] if row["tenant"] == "tenant7"]
