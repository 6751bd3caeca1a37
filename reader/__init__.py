"""reader: read minisgl's source with libcst (never importing it) and compute its call chains.

``reader.index`` indexes modules, classes and functions with line spans; ``reader.resolve`` (with
``reader.walker`` and ``reader.types``) resolves each call; ``reader.chains`` builds the bench chains;
``python -m reader chain latency|correctness|profile`` prints one.
"""
