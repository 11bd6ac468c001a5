"""Test-only helpers (not part of the library): imported by tests as `helpers.<module>`."""
