"""The Redis client's reply parser (``spectrum_gateway.resp.Reader``) against a reference:
hiredis's ``Reader`` (the C parser redis-py uses when it is installed), on replies hypothesis
generates, fed whole and cut at every byte. Both must read the same values, or both refuse.

The client speaks RESP2 only (it never sends ``HELLO 3``), so RESP3's types are refused
here, where hiredis reads them: checked apart. One deliberate strictness too: a bulk string
whose announced length is not followed by CRLF is refused, where hiredis skips two bytes
whatever they are and reads on.
"""
from __future__ import annotations

import os

import hiredis
import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from gateway_harness import GATEWAY_DIR  # noqa: F401  (puts spectrum_gateway on sys.path)
from spectrum_gateway.resp import INCOMPLETE, ProtocolError, Reader, ReplyError

# 250 derandomized examples with the tests (a few seconds); SPECTRUM_HYPOTHESIS=explore
# searches 4,000 random ones (about a minute).
EXPLORE = os.environ.get("SPECTRUM_HYPOTHESIS") == "explore"
SETTINGS = settings(max_examples=4000 if EXPLORE else 250, derandomize=not EXPLORE,
                    deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# --- replies, as (kind, value) so a simple string, a bulk string and a null stay apart --------

_LINE = st.binary(max_size=24).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_SCALARS = st.one_of(
    st.tuples(st.just("+"), _LINE),                                   # simple string
    st.tuples(st.just("-"), _LINE),                                   # error (any bytes)
    st.tuples(st.just(":"), st.integers(-(1 << 63), (1 << 63) - 1)),  # 64-bit integer
    st.tuples(st.just("$"), st.binary(max_size=80)),                  # bulk, CRLF and NUL too
    st.tuples(st.just("$"), st.none()),                               # null bulk string
    st.tuples(st.just("*"), st.none()),                               # null array
)
REPLIES = st.recursive(_SCALARS, lambda inner: st.tuples(st.just("*"), st.lists(inner, max_size=5)),
                       max_leaves=24)


def to_wire(reply) -> bytes:
    """RESP2 bytes of a generated reply, written here from the protocol's description."""
    kind, value = reply
    if kind in "+-":
        return kind.encode() + value + b"\r\n"
    if kind == ":":
        return b":%d\r\n" % value
    if value is None:
        return kind.encode() + b"-1\r\n"
    if kind == "$":
        return b"$%d\r\n%s\r\n" % (len(value), value)
    return b"*%d\r\n" % len(value) + b"".join(map(to_wire, value))


def comparable(value):
    """Either parser's value in one shape: an error reply as ("error", its text)."""
    if isinstance(value, (ReplyError, hiredis.ReplyError)):
        return ("error", str(value))
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


# --- feeding both parsers ----------------------------------------------------------------------

def ours(pieces: list[bytes]) -> tuple[list, Exception | None]:
    """The replies ``Reader`` reads from ``pieces`` fed one after the other, and its refusal."""
    reader, out = Reader(), []
    try:
        for piece in pieces:
            reader.feed(piece)
            while (reply := reader.gets()) is not INCOMPLETE:
                out.append(comparable(reply))
    except ProtocolError as e:
        return out, e
    return out, None


def reference(pieces: list[bytes]) -> tuple[list, Exception | None]:
    reader, out = hiredis.Reader(), []
    try:
        for piece in pieces:
            reader.feed(piece)
            while (reply := reader.gets()) is not False:
                out.append(comparable(reply))
    except hiredis.ProtocolError as e:
        return out, e
    return out, None


def cuts(wire: bytes):
    """The wire whole, then cut in two at every byte."""
    yield [wire]
    for at in range(len(wire) + 1):
        yield [wire[:at], wire[at:]]


@SETTINGS
@given(st.lists(REPLIES, min_size=1, max_size=4))
@example([("*", [("$", b"he\r\nlo"), ("$", None), ("*", None), ("*", []), ("-", b"\xff")])])
def test_generated_replies_read_as_hiredis_reads_them_whole_and_cut_anywhere(replies):
    wire = b"".join(map(to_wire, replies))
    expected, refused = reference([wire])
    assert refused is None and len(expected) == len(replies)
    for pieces in cuts(wire):
        assert ours(pieces) == (expected, None), pieces
    one_byte_at_a_time = [wire[i:i + 1] for i in range(len(wire))]
    assert ours(one_byte_at_a_time) == (expected, None)


# --- damaged streams: what hiredis refuses, ours refuses; what ours reads, hiredis reads alike ---

RESP3_TYPES = b"_,#(=%~|>"


def _damaged(draw_wire: bytes, at: int, byte: int, how: str) -> bytes:
    at = at % (len(draw_wire) + 1)
    if how == "replace" and at < len(draw_wire):
        return draw_wire[:at] + bytes([byte]) + draw_wire[at + 1:]
    if how == "drop" and at < len(draw_wire):
        return draw_wire[:at] + draw_wire[at + 1:]
    return draw_wire[:at] + bytes([byte]) + draw_wire[at:]


def deliberate(error: Exception) -> bool:
    """Our refusals where hiredis reads on: a bulk string not ended by CRLF, a RESP3 type."""
    text = str(error)
    return "not followed by CRLF" in text or any(
        f"not a RESP2 reply: b'{chr(t)}" in text for t in RESP3_TYPES)


@SETTINGS
@given(st.lists(REPLIES, min_size=1, max_size=3), st.integers(0, 1 << 16),
       st.sampled_from(b"\r\n$*:+-_0123456789 x\x00"), st.sampled_from(["replace", "insert", "drop"]))
@example([(":", 12)], 1, ord("+"), "insert")         # +12: int() would take it
@example([(":", 10)], 2, ord("_"), "insert")         # 1_0
@example([(":", 7)], 1, ord("0"), "insert")          # 07
@example([("$", b"abc")], 1, ord("-"), "replace")    # $-: a negative length other than -1
@example([("+", b"OK")], 2, ord("\r"), "insert")     # a CR inside a status line
@example([("$", b"abc")], 7, ord("x"), "replace")    # a bulk string's trailer damaged
def test_damaged_streams_are_refused_where_hiredis_refuses_them(replies, at, byte, how):
    wire = _damaged(b"".join(map(to_wire, replies)), at, byte, how)
    expected, reference_refused = reference([wire])
    for pieces in cuts(wire):
        got, refused = ours(pieces)
        if reference_refused is not None:
            assert refused is not None, (wire, pieces, got)
            assert got == expected[:len(got)]
        elif refused is None:
            assert got == expected, (wire, pieces)
        else:                        # ours refused what hiredis read: only where we mean to
            assert deliberate(refused), (wire, refused, expected)
            assert got == expected[:len(got)]


@pytest.mark.parametrize("wire", [b"_\r\n", b",1.5\r\n", b"#t\r\n", b"(123\r\n", b"%1\r\n:1\r\n:2\r\n",
                                  b"~1\r\n:1\r\n", b">1\r\n:1\r\n", b"=5\r\ntxt:a\r\n",
                                  b"*2\r\n:1\r\n_\r\n"])
def test_resp3_types_are_refused_saying_so(wire):
    """hiredis reads them; this client never asks for RESP3, so one arriving means the peer is
    not speaking to it as it asked."""
    assert reference([wire])[1] is None
    got, refused = ours([wire])
    assert isinstance(refused, ProtocolError) and "not a RESP2 reply" in str(refused)


@pytest.mark.parametrize("wire, reason", [
    (b":9223372036854775808\r\n", "out of range"), (b":-9223372036854775809\r\n", "out of range"),
    (b":-0\r\n", "bad integer"), (b":\r\n", "bad integer"), (b"$-2\r\n", "bulk string length -2"),
    (b"*-2\r\n", "array length -2"), (b"*4294967296\r\n", "an array of 4294967296 items"),
    (b"$03\r\nabc\r\n", "bad bulk string length"), (b"-a\nb\r\n", "a CR or LF inside"),
    (b"?\r\n", "not a RESP2 reply: b'?"),
])
def test_refusals_name_what_was_wrong(wire, reason):
    assert reference([wire])[1] is not None
    got, refused = ours([wire])
    assert got == [] and reason in str(refused)


def test_the_64_bit_extremes_are_read():
    wire = b":9223372036854775807\r\n:-9223372036854775808\r\n:0\r\n"
    assert ours([wire]) == reference([wire]) == ([(1 << 63) - 1, -(1 << 63), 0], None)
