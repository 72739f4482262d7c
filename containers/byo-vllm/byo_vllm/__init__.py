"""Spectrum's bring-your-own vLLM server (rung 5): SageMaker's hosting contract in front of one
vLLM engine. Start it with the ``serve`` script beside this package (the image's entrypoint).

Modules: ``config`` (environment → settings), ``engine_args`` (settings → vLLM's flags),
``engine`` (the AsyncLLM adapter), ``dialects`` (request/response shapes), ``routes`` (HTTP),
``metrics`` (Prometheus), ``app`` (backend selection + Flask app), ``server`` (gunicorn).
"""
