"""Spectrum's public API gateway: one OpenAI-compatible front door for every rung.

The request path, one module per step: ``auth`` (API keys, JWTs) → tenant (``config``) →
``quota`` (rpm, tpm, concurrency, monthly budget; exact across workers through the ``store``)
→ ``routing`` (sticky weighted canary, tenant overrides, fallback) → ``upstream`` (the call,
streamed through as it arrives) → ``meter`` (ledger and Prometheus). ``app`` wires them into
HTTP routes; ``server`` starts uvicorn; ``admin`` manages keys and reads usage.
"""
