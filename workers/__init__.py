"""The Celery binding of the fleet runtime: app, thin tasks, canvas, routing, signals."""
