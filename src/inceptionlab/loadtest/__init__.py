"""`inceptionlab loadtest`: a load generator for Open Inference Protocol servers (ours, Triton, KServe).

A client: it imports serve's protocol codec and nothing else of serve, and never torch.
"""
