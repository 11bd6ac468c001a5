"""`inceptionlab loadtest`: a load generator for Open Inference Protocol servers (ours, Triton, KServe),
over HTTP or gRPC.

A client: it imports serve's protocol codec and message definitions and nothing else of serve, and
never torch.
"""
