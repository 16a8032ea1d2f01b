"""Django side of the framework contract (tests/wsgi_frameworks.rs); see flask_app.py."""
