"""The generated ctrlhub.v1 wire types and gRPC stubs (from proto/ctrlhub/v1 at build time).

Controllers rarely need these: the ctrlhub package wraps them. They are here for what it
does not wrap, e.g. ``from ctrlhub.v1 import controller_pb2``.
"""

__all__: list[str] = []  # the generated modules, imported by name (``from ctrlhub.v1 import controller_pb2``)
