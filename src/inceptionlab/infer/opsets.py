"""The ONNX opsets the exporter writes, in a module that imports nothing: the CLI's `--opset` default
is this constant, read when `inceptionlab --help` runs, which must not load torch or ONNX (~2.5 s)."""

# torch 2.14's exporter (torch.export + onnxscript) emits opset 20 by default and can convert down
# to 18, its lowest; ONNX Runtime 1.31 and OpenVINO 2026 read both.
DEFAULT_OPSET = 20
MIN_OPSET = 18

# The ONNX Runtime release that first implements each opset (ONNX Runtime's version matrix: 1.14 ->
# opset 18, 1.15 -> 19, 1.17 -> 20), and for opset 20 the first Triton release whose ONNX Runtime backend
# has it: 24.04 (ONNX Runtime 1.17.3; "ONNX Runtime Versions" in Triton's docs/introduction/compatibility.md,
# which starts there). Older Triton releases ship older ONNX Runtimes: export them opset 18.
ONNX_RUNTIME_FOR_OPSET = {18: "1.14", 19: "1.15", 20: "1.17"}
TRITON_FOR_OPSET = {20: "24.04"}


def runtime_note(opset: int) -> str:
    """Which ONNX Runtime (and Triton) an export of `opset` needs, in one line."""
    ort = ONNX_RUNTIME_FOR_OPSET.get(opset)
    if ort is None:
        return f"opset {opset}: check that your ONNX Runtime implements it"
    triton = TRITON_FOR_OPSET.get(opset)
    where = (f"Triton {triton} or newer" if triton else
             "a Triton release whose notes list ONNX Runtime " + ort + " or newer")
    return f"opset {opset} needs ONNX Runtime {ort} or newer: {where}" + (
        f" (older Triton releases: export with --opset {min(ONNX_RUNTIME_FOR_OPSET)})" if triton else "")
