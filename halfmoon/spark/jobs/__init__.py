"""Batch jobs on Spark: the audit of a table against a topic, and traffic statistics."""
