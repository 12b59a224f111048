"""Spark summaries of the nodes' spooled event logs. Not built yet (issue 7)."""
