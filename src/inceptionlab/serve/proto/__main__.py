"""`python -m inceptionlab.serve.proto` (what `make proto` runs): rewrite inference.binpb from the .proto files."""

from inceptionlab.fileio import atomic_write_bytes
from inceptionlab.serve.proto import DESCRIPTOR_SET, descriptor_set_bytes, here

atomic_write_bytes(here() / DESCRIPTOR_SET, descriptor_set_bytes())
print(f"wrote {here() / DESCRIPTOR_SET}")
