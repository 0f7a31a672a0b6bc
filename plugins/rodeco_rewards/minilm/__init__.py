"""The embedded default reward: a frozen all-MiniLM-L6-v2 encoder with a small Bradley-Terry head."""
