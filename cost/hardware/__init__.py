"""The capacity of one replica from specs: model catalog, GPU table, vLLM memory arithmetic, roofline step times."""
