# GENERATED from solutions/__init__.py by `sampling-course make-exercises`.
# Fill in each `raise NotImplementedError()` below with your own code.
# stub-checksum: 18ba176b8ca1ae12947ca469f4377051df8593d9c724995dd5111b5c476a6b77
"""Complete reference implementations of every exercise in the course."""
