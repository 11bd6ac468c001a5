"""File input: downloads, archives (one member-safety check for zip and tar), image decoding and discovery."""
