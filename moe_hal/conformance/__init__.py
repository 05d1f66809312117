"""The conformance suite: runs the same cases on every backend against stored golden outputs."""
