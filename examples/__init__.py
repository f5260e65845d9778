"""Small, tested examples of extension points (see the README)."""
