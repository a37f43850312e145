"""Trust boundaries: what comes from the operator (`trust`), secret redaction, safe YAML."""
