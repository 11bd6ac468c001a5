"""The ONNX opsets the exporter writes, in a module that imports nothing: the CLI's `--opset` default
is this constant, read when `inceptionlab --help` runs, which must not load torch or ONNX (~2.5 s)."""

# torch 2.14's exporter (torch.export + onnxscript) emits opset 20 by default and can convert down
# to 18, its lowest; ONNX Runtime 1.31 and OpenVINO 2026 read both.
DEFAULT_OPSET = 20
MIN_OPSET = 18
