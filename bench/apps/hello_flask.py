"""The smallest Flask app: GET / -> "hello, world\\n", what bench/apps/hello_wsgi.py
answers, so the rss scenario can tell what Flask itself adds to a worker."""

from flask import Flask, Response

app = Flask(__name__)


@app.get("/")
def root():
    return Response("hello, world\n", mimetype="text/plain")
