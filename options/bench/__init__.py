"""The shared benchmark: one traffic profile, measured the same way on every rung.

``profile`` says what load to send, ``runner`` sends it to a target through
``options.contract``, ``metrics`` (pure) turns per-request timings into the summary, and
``report`` writes the ``spectrum.bench/1`` JSON that ``python -m cost breakeven --bench`` reads.
Run it as ``python -m options.bench``.
"""
