"""Flask side of the framework contract (tests/wsgi_frameworks.rs).

django_app/ serves the same routes with the same answers; the Rust test runs
one set of assertions against both.
"""

import sys

from flask import Flask, Response, request

app = Flask(__name__)
application = app


@app.get("/")
def root():
    return Response("framework contract root\n", mimetype="text/plain")


@app.get("/python")
def python():
    return Response(f"prefix={sys.prefix}\nexecutable={sys.executable}\n", mimetype="text/plain")


@app.get("/cookies/set")
def cookies_set():
    resp = Response("two cookies\n", mimetype="text/plain")
    resp.set_cookie("first", "1")
    resp.set_cookie("second", "2")
    return resp


@app.get("/cookies/echo")
def cookies_echo():
    body = ";".join(f"{k}={v}" for k, v in sorted(request.cookies.items()))
    return Response(body + "\n", mimetype="text/plain")


@app.post("/echo")
def echo():
    return Response(request.get_data(), mimetype="application/octet-stream")


@app.get("/bytes")
def all_bytes():
    return Response(bytes(range(256)), mimetype="application/octet-stream")


@app.get("/query")
def query():
    lines = [f"{k}={ascii(request.args.getlist(k))}" for k in sorted(request.args)]
    return Response("\n".join(lines) + "\n", mimetype="text/plain")


@app.get("/log")
def log():
    # Flask's default handler writes app.logger's records to wsgi.errors.
    mark = request.args.get("mark", "none")
    app.logger.warning("flask warning %s", mark)
    app.logger.error("flask error %s", mark)
    return Response("logged\n", mimetype="text/plain")


@app.get("/boom")
def boom():
    raise RuntimeError("framework contract: SECRET-BOOM-TEXT")
