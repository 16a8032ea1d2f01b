"""The README's WSGI example: a small Flask app, served by

    target/release/m0serve --plugin wsgi --venv target/flask-venv \
        --app-dir examples/flask --workers 2 app:app

(`MODULE:CALLABLE`: the module `app` from --app-dir, its callable `app`).
Edit it and send the server SIGHUP: each worker is replaced in turn, and
requests in flight finish on the old code.
"""

import os

from flask import Flask, jsonify, request

app = Flask(__name__)


@app.get("/")
def index():
    return "Hello from Flask\n", {"Content-Type": "text/plain; charset=utf-8"}


@app.get("/hello/<name>")
def hello(name):
    return f"Hello, {name}, from worker {os.getpid()}\n", {"Content-Type": "text/plain; charset=utf-8"}


@app.post("/echo")
def echo():
    return jsonify(request.get_json())
