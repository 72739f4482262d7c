"""The capacity of one replica from specs: model catalog (catalog), GPU and instance table (gpus),
vLLM's memory arithmetic (memory), roofline step times (roofline) and the workloads run through
the simulator's replica (predict). Each turns published facts (a model's config.json, a GPU's
datasheet, vLLM's memory accounting) into the numbers a capacity estimate needs, so a replica can
be sized before anything is measured; a bench fit replaces the estimate once a server has been
measured.
"""
