import sys

from django.http import HttpResponse
from django.views.decorators.http import require_GET, require_POST


def text(body):
    return HttpResponse(body, content_type="text/plain")


@require_GET
def root(request):
    return text("framework contract root\n")


@require_GET
def python(request):
    return text(f"prefix={sys.prefix}\nexecutable={sys.executable}\n")


@require_GET
def cookies_set(request):
    resp = text("two cookies\n")
    resp.set_cookie("first", "1")
    resp.set_cookie("second", "2")
    return resp


@require_GET
def cookies_echo(request):
    body = ";".join(f"{k}={v}" for k, v in sorted(request.COOKIES.items()))
    return text(body + "\n")


@require_POST
def echo(request):
    return HttpResponse(request.body, content_type="application/octet-stream")


@require_GET
def all_bytes(request):
    return HttpResponse(bytes(range(256)), content_type="application/octet-stream")


@require_GET
def query(request):
    lines = [f"{k}={ascii(request.GET.getlist(k))}" for k in sorted(request.GET)]
    return text("\n".join(lines) + "\n")


@require_GET
def boom(request):
    raise RuntimeError("framework contract: SECRET-BOOM-TEXT")
