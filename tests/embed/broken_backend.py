"""A pyembed backend that cannot be imported."""

raise ImportError("BROKEN-BACKEND-AT-IMPORT")
