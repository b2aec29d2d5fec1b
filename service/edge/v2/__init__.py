"""/v2: the Open Inference Protocol (KServe v2 / Triton REST) with the binary tensor data extension."""
