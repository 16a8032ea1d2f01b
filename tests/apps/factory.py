"""An application factory, as Flask apps are written: the spec
`factory:create_app('hi', punct='?')` calls it once with literal arguments."""


def create_app(greeting="hello", *, punct="!"):
    body = f"{greeting}{punct}\n".encode()

    def application(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"),
                                  ("Content-Length", str(len(body)))])
        return [body]

    return application


def broken_factory():
    raise RuntimeError("FACTORY-FAILED")
