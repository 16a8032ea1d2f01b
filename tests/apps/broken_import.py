"""An app module that fails at import: the worker must exit 1 with this traceback."""

raise RuntimeError("broken_import: BROKEN-AT-IMPORT")
