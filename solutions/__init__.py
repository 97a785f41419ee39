"""Complete reference implementations of every exercise in the course."""
