"""Config-sync (TCP 8302): replicated, versioned configuration. Not built yet (issue 5)."""
