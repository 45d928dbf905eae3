"""An index directory's versions: the writer's commits as small segments (writer, delta), a
chain of segments replayed as one change of its base (chain, placed_rows), and loading or
refreshing a version (load)."""
