"""The reference for tests/fuzz_http.rs: how h11, a strict HTTP/1.1 parser,
frames each request.

    python h11_frame.py < cases.jsonl > verdicts.jsonl

Each input line is {"head": HEX, "body": HEX}. Each output line is one of
  {"v": "need"}                         the head is incomplete
  {"v": "error"}                        h11 refuses the head
  {"v": "ok", "method", "target", "version", "framing", "body"}
where framing is "none", "length" or "chunked", and body (HEX) is what h11
decodes from the bytes after the head (present when it could decode the
whole body; "body_error": true when it refused them).
"""

import json
import sys

import h11


def frame(head, body):
    conn = h11.Connection(our_role=h11.SERVER, max_incomplete_event_size=1 << 20)
    conn.receive_data(head + body)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return {"v": "error"}
    if event is h11.NEED_DATA:
        return {"v": "need"}
    if not isinstance(event, h11.Request):
        return {"v": "error"}
    fields = {n.lower(): v for n, v in event.headers}
    if b"transfer-encoding" in fields:
        framing = "chunked"
    elif b"content-length" in fields and int(fields[b"content-length"]) > 0:
        framing = "length"
    else:
        # No body and a body of length 0 are the same framing.
        framing = "none"
    out = {
        "v": "ok",
        "method": event.method.decode("latin-1"),
        "target": event.target.decode("latin-1"),
        "version": event.http_version.decode("latin-1"),
        "framing": framing,
    }
    data = bytearray()
    try:
        while True:
            ev = conn.next_event()
            if isinstance(ev, h11.Data):
                data += ev.data
            elif isinstance(ev, h11.EndOfMessage):
                out["body"] = data.hex()
                break
            else:
                # NEED_DATA: the body is not all there (or never ends).
                break
    except h11.RemoteProtocolError:
        out["body_error"] = True
    return out


def main():
    for line in sys.stdin:
        case = json.loads(line)
        verdict = frame(bytes.fromhex(case["head"]), bytes.fromhex(case["body"]))
        sys.stdout.write(json.dumps(verdict) + "\n")


if __name__ == "__main__":
    main()
