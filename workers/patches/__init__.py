"""Celery and kombu patches (listed in the next commit)."""
