"""`kq console`: a web console over the cluster, a separate process that talks to it only through the
client library (Starlette on uvicorn, Jinja2 templates, htmx for the live parts; console/app.py)."""
