"""`inceptionlab serve`: an Open Inference Protocol (KServe v2) HTTP server with dynamic batching."""
