"""The index directory on disk: its manifest and the versions' files (directory), files
written durably (durable), safetensors IO, and the resumable parts of batch jobs (parts)."""
