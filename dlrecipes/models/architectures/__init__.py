"""The torch modules behind the built-in model factories (imports torch)."""
