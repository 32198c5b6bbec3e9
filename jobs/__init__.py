"""Entrypoints for ``ray job submit``: each parses arguments, joins the cluster, calls core + actors."""
