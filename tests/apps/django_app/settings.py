"""Minimal settings: no database, no apps, no middleware (POST /echo needs no CSRF)."""

DEBUG = False
SECRET_KEY = "m0serve-tests-only-not-secret"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "django_app.urls"
INSTALLED_APPS = []
MIDDLEWARE = []
DATABASES = {}
USE_TZ = True
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024

# With DEBUG off Django logs request errors nowhere by default: send them to
# stderr, that is the server log.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django.request": {"handlers": ["stderr"], "level": "ERROR"}},
}
