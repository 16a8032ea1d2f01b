from django.urls import path

from . import views

urlpatterns = [
    path("", views.root),
    path("python", views.python),
    path("cookies/set", views.cookies_set),
    path("cookies/echo", views.cookies_echo),
    path("echo", views.echo),
    path("bytes", views.all_bytes),
    path("query", views.query),
    path("boom", views.boom),
]
